"""`nandoctor sweep-lr`: the learning-rate halving sweep on its own."""

from __future__ import annotations

from typing import Annotated

import typer

from nandoctor.cli_common import (
    ConfigOption,
    JsonOption,
    NprocOption,
    ProfileOption,
    ReportOption,
    ScriptArgs,
    ScriptArgument,
    diagnose_and_finish,
    load_inputs,
)

STAGES = ["anomaly", "lr_sweep"]


def sweep_overrides(
    steps: int | None, halvings: int | None, jobs: int | None, timeout: float | None
) -> dict:
    """Config overrides from the command's flags: the stages, and the `lr_sweep:` section."""
    sweep: dict = {"when_finite": True}
    watch: dict = {}
    if steps is not None:
        # The watched run looks as far as the candidates may: a failure it cannot see is one
        # the sweep cannot be measured against.
        sweep["max_steps"] = watch["max_steps"] = steps
    if halvings is not None:
        sweep["halvings"] = halvings
    if jobs is not None:
        sweep["jobs"] = jobs
    if timeout is not None:
        sweep["run_timeout_s"] = watch["timeout_s"] = timeout
    overrides: dict = {"stages": list(STAGES), "lr_sweep": sweep}
    if watch:
        overrides["watch"] = watch
    return overrides


def register(app) -> None:
    @app.command(name="sweep-lr")
    def sweep_lr(
        script: ScriptArgument,
        script_args: ScriptArgs = None,
        json_path: JsonOption = None,
        report_path: ReportOption = None,
        steps: Annotated[
            int | None,
            typer.Option("--steps", min=1, help="Longest horizon of a run, in optimizer steps."),
        ] = None,
        halvings: Annotated[
            int | None,
            typer.Option("--halvings", min=1, help="Halve at most this many times (default 10)."),
        ] = None,
        jobs: Annotated[
            int | None,
            typer.Option(
                "--jobs", min=1, help="Runs at once (default: one per core or accelerator)."
            ),
        ] = None,
        timeout: Annotated[
            float | None,
            typer.Option("--timeout", min=1, help="Wall-clock limit of each run, seconds."),
        ] = None,
        profile: ProfileOption = "standard",
        config_path: ConfigOption = None,
        nproc_per_node: NprocOption = 1,
    ) -> None:
        """Re-run SCRIPT with its learning rate ×1/2, ×1/4, ... and recommend a stable one.

        Schedulers, warmup and per-group ratios are kept: every param group's learning rate is
        multiplied at each step. Files the runs write go to a scratch folder, not yours.
        """
        overrides = sweep_overrides(steps, halvings, jobs, timeout)
        target, config = load_inputs(
            script, script_args, profile, config_path, overrides, nproc_per_node
        )
        diagnose_and_finish(target, config, json_path, report_path)
