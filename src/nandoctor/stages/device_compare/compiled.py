"""Compiled vs eager: when the watched run failed only compiled, its losses beside those of the
eager re-run the localizing replay already made (torch.compile disabled, same seed)."""

from __future__ import annotations

from nandoctor.compiled_only import compiled_only_finding
from nandoctor.report.model import Finding, display_path
from nandoctor.runner import RunOutcome
from nandoctor.stages.device_compare.runs import NAME, relative_differences


def compare_compiled_with_eager(watch: RunOutcome, rerun: dict, loss_rtol: float) -> dict:
    """Per-step losses of both runs up to the compiled run's failure, the first step where
    they differ by more than `loss_rtol` (at the latest the failure itself) and a verdict."""
    failed = watch.nonfinite["step"]
    by_step = {s["step"]: s.get("loss") for s in watch.steps}
    compiled = [by_step.get(step) for step in range(failed)] + [None]  # None: non-finite
    eager = rerun["losses"][: failed + 1]
    differences = relative_differences(compiled, eager)
    differing = next((step for step, d in differences.items() if d > loss_rtol), failed)
    return {
        "compiled": {"losses": compiled, "first_nonfinite_step": failed},
        "eager": {
            "losses": eager,
            "first_nonfinite_step": rerun["first_nonfinite_step"],
            "steps": len(rerun["losses"]),
        },
        "first_differing_step": differing,
        "max_relative_difference": max(differences.values()) if differences else None,
        "loss_rtol": loss_rtol,
        "verdict": _verdict(failed, differing, rerun, loss_rtol),
    }


def _verdict(failed: int, differing: int, rerun: dict, loss_rtol: float) -> str:
    eager_bad = rerun["first_nonfinite_step"]
    eager = (
        f"the eager run went non-finite only at step {eager_bad}"
        if eager_bad is not None
        else f"the eager run stayed finite for {len(rerun['losses'])} steps"
    )
    before = (
        f"losses differed by more than {loss_rtol:g} from step {differing} on"
        if differing < failed
        else f"losses agreed within {loss_rtol:g} before it"
    )
    return f"only the compiled run went non-finite at step {failed} ({eager}); {before}"


def compiled_finding(comparison: dict, rerun: dict) -> Finding:
    """The comparison as evidence; the eager run staying finite throughout shows the fix
    (leave that code uncompiled) working."""
    compiled, eager = comparison["compiled"], comparison["eager"]
    evidence = [
        comparison["verdict"],
        "losses by step, compiled: " + ", ".join([*_shown(compiled["losses"][:-1]), "NaN/Inf"]),
        "losses by step, eager: " + ", ".join(_shown(eager["losses"])),
        f"first step where they differ: {comparison['first_differing_step']}",
    ]
    if where := rerun.get("compiled_at"):
        place = f"torch.compile called at {display_path(where['file'])}:{where['line']}"
        evidence.append(f"{place}: {where['code']}" if where.get("code") else place)
    finite_throughout = eager["first_nonfinite_step"] is None
    return compiled_only_finding(NAME, rerun, evidence, confidence=0.9,
                                 verified=True if finite_throughout else None)  # fmt: skip


def _shown(losses: list) -> list[str]:
    return ["-" if v is None else f"{v:.4g}" for v in losses]
