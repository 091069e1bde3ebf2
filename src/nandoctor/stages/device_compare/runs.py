"""The child runs of the device comparison and what they report, as plain values: the shadowed
run (each op again on the reference) and, with CUDA, the same steps on the CPU and on the GPU."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nandoctor.child.options import ChildOptions
from nandoctor.rewind import Start, start_for
from nandoctor.runner import RunOutcome, child_environment, rerun_options, run_child
from nandoctor.stages import StageContext

NAME = "device_compare"
# A run on each device from step 0: the comparison is of the whole runs.
_WHOLE_RUN = Start(None, "from step 0: the CPU and the accelerator each run the script from its "
                         "start")  # fmt: skip


def failure_step(context: StageContext) -> int | None:
    """The step where the watched run's first NaN/Inf was born (or seen), if it had one."""
    anomaly = context.earlier.get("anomaly")
    first = anomaly.first_nonfinite if anomaly else None
    if first is not None:
        return first.step
    event = context.watch.nonfinite
    return event["step"] if event else None


def comparison_window(failure: int | None, steps: int) -> tuple[int, int]:
    """[start, stop): the `steps` steps ending at the failure, or the first `steps` steps."""
    if failure is None:
        return 0, steps
    return max(0, failure - steps + 1), failure + 1


@dataclass
class ShadowRun:
    outcome: RunOutcome
    start: dict | None  # the shadow_start event: reference chosen, why, accelerator
    first: dict | None  # the first divergence
    summary: dict = field(default_factory=dict)  # the last shadow_summary event

    @property
    def losses(self) -> list[float | None]:
        return [step.get("loss") for step in self.outcome.steps]


def _options(context: StageContext, max_steps: int, **extra) -> ChildOptions:
    return rerun_options(context.target, context.config, context.workdir, "device-compare",
                         max_steps=max_steps, **extra)  # fmt: skip


def shadow_run(context: StageContext, shadow_options: dict) -> ShadowRun:
    stop = shadow_options["stop"]
    options = _options(context, stop, probes=[NAME], extra={NAME: shadow_options})

    def on_event(event: dict) -> None:
        if event["event"] == "step":
            context.progress(f"device_compare: step {event['step'] + 1} of {stop} shadowed…")

    # the steps before the compared ones run as they did in the watched run: resume there
    start = start_for(context.watch.events, latest=shadow_options["start"])
    outcome = run_child(options, context.workdir, timeout_s=context.config.watch.timeout_s,
                        on_event=on_event, name="device-compare-shadow", start=start)  # fmt: skip
    summaries = outcome.all("shadow_summary")
    return ShadowRun(outcome, outcome.first("shadow_start"), outcome.first("shadow_divergence"),
                     summaries[-1] if summaries else {})  # fmt: skip


def run_level_comparison(context: StageContext, steps: int, loss_rtol: float, device: str) -> dict:
    """The script for `steps` steps with CUDA hidden and on `device`, same seed: losses and the
    first non-finite step of each side."""
    hidden = {
        **child_environment(seeded=context.config.watch.seed is not None),
        "CUDA_VISIBLE_DEVICES": "",
    }
    sides = {}
    for side, env in (("cpu", hidden), (device, None)):
        context.progress(f"device_compare: {steps} steps on {side}…")
        outcome = run_child(_options(context, steps), context.workdir, env=env,
                            timeout_s=context.config.watch.timeout_s,
                            name=f"device-compare-{side.replace(':', '')}",
                            start=_WHOLE_RUN)  # fmt: skip
        sides[side] = describe_side(outcome)
    return compare_sides(sides["cpu"], sides[device], device, loss_rtol)


def describe_side(outcome: RunOutcome) -> dict:
    error = outcome.first("script_error")
    nonfinite = outcome.nonfinite
    return {
        "losses": [step.get("loss") for step in outcome.steps],
        "first_nonfinite_step": nonfinite["step"] if nonfinite else None,
        "error": f"{error['type']}: {error['message']}" if error else None,
        "timed_out": outcome.timed_out,
    }


def compare_sides(cpu: dict, accelerator: dict, device: str, loss_rtol: float) -> dict:
    """Per-step relative loss differences and a one-line verdict."""
    differences = relative_differences(cpu["losses"], accelerator["losses"])
    disagree = next((step for step, d in differences.items() if d > loss_rtol), None)
    cpu_bad, accelerator_bad = cpu["first_nonfinite_step"], accelerator["first_nonfinite_step"]
    if cpu["error"] or cpu["timed_out"]:
        verdict = f"the CPU run did not get through: {cpu['error'] or 'timed out'}"
    elif accelerator_bad is not None and cpu_bad is None:
        verdict = f"only the {device} run went non-finite (step {accelerator_bad})"
        if len(cpu["losses"]) <= accelerator_bad:
            verdict += f", and the CPU run ended before that step ({len(cpu['losses'])} steps)"
    elif cpu_bad is not None and accelerator_bad is None:
        verdict = f"only the CPU run went non-finite (step {cpu_bad})"
    elif cpu_bad is not None:
        verdict = f"both went non-finite (CPU at step {cpu_bad}, {device} at {accelerator_bad})"
    elif disagree is not None:
        verdict = f"losses differ by more than {loss_rtol:g} from step {disagree} on"
    else:
        verdict = f"losses agree within {loss_rtol:g}"
    return {
        "cpu": cpu,
        device: accelerator,
        "max_relative_difference": max(differences.values()) if differences else None,
        "first_disagreeing_step": disagree,
        "verdict": verdict,
        # the CPU run got past the step where the accelerator's went non-finite, and stayed finite
        "only_accelerator_nonfinite": accelerator_bad is not None and cpu_bad is None
        and len(cpu["losses"]) > accelerator_bad,
    }  # fmt: skip


def relative_differences(losses: list, others: list) -> dict[int, float]:
    """Step -> relative difference of the two losses, at the steps where both are finite."""
    return {
        step: _relative_difference(a, b)
        for step, (a, b) in enumerate(zip(losses, others, strict=False))
        if _is_number(a) and _is_number(b)
    }


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _relative_difference(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-12)
