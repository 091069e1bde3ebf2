"""Pieces every command of the CLI shares: exit codes, option types, progress, finishing."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

EXIT_HEALTHY = 0
EXIT_NONFINITE = 1
EXIT_USAGE = 2
EXIT_SCRIPT_FAILED = 3
EXIT_INCONCLUSIVE = 4
# Interrupted: 128 + the signal's number (130 Ctrl-C, 143 SIGTERM, 129 SIGHUP), from interrupts.
EXIT_BY_STATUS = {
    "healthy": EXIT_HEALTHY,
    "nonfinite": EXIT_NONFINITE,
    "inconclusive": EXIT_INCONCLUSIVE,
    "script_error": EXIT_SCRIPT_FAILED,
    "timeout": EXIT_SCRIPT_FAILED,
}

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
    int | None,
    typer.Option(
        "--max-steps",
        min=1,
        help="Stop the script after this many optimizer steps "
        "(default: watch the whole run); a finite run stopped early is inconclusive, "
        "exit code 4.",
    ),
]
TimeoutOption = Annotated[
    float | None,
    typer.Option("--timeout", min=1, help="Wall-clock limit of one run, seconds (default: none)."),
]

NprocOption = Annotated[
    int,
    typer.Option(
        "--nproc-per-node",
        min=1,
        help="Launch the script as `torchrun --standalone --nproc-per-node N` and watch every "
        "rank (DDP and the like).",
    ),
]


def config_overrides(max_steps: int | None, timeout: float | None, stages: str | None) -> dict:
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


def fail_usage(error: Exception) -> None:
    Console(stderr=True).print(f"[red]error:[/red] {error}", highlight=False)
    raise typer.Exit(EXIT_USAGE)


class Progress:
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


ReportOption = Annotated[
    Path | None,
    typer.Option(
        "--report", help="Also write a shareable report: PATH.md (Markdown) or PATH.html."
    ),
]


def write_shareable(report, path: Path) -> None:
    from nandoctor.report.html import render_html
    from nandoctor.report.markdown import render_markdown

    suffix = path.suffix.lower()
    if suffix in (".html", ".htm"):
        path.write_text(render_html(report), encoding="utf-8")
    else:
        path.write_text(render_markdown(report), encoding="utf-8")


def finish(report, json_path: Path | None, report_path: Path | None = None) -> None:
    """Write the JSON (and Markdown/HTML), print the report, exit with the status's code.

    The files come first: after SIGHUP the terminal may be gone, and the JSON must not be."""
    from nandoctor import interrupts
    from nandoctor.report.console import render_report
    from nandoctor.report.json_report import write_json

    written = []
    for path, write in ((json_path, write_json), (report_path, write_shareable)):
        if path is not None:
            write(report, path)
            written.append(path)
    try:
        render_report(report, Console())
        err = Console(stderr=True)
        for path in written:
            err.print(f"report written to {path}", style="dim", highlight=False)
        sys.stdout.flush()
    except (OSError, SystemExit):  # a closed terminal or pipe: the files are what is left
        # (rich meets a broken pipe with SystemExit(1), which would replace the status's code)
        _silence_closed_streams()
    if report.run.get("ended") == "interrupted":
        raise typer.Exit(interrupts.exit_code())
    raise typer.Exit(EXIT_BY_STATUS[report.status])


def _silence_closed_streams() -> None:
    """Point stdout and stderr at the null device, so the exit code stays the status's:
    otherwise the interpreter's final flush fails again and exits 1."""
    null = open(os.devnull, "w")  # noqa: SIM115 - kept open until the process exits
    sys.stdout = sys.stderr = null


def diagnose_and_finish(
    target, config, json_path: Path | None, report_path: Path | None = None, **options
) -> None:
    """Run the stages of `config` on `target` with a progress line, then `finish`."""
    from nandoctor.diagnose import diagnose

    with Progress(Console(stderr=True)) as progress:
        report = diagnose(
            target, config, progress=progress.stage, on_event=progress.event, **options
        )
    finish(report, json_path, report_path)


def load_inputs(
    script: str,
    script_args: list[str] | None,
    profile: str,
    config_path,
    overrides,
    nproc_per_node: int = 1,
):
    """The target and config, or a one-line usage error and exit code 2."""
    from nandoctor.config import load_config
    from nandoctor.errors import UsageError
    from nandoctor.target import load_target

    try:
        target = load_target(script, script_args or [], nproc_per_node)
        config = load_config(profile, str(config_path) if config_path else None, overrides)
    except UsageError as error:
        fail_usage(error)
    return target, config
