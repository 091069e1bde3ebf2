"""The report: its data model and its renderers (console, JSON)."""
