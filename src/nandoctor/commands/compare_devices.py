"""`nandoctor compare-devices`: the device and precision comparison on its own."""

from __future__ import annotations

from enum import Enum
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
    TimeoutOption,
    diagnose_and_finish,
    load_inputs,
)

STAGES = ["anomaly", "device_compare"]


class Reference(str, Enum):
    cpu = "cpu"
    float64 = "float64"


def compare_overrides(steps: int | None, reference: str | None, timeout: float | None) -> dict:
    """Config overrides from the command's flags: the stages, and the `device_compare:` section."""
    section: dict = {"when_finite": True, "when_float32_cpu": True}
    if steps is not None:
        section["steps"] = steps
    if reference is not None:
        section["reference"] = reference
    overrides: dict = {"stages": list(STAGES), "device_compare": section}
    if timeout is not None:
        overrides["watch"] = {"timeout_s": timeout}
    return overrides


def register(app) -> None:
    @app.command(name="compare-devices")
    def compare_devices(
        script: ScriptArgument,
        script_args: ScriptArgs = None,
        json_path: JsonOption = None,
        report_path: ReportOption = None,
        steps: Annotated[
            int | None,
            typer.Option(
                "--steps",
                min=1,
                help="Steps compared op by op, ending at the first NaN/Inf (default 3).",
            ),
        ] = None,
        reference: Annotated[
            Reference | None,
            typer.Option(
                "--reference",
                help="Compare against the CPU at the same dtype, or float64 on the CPU "
                "(default: cpu with CUDA or MPS present, float64 without).",
            ),
        ] = None,
        timeout: TimeoutOption = None,
        profile: ProfileOption = "standard",
        config_path: ConfigOption = None,
        nproc_per_node: NprocOption = 1,
    ) -> None:
        """Run every op of SCRIPT again on a reference and report the first that differs.

        With CUDA or MPS the reference is the CPU at the same dtype: is it the hardware? Without,
        it is float64 on the CPU: is it the precision? With CUDA the same steps also run on the
        CPU and on the GPU and their losses are compared. Files the runs write go to a scratch
        folder, not yours.
        """
        overrides = compare_overrides(steps, reference.value if reference else None, timeout)
        target, config = load_inputs(
            script, script_args, profile, config_path, overrides, nproc_per_node
        )
        diagnose_and_finish(target, config, json_path, report_path)
