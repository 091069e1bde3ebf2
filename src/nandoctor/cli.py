"""Command-line interface: parse -> orchestrate -> render -> exit code. Only here do errors
become exit codes; torch is never imported in this process (`--help` stays instant)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from nandoctor.errors import UsageError

EXIT_HEALTHY = 0
EXIT_NONFINITE = 1
EXIT_USAGE = 2
EXIT_SCRIPT_FAILED = 3
EXIT_INTERRUPTED = 130
_EXIT_BY_STATUS = {
    "healthy": EXIT_HEALTHY,
    "nonfinite": EXIT_NONFINITE,
    "script_error": EXIT_SCRIPT_FAILED,
    "timeout": EXIT_SCRIPT_FAILED,
}

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
    3 the script failed for another reason or timed out, 130 interrupted (Ctrl-C).
    """


ScriptArgument = Annotated[str, typer.Argument(help="The training script, run as `python SCRIPT`.")]
ScriptArgs = Annotated[
    list[str] | None,
    typer.Argument(
        help="Arguments for the script, after `--`: `nandoctor run train.py -- --lr 0.1`."
    ),
]
JsonOption = Annotated[
    Path | None, typer.Option("--json", help="Write the JSON report (schema_version 1) here.")
]
ProfileOption = Annotated[
    str, typer.Option("--profile", help="quick | standard | thorough (stages and budgets).")
]
ConfigOption = Annotated[
    Path | None, typer.Option("--config", help="YAML file on top of the profile.")
]
MaxStepsOption = Annotated[
    int | None, typer.Option("--max-steps", min=1, help="Optimizer steps to watch before stopping.")
]
TimeoutOption = Annotated[
    float | None, typer.Option("--timeout", min=1, help="Wall-clock limit of one run, seconds.")
]


def _overrides(max_steps: int | None, timeout: float | None, stages: str | None) -> dict:
    overrides: dict = {}
    watch = {}
    if max_steps is not None:
        watch["max_steps"] = max_steps
    if timeout is not None:
        watch["timeout_s"] = timeout
    if watch:
        overrides["watch"] = watch
    if stages:
        overrides["stages"] = [s.strip() for s in stages.split(",") if s.strip()]
    return overrides


def _fail_usage(error: Exception) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {error}", highlight=False)
    raise typer.Exit(EXIT_USAGE)


class _Progress:
    """A one-line status on stderr while child runs go on: stage, step, loss."""

    def __init__(self, console: Console) -> None:
        self._status = console.status("starting…")
        self._stage = ""

    def __enter__(self):
        self._status.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._status.__exit__(*exc)

    def stage(self, text: str) -> None:
        self._stage = text
        self._status.update(text)

    def event(self, event: dict) -> None:
        if event.get("event") == "step":
            loss = event.get("loss")
            loss_text = f", loss {loss:.4g}" if isinstance(loss, float) else ""
            self._status.update(f"{self._stage} step {event['step'] + 1}{loss_text}")


@app.command(name="run")
def run_command(
    script: ScriptArgument,
    script_args: ScriptArgs = None,
    json_path: JsonOption = None,
    profile: ProfileOption = "standard",
    config_path: ConfigOption = None,
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
    from nandoctor.config import load_config
    from nandoctor.diagnose import diagnose
    from nandoctor.report.console import render_report
    from nandoctor.report.json_report import write_json
    from nandoctor.target import load_target

    try:
        target = load_target(script, script_args or [])
        config = load_config(profile, str(config_path) if config_path else None,
                             _overrides(max_steps, timeout, stages))  # fmt: skip
    except UsageError as error:
        _fail_usage(error)
    err = Console(stderr=True)
    with _Progress(err) as progress:
        report = diagnose(target, config, progress=progress.stage, on_event=progress.event,
                          show_output=show_output, keep_workdir=keep_workdir)  # fmt: skip
    render_report(report, Console())
    if json_path is not None:
        write_json(report, json_path)
        err.print(f"report written to {json_path}", style="dim", highlight=False)
    if report.run.get("ended") == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)
    raise typer.Exit(_EXIT_BY_STATUS[report.status])


def main() -> None:
    app()
