"""`nandoctor compare-devices` (being built)."""

from __future__ import annotations


def register(app) -> None:
    """Adds nothing until the command exists."""
