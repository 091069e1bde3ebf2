"""Verify fixes by treatment: re-run the script with a cause's remedy applied and see whether
it stays finite. A verified fix outranks an unverified guess."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from concurrent.futures import ThreadPoolExecutor

from nandoctor.fixes import GUARDS, guard_for
from nandoctor.optimizer_settings import describe_settings
from nandoctor.ranking import rank_causes
from nandoctor.report.model import Finding
from nandoctor.rewind import FROM_THE_START, Start, start_for
from nandoctor.runner import RunOutcome, rerun_options, rerun_timeout_s, run_child
from nandoctor.stages import StageContext
from nandoctor.stages.lr_sweep.verdicts import progress

_DIVERGED_FACTOR = 10.0  # a treated run whose last loss is this far above its best diverged


def describe_remedy(remedy: dict) -> str:
    kind = remedy["kind"]
    if kind == "guard_op":
        if remedy.get("shown"):
            return f"line {remedy['line']} as `{remedy['shown']}`"
        guard = GUARDS[remedy.get("guard") or guard_for(remedy["op"])].format(x="x")
        return f"every input x of {remedy['op']} at line {remedy['line']} replaced by `{guard}`"
    if kind == "clip_gradients":
        return f"gradients clipped to norm {remedy['max_norm']:g}"
    if kind == "sanitize_inputs":
        return "NaN/Inf in the inputs replaced by 0"
    if kind == "standardize_inputs":
        return "inputs standardized: " + ", ".join(
            f"{path} as (x - {mean:.4g}) / {std:.4g}"
            for path, (mean, std) in remedy["tensors"].items()
        )
    if kind == "reinitialize":
        return f"default initialization of {', '.join(remedy['modules'])}"
    if kind == "float32":
        return "the model kept in float32"
    if kind == "float32_at":
        return (
            f"line {remedy['line']} computed in float32 (its half inputs upcast, autocast "
            "off, its results back in half where another line mixes them with half tensors)"
        )
    if kind == "move_bound":
        if remedy.get("shown"):
            return f"line {remedy['line']} as `{remedy['shown']}`"
        moved = ", ".join(f"{b['side']} {b['bound']:g} as {b['to']}" for b in remedy["bounds"])
        return f"the clamp at line {remedy['line']} with its {moved}"
    if kind == "population_statistics":
        if remedy.get("shown"):
            return f"line {remedy['line']} as `{remedy['shown']}`"
        return f"the std/var at line {remedy['line']} computed with correction=0"
    if kind == "finite_fill":
        if remedy.get("shown"):
            return f"line {remedy['line']} as `{remedy['shown']}`"
        return (
            f"the infinities line {remedy['line']} fills in written as the dtype's finite extremes"
        )
    if kind == "optimizer_eps":
        return f"the optimizer's eps set to {remedy['eps']:g}"
    if kind == "optimizer_settings":
        return f"the optimizer built with {describe_settings(remedy['settings'])}"
    return kind


def horizon(context: StageContext, start: Start = FROM_THE_START) -> int:
    """Steps a fixed run must stay finite: well past the original failure, by a margin that
    grows with the steps the re-run repeats (from `start`). Not capped by the watch's
    `--max-steps`: that budget stops the search for a failure, and a fix that held for fewer
    steps than the failure took proves nothing."""
    settings = context.config.verify
    through = _failed_at(context) + 1  # steps up to and including the one that failed
    repeated = through - start.step
    return through + max(settings.min_margin, math.ceil(settings.margin_factor * repeated))


# Remedies that act on what happens at each step, so a run resumed from a rewind point applies
# them exactly as a run from step 0 would. The others act when the model or optimizer is built
# (settings, initialization, dtype) and need the script from its start.
_AT_EACH_STEP = ("guard_op", "move_bound", "population_statistics", "sanitize_inputs",
                 "float32_at", "finite_fill")  # fmt: skip
# A model trained on other inputs up to a rewind point would see a shifted distribution.
_FROM_THE_FIRST_BATCH = ("standardize_inputs",)
# Acting earlier could have prevented the failure: the run resumes some steps before it.
_OVER_STEPS = ("clip_gradients",)


def treatment_start(context: StageContext, remedy: dict) -> Start:
    """Where the treated re-run of `remedy` starts."""
    failed_at = _failed_at(context)
    kind = remedy["kind"]
    if kind in _AT_EACH_STEP:
        return start_for(context.watch.events, latest=failed_at)
    if kind in _OVER_STEPS:  # the remedy needs steps to act
        return start_for(context.watch.events, latest=failed_at,
                         lead=context.config.verify.min_margin)  # fmt: skip
    if kind in _FROM_THE_FIRST_BATCH:
        return Start(None, f"from step 0: with {describe_remedy(remedy)}, the model learns on "
                           "those inputs from its first batch")  # fmt: skip
    return Start(None, f"from step 0: {describe_remedy(remedy)} acts when the script builds "
                       "its model or optimizer")  # fmt: skip


def _failed_at(context: StageContext) -> int:
    failure = context.watch.nonfinite
    return failure["step"] if failure else len(context.watch.steps)


def _treated(context: StageContext, remedy: dict, name: str) -> tuple[bool, str, float | None]:
    """The script re-run with `remedy`: whether it held past the original failure, the
    evidence line that says so, and how far its loss fell from step 0 (`progress`)."""
    start = treatment_start(context, remedy)
    steps = horizon(context, start)
    options = rerun_options(context.target, context.config, context.workdir, name,
                            max_steps=steps, remedy=remedy)  # fmt: skip
    timeout_s = rerun_timeout_s(context.config, context.watch, steps - start.step)
    run = run_child(options, context.workdir, timeout_s=timeout_s, name=name, start=start)
    held, line = _verdict(run, steps, remedy, _failed_at(context), context.watch.steps)
    whole = [*context.watch.steps[: run.start_step], *run.steps]
    return held, line, progress([s.get("loss") for s in whole]) if held else None


def _verdict(
    run: RunOutcome, steps: int, remedy: dict, failed_at: int, before: list[dict]
) -> tuple[bool, str]:
    """Whether the treated run held, and the evidence line. `before`: the watched run's steps,
    the same as a run resumed from a rewind point up to that point."""
    what = describe_remedy(remedy)
    if run.start_step:
        what += f" from the rewind point at step {run.start_step}"
    if run.nonfinite is not None:
        return False, f"re-ran with {what}: still non-finite at step {run.nonfinite['step']}"
    if error := run.first("script_error"):
        return (
            False,
            f"re-ran with {what}: the script then failed ({error['type']}: {error['message']})",
        )
    if run.timed_out or run.crashed or run.first("internal_error"):
        return False, f"re-ran with {what}: the run did not complete"
    done = run.steps_done
    ended = (run.end or {}).get("outcome")
    if done < steps and ended != "finished":
        return False, f"re-ran with {what}: stopped after {done} steps, short of {steps}"
    never_updated = done == 0 and bool(run.all("optimizer"))
    if never_updated or done < failed_at:
        # a script that builds an optimizer and ends without one update (a GradScaler that
        # skipped every step once its scale fell to 0, say) never reached the step that failed:
        # finite proves nothing there; a script without an optimizer has no steps to reach
        return False, (f"re-ran with {what}: the script ended after {done} optimizer steps, "
                       f"before the step that failed ({failed_at})")  # fmt: skip
    if growth := _diverging([*before[: run.start_step], *run.steps]):
        return False, f"re-ran with {what}: finite, but {growth}"
    past = done - (failed_at + 1)
    margin = f", {past} past the original failure at step {failed_at}" if past > 0 else ""
    return True, f"re-ran with {what}: finite for {done} optimizer steps{margin}"


def _diverging(steps: list[dict]) -> str | None:
    """A remedy that only hides the symptom leaves a loss that keeps growing. Judged over the
    whole run, the steps before a rewind point included, so where the re-run started does not
    change the answer."""
    losses = [s["loss"] for s in steps if isinstance(s.get("loss"), (int, float))]
    if len(losses) < 4:
        return None
    # Rolling medians: one noisy minibatch near the loss's floor is no trend.
    smooth = [statistics.median(losses[max(0, i - 4) : i + 1]) for i in range(len(losses))]
    best, first, last = min(smooth), smooth[0], smooth[-1]
    if math.isfinite(last) and best > 0 and last > _DIVERGED_FACTOR * best and last > first:
        return f"the loss kept growing ({first:.4g} -> {last:.4g})"
    return None


def fixes_to_try(findings: list[Finding], max_fixes: int) -> list[Finding]:
    """The findings whose remedies get a treated re-run: one per cause, strongest cause first.
    The cause's own finding when it has a remedy, else another finding of its category that
    has one (a verified fix then makes that finding the cause's primary)."""
    to_try: list[Finding] = []
    for cause in rank_causes(findings):
        untried = [f for f in findings if f.category == cause.category and f.remedy
                   and f.verified_fix is None and f not in to_try]  # fmt: skip
        at_the_cause = [f for f in untried if f.location == cause.location]
        # the cause's own claim first: another stage's finding on its line may carry another fix
        match = next((f for f in at_the_cause if f.code == cause.code), None) or next(
            iter(at_the_cause + untried), None
        )
        if match is not None:
            to_try.append(match)
        if len(to_try) >= max_fixes:
            break
    return to_try


def verify_findings(context: StageContext, findings: list[Finding]) -> list[Finding]:
    """Findings with `verified_fix` and an evidence line set for the strongest that carry an
    automatic remedy; the others unchanged."""
    settings = context.config.verify
    if context.watch.nonfinite is None or settings.max_fixes <= 0:
        return findings
    to_try = fixes_to_try(findings, settings.max_fixes)
    if not to_try:
        return findings
    context.progress(f"verifying {len(to_try)} fix(es) by re-running the script…")
    cores_per_run = context.target.nproc_per_node  # a torchrun launch runs that many processes
    workers = max(1, min(settings.jobs, (os.cpu_count() or 1) // cores_per_run))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        treated = list(pool.map(lambda item: _treated(context, item[1].remedy, f"verify-{item[0]}"),
                                enumerate(to_try)))  # fmt: skip
    verified = {}
    for finding, (ok, line, fell) in zip(to_try, treated, strict=True):
        verified[id(finding)] = dataclasses.replace(
            finding, verified_fix=ok, evidence=(*finding.evidence, line), progress=fell
        )
    for key, finding in list(verified.items()):
        if finding.verified_fix is False and (broader := finding.remedy.get("otherwise")):
            verified[key] = _broader_remedy_tried(context, finding, broader)
    return [verified.get(id(f), f) for f in findings]


def _broader_remedy_tried(context: StageContext, finding: Finding, broader: dict) -> Finding:
    """A narrow remedy that did not hold (one line in float32) followed by its broader form
    (the whole model in float32): if that holds, it is the fix the finding shows and verified,
    the narrow one's failure staying in the evidence."""
    ok, line, fell = _treated(context, broader, "verify-broader")
    evidence = (*finding.evidence, line)
    if not ok:
        return dataclasses.replace(finding, evidence=evidence)
    fix = (f"verified with {describe_remedy(broader)}; {describe_remedy(finding.remedy)} "
           f"alone did not hold. {finding.fix}")  # fmt: skip
    return dataclasses.replace(finding, remedy=broader, verified_fix=True, fix=fix,
                               evidence=evidence, progress=fell)  # fmt: skip
