"""Commands beyond `run`, one module each with `register(app)`; none imports torch at import."""

from __future__ import annotations

import importlib

# Each module adds its command(s) to the typer app.
COMMAND_MODULES = ("sweep_lr", "compare_devices", "explain")


def register_commands(app) -> None:
    for name in COMMAND_MODULES:
        module = importlib.import_module(f"nandoctor.commands.{name}")
        module.register(app)
