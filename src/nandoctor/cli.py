"""Command-line interface: parse -> orchestrate -> render -> exit code. Only here do errors
become exit codes; torch is never imported in this process (`--help` stays instant)."""

from __future__ import annotations

from typing import Annotated

import typer

from nandoctor.cli_common import (
    ConfigOption,
    JsonOption,
    MaxStepsOption,
    NprocOption,
    ProfileOption,
    ReportOption,
    ScriptArgs,
    ScriptArgument,
    TimeoutOption,
    config_overrides,
    diagnose_and_finish,
    load_inputs,
)
from nandoctor.commands import register_commands

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode="rich",
    help="Find why a PyTorch training run goes NaN/Inf. Point it at your unmodified script.",
)


@app.callback()
def _root() -> None:
    """Find why a PyTorch training run goes NaN/Inf: `nandoctor run train.py [-- script args]`.

    Exit codes: 0 healthy, 1 NaN/Inf found, 2 bad usage or unreadable input,
    3 the script failed for another reason or timed out, 4 inconclusive (a budget stopped
    the script before it ended, nothing non-finite seen), 130 interrupted (Ctrl-C),
    143 terminated (SIGTERM), 129 hung up (SIGHUP).
    """


@app.command(name="run")
def run_command(
    script: ScriptArgument,
    script_args: ScriptArgs = None,
    json_path: JsonOption = None,
    report_path: ReportOption = None,
    profile: ProfileOption = "standard",
    config_path: ConfigOption = None,
    nproc_per_node: NprocOption = 1,
    max_steps: MaxStepsOption = None,
    timeout: TimeoutOption = None,
    stages: Annotated[
        str | None,
        typer.Option("--stages", help="Comma-separated stages to run, e.g. anomaly,lr_sweep."),
    ] = None,
    show_output: Annotated[
        bool, typer.Option("--show-output", help="Show the script's own output as it runs.")
    ] = False,
    keep_workdir: Annotated[
        bool,
        typer.Option(
            "--keep-workdir", help="Keep the scratch folder (events, logs) for debugging."
        ),
    ] = False,
) -> None:
    """Run the whole checklist on SCRIPT and print a ranked root-cause report."""
    overrides = config_overrides(max_steps, timeout, stages)
    target, config = load_inputs(
        script, script_args, profile, config_path, overrides, nproc_per_node
    )
    diagnose_and_finish(target, config, json_path, report_path, show_output=show_output,
                        keep_workdir=keep_workdir)  # fmt: skip


register_commands(app)


def main() -> None:
    from nandoctor import interrupts

    interrupts.install()
    app()
