"""Device comparison stage: is it the hardware or the precision?

The script runs again with every op of a few steps shadowed on a reference: the CPU at the same
dtype when an accelerator is present (device question), float64 on the CPU otherwise (precision
question). The first op that differs beyond its dtype's tolerance, or is non-finite on one side
only, and the ops with the largest differences go in the report. With CUDA, the same steps also
run on the CPU (CUDA hidden) and on the GPU, and their losses are compared. When the failure
appeared only in the torch.compile'd run, the comparison is compiled vs eager instead: the eager
re-run that the localizing replay made, beside the watched run.
"""

from __future__ import annotations

from collections import Counter

from nandoctor.compiled_only import only_compiled
from nandoctor.instrument.precision import is_reduced
from nandoctor.report.model import StageResult
from nandoctor.stages import StageContext, StageOutcome
from nandoctor.stages.device_compare.compiled import compare_compiled_with_eager, compiled_finding
from nandoctor.stages.device_compare.findings import findings_from
from nandoctor.stages.device_compare.render import render_details
from nandoctor.stages.device_compare.runs import (
    NAME,
    ShadowRun,
    comparison_window,
    failure_step,
    run_level_comparison,
    shadow_run,
)
from nandoctor.stages.device_compare.settings import Settings

__all__ = ["NAME", "Settings", "install_probe", "render_details", "run"]

_REFERENCE_LABELS = {"float64": "cpu-float64", "cpu": "cpu"}
# Fields of a shadow record the report keeps (the schema's, then the evidence behind them).
_RECORD_FIELDS = (
    "step", "op", "module", "location", "max_abs_err", "max_rel_err", "nonfinite_only_on",
    "ratio", "beyond", "elements", "target_nonfinite", "reference_max", "target_max",
    "input_max", "explanation", "backward_node", "target", "reference", "basis", "tolerance",
    "beyond_tolerance",
)  # fmt: skip


def install_probe(session, options) -> None:
    """In the child: shadow every op of the asked steps on the reference."""
    from nandoctor.instrument.shadow import install_shadow

    install_shadow(session, options.extra[NAME])


def run(context: StageContext) -> StageOutcome:
    settings: Settings = context.config.device_compare
    if context.watch.timed_out:
        return StageOutcome(StageResult("skipped", "the watched run timed out; a shadowed run, "
                                        "slower still, would too"))  # fmt: skip
    if context.watch.nonfinite is None and not settings.when_finite:
        return StageOutcome(StageResult("skipped", "the watched run stayed finite: nothing to "
                                        "explain (`nandoctor compare-devices` compares anyway)"))  # fmt: skip
    if (rerun := only_compiled(context.watch)) is not None:
        return _compiled_vs_eager(context, rerun, settings)
    if not settings.when_float32_cpu and not _in_question(context.watch):
        return StageOutcome(StageResult("skipped", (
            "the run computed in float32 on the CPU: no accelerator and no reduced precision "
            "(float16, bfloat16, TF32) to compare against (`nandoctor compare-devices` "
            "compares anyway)")))  # fmt: skip
    start, stop = comparison_window(failure_step(context), settings.steps)
    context.progress(f"device_compare: shadowing steps {start} to {stop - 1}…")
    shadow = shadow_run(context, settings.shadow_options(start, stop))
    if shadow.start is None:
        return StageOutcome(StageResult("failed", _why_not_started(shadow)))
    details = _details(shadow, start, stop)
    run_comparison, device = None, _main_device(shadow)
    if device is not None and device.startswith("cuda"):
        # as far as the failure, at least: a failure the runs do not reach cannot be compared
        steps = max(settings.run_steps, stop)
        run_comparison = run_level_comparison(context, steps, settings.loss_rtol, device)
        details["run_comparison"] = run_comparison
        details["loss_trajectories"] = {
            side: run_comparison[side]["losses"] for side in ("cpu", device)
        }
    findings = findings_from(shadow.first, run_comparison, context.watch.nonfinite is not None,
                             device)  # fmt: skip
    return StageOutcome(StageResult("ran", _summary(details, shadow), details=details), findings)


def _in_question(watch) -> bool:
    """The device is in question when an accelerator was there to use; the precision when the
    model computed in a reduced precision at some point (the watch says so per model)."""
    cuda = (watch.first("start") or {}).get("cuda")
    return bool(cuda) or any(is_reduced(state) for state in watch.all("precision"))


def _compiled_vs_eager(context: StageContext, rerun: dict, settings: Settings) -> StageOutcome:
    """No shadowed run: under its dispatch mode torch.compile falls back to eager, where this
    failure does not happen; the two runs already made are the comparison."""
    comparison = compare_compiled_with_eager(context.watch, rerun, settings.loss_rtol)
    details = {
        "compiled_vs_eager": comparison,
        "loss_trajectories": {side: comparison[side]["losses"] for side in ("compiled", "eager")},
    }
    summary = f"compiled vs eager: {comparison['verdict']}"
    finding = compiled_finding(comparison, rerun)
    return StageOutcome(StageResult("ran", summary, details=details), [finding])


def _why_not_started(shadow: ShadowRun) -> str:
    internal = shadow.outcome.first("internal_error")
    if internal:
        return f"the shadowed run could not start: {internal['text']}"
    return f"the shadowed run ended before its first op ({shadow.outcome.returncode})"


def _main_device(shadow: ShadowRun) -> str | None:
    """The accelerator device most compared ops ran on ("cuda:0"), if any."""
    devices = Counter()
    for label, count in shadow.summary.get("targets", {}).items():
        device = label.rsplit("-", 1)[0]
        if device != "cpu":
            devices[device] += count
    return devices.most_common(1)[0][0] if devices else None


def _reference_used(shadow: ShadowRun) -> str:
    """`cpu` when ops were compared against the CPU at their dtype, else `cpu-float64`."""
    used = shadow.summary.get("references", {})
    if used:
        return "cpu" if used.get("cpu") else "cpu-float64"
    return _REFERENCE_LABELS[shadow.start["reference"]]


def _reason(shadow: ShadowRun, reference: str) -> str:
    accelerator = shadow.start.get("accelerator")
    if accelerator and reference == "cpu-float64" and shadow.start.get("asked") == "auto":
        return (
            f"{accelerator} present, but the script kept its tensors on the CPU: its ops ran "
            "again on the CPU in float64"
        )
    return shadow.start["reason"]


def _target_label(shadow: ShadowRun, reference: str) -> str:
    if reference == "cpu":
        return _main_device(shadow) or shadow.start.get("accelerator") or "cpu"
    targets = shadow.summary.get("targets", {})
    total = sum(targets.values())
    dtypes = Counter()
    for label, count in targets.items():
        dtypes[label.rsplit("-", 1)[-1]] += count
    # dtypes that carry at least a tenth of the compared ops, most used first
    shown = [d for d, n in dtypes.most_common() if n * 10 >= total]
    return "cpu-" + ("+".join(shown) if shown else "float32")


def report_record(record: dict | None) -> dict | None:
    """A shadow record as the report's `first_divergence` / `worst_ops` entry."""
    if record is None:
        return None
    entry = {key: record.get(key) for key in _RECORD_FIELDS if key in record}
    if record["phase"] in ("forward", "backward", "optimizer"):
        entry["phase"] = record["phase"]
    else:  # before the model's forward in the step: preparing the batch
        entry["during"] = record["phase"]
    if record.get("drift_from"):
        entry["drift_from"] = report_record(record["drift_from"])
    return entry


def _details(shadow: ShadowRun, start: int, stop: int) -> dict:
    summary = shadow.summary
    counts = summary.get("counts", {})
    steps = shadow.outcome.steps
    window_losses = [s.get("loss") for s in steps if start <= s["step"] < stop]
    failed = shadow.outcome.nonfinite
    if (
        failed
        and start <= failed["step"] < stop
        and all(s["step"] != failed["step"] for s in steps)
    ):
        window_losses.append(None)  # the step whose loss or gradients went non-finite
    reference = _reference_used(shadow)
    target = _target_label(shadow, reference)
    details = {
        "reference": reference,
        "target": target,
        "reference_reason": _reason(shadow, reference),
        "steps": len(summary.get("steps_compared", [])),
        "window": {"start": start, "stop": stop},
        "ops_compared": summary.get("ops_compared", 0),
        "first_divergence": report_record(shadow.first),
        "worst_ops": [report_record(r) for r in summary.get("worst", [])],
        "loss_trajectories": {target: window_losses},
        "ops_sampled_out": counts.get("sampled out", 0),
        "ops_skipped": {
            k.removeprefix("skipped: "): v for k, v in counts.items() if k.startswith("skipped: ")
        },  # fmt: skip
        "reference_failures": summary.get("reference_failures", {}),
        "accelerator": shadow.start.get("accelerator"),
    }
    for key in ("device_name", "tf32"):
        if key in summary:
            details[key] = summary[key]
    return details


def _summary(details: dict, shadow: ShadowRun) -> str:
    versus = f"{details['target']} vs {details['reference']}"
    if not details["accelerator"]:
        versus += ", no accelerator"
    first = details["first_divergence"]
    if first is not None:
        location = first.get("location")
        where = f" at {location['file'].rsplit('/', 1)[-1]}:{location['line']}" if location else ""
        side = first.get("nonfinite_only_on")
        how = f"non-finite only on the {side}" if side else f"{first['ratio']:.3g}x tolerance"
        phase = first.get("phase") or first.get("during")
        return f"first divergence: {first['op']}{where} ({phase}, step {first['step']}): {how} ({versus})"
    if details["ops_compared"] == 0:
        if shadow.start.get("asked") == "cpu":
            return (f"no op ran on the accelerator, nothing to compare at the same precision: "
                    f"use --reference float64 ({versus})")  # fmt: skip
        return f"no op was compared ({versus})"
    return (f"no op differed beyond tolerance: {details['ops_compared']} ops compared over "
            f"{details['steps']} steps ({versus})")  # fmt: skip
