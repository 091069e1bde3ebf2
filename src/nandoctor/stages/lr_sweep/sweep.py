"""The sweep: gate on the watched run, horizon, candidates in parallel, then conclusions."""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass

from nandoctor.child.options import ChildOptions
from nandoctor.ranking import loss_growth
from nandoctor.report.model import StageResult
from nandoctor.rewind import FROM_THE_START, Start, start_for
from nandoctor.runner import RunOutcome, rerun_timeout_s, script_options
from nandoctor.stages import StageContext, StageOutcome
from nandoctor.stages.lr_sweep import conclusions
from nandoctor.stages.lr_sweep.conclusions import label
from nandoctor.stages.lr_sweep.runs import (
    DISCARD_GRACE_S,
    EVENT,
    Pool,
    record_from,
    run_error,
)
from nandoctor.stages.lr_sweep.search import Planned, RunRecord, Search
from nandoctor.stages.lr_sweep.verdicts import blew_up, gradient_explosion

NAME = "lr_sweep"


@dataclass(frozen=True)
class Plan:
    horizon: int  # steps from `start`
    horizon_capped: bool
    jobs: int
    threads: int
    devices: list[str]
    timeout_s: float
    workdir: str
    start: Start = FROM_THE_START  # every candidate resumes here; its steps count from there


def skip_reason(watch: RunOutcome, timeout_s: float) -> str | None:
    """Why the learning rate cannot be the cause, or why there is nothing to sweep against."""
    if watch.updates_by_hand:
        return (
            "no torch.optim optimizer was built: the script updates its parameters itself, so "
            "its learning rate lives in its own code and cannot be scaled from outside"
        )
    event = watch.nonfinite
    if event is not None:
        birth = event.get("birth") or {}
        step = birth.get("step", event.get("step"))
        phase = birth.get("phase", event.get("phase"))
        into_parameter = event.get("target") == "parameter"
        if step == 0 and phase != "optimizer" and not into_parameter:
            return (
                f"the first NaN/Inf appeared at step 0 in the {phase} phase{_where(birth)}, "
                "before any optimizer update: the learning rate cannot be the cause"
            )
        if birth.get("inputs_nonfinite") and not loss_growth(watch.losses):
            # Values made outside torch's ops are data only when the run was not diverging
            # already: targets or observations computed from the model's own outputs (a
            # detection loss's matching in Python, an environment driven by the policy) go
            # non-finite because the model did.
            return (
                f"the NaN/Inf entered torch already non-finite (from the data) at step {step}"
                f"{_where(birth)}: the learning rate cannot be the cause"
            )
        return None
    if not watch.steps:
        return "no optimizer step was observed (no torch.optim optimizer stepped): nothing to scale"
    if watch.failed_step is not None:
        return None  # the script died of a loss that diverged: its history up to there counts
    if error := run_error(watch, timeout_s):
        return f"the watched run gave no usable history ({error})"
    return None


def _without_a_rate(watch: RunOutcome) -> str | None:
    """Why no multiplier can change the run: none of its optimizers has a learning rate (an
    AdaDelta ported without one, whose step size is its own formula's)."""
    built = watch.all("optimizer")
    if not built or any(o["has_rate"] for o in built):
        return None
    names = ", ".join(sorted({o["type"] for o in built}))
    return (
        f"the optimizer ({names}) has no learning rate: its step size comes from its own "
        "update rule, which no learning-rate multiplier scales, so the rate cannot be the cause"
    )


def _where(birth: dict) -> str:
    location = birth.get("location") or {}
    if not birth.get("op"):
        return ""
    where = f" at {os.path.basename(location['file'])}:{location['line']}" if location else ""
    return f" ({birth['op']}{where})"


def _device_groups(devices: list[str], per_run: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES of each concurrent run: `per_run` accelerators apiece for the ranks
    of a torchrun launch (all of them to one run when there are fewer)."""
    if per_run <= 1:
        return devices
    groups = [",".join(devices[i : i + per_run])
              for i in range(0, len(devices) - per_run + 1, per_run)]  # fmt: skip
    return groups or ([",".join(devices)] if devices else [])


def _beyond_horizon(baseline: RunRecord, settings, why_from_zero: str) -> str | None:
    """A learning rate is judged stable only past the step where x1 failed, plus a margin: a
    failure later than the longest horizon allows cannot be swept honestly."""
    failed_at = baseline.verdict.failure_step
    if failed_at is None or failed_at + settings.horizon_margin <= settings.max_steps:
        return None
    wanted = math.ceil(settings.horizon_factor * failed_at) + settings.horizon_margin
    return (
        f"the run failed at step {failed_at}, past the sweep's longest horizon of "
        f"{settings.max_steps} steps (lr_sweep.max_steps), and candidates would start "
        f"{why_from_zero.removeprefix('from step 0: ')}: no smaller learning rate can be "
        "called stable over fewer steps than the failure took; `--steps "
        f"{wanted}` (sweep-lr) or `lr_sweep: {{max_steps: {wanted}}}` sweeps that far"
    )


def rewound_horizon(settings, failed_at: int) -> int:
    """From a rewind point, the step a candidate must stay stable through: past the failure by
    `rewound_margin` of the steps up to it. The margin scales with the failure step, not with
    the point's lead: a smaller learning rate that only delays a slow-onset failure by a few
    steps must not pass for a cure."""
    through = failed_at + 1
    return through + max(settings.horizon_margin, math.ceil(settings.rewound_margin * through))


def sweep_start(context: StageContext) -> Start:
    """Where candidates start: the newest rewind point at least `rewind_min_lead` steps before
    the failure, from which a candidate repeats at most `rewound_max_steps` steps; step 0 when
    none is (or the watched run stayed finite: nothing to rewind to)."""
    failed_at = context.watch.failed_step
    if failed_at is None:
        return FROM_THE_START
    settings = context.config.lr_sweep
    start = start_for(context.watch.events, latest=failed_at, lead=settings.rewind_min_lead)
    too_far = rewound_horizon(settings, failed_at) - start.step > settings.rewound_max_steps
    if start.point and too_far:
        return Start(None, f"from step 0: the rewind point at step {start.step} is more than "
                           f"lr_sweep.rewound_max_steps ({settings.rewound_max_steps}) steps "
                           "from the end of the horizon")  # fmt: skip
    return start


def _before_the_onset(start: Start, whole: RunRecord, settings) -> Start:
    """A smaller learning rate from the point cannot undo what the steps before it did: when
    the watched run's loss was already diverging before the point (judged over the whole run),
    candidates start from step 0."""
    onset = whole.verdict.failure_step
    if start.point is None or onset is None or start.step + settings.rewind_min_lead <= onset:
        return start
    return Start(None, f"from step 0: the loss was already diverging at step {onset} "
                       f"({whole.verdict.detail}), before the rewind point at step {start.step}")  # fmt: skip


def choose_plan(context: StageContext, baseline: RunRecord, start: Start = FROM_THE_START) -> Plan:
    settings = context.config.lr_sweep
    longest = settings.rewound_max_steps if start.point else settings.max_steps
    failed_at = baseline.verdict.failure_step
    if failed_at is None:
        wanted = baseline.steps
    elif start.point:  # steps a candidate repeats from the point
        wanted = rewound_horizon(settings, failed_at) - start.step
    else:
        wanted = math.ceil(settings.horizon_factor * failed_at) + settings.horizon_margin
    wanted = max(wanted, settings.min_steps)
    horizon = min(wanted, longest)
    cores = os.cpu_count() or 1
    cuda = (context.watch.first("start") or {}).get("cuda")
    per_run = context.target.nproc_per_node  # processes (and accelerators) one run takes
    devices = _device_groups(visible_accelerators(), per_run) if cuda else []
    jobs = settings.jobs or (
        len(devices) if devices else _jobs_on_the_cpu(context, cores // per_run)
    )
    derived = rerun_timeout_s(context.config, context.watch, horizon)
    workdir = os.path.join(context.workdir, NAME)
    os.makedirs(workdir, exist_ok=True)
    return Plan(
        horizon=horizon,
        horizon_capped=wanted > longest,
        jobs=jobs,
        threads=context.config.watch.threads or max(1, cores // (jobs * per_run)),
        devices=devices,
        timeout_s=settings.run_timeout_s or derived,
        workdir=workdir,
        start=start,
    )


def _jobs_on_the_cpu(context: StageContext, cores: int) -> int:
    """One candidate per core, at most `max_jobs`; one at a time when the watched run's peak
    memory was above `parallel_max_rss_mb`: each candidate holds its own model, optimizer state
    and activations, and running them side by side would multiply the run's memory."""
    settings = context.config.lr_sweep
    peak_mb = (context.watch.end or {}).get("peak_rss_mb") or 0
    if peak_mb > settings.parallel_max_rss_mb:
        return 1
    return max(1, min(cores, settings.max_jobs))


def visible_accelerators() -> list[str]:
    """CUDA device ids a child may be pinned to, read without importing torch."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [d.strip() for d in listed.split(",") if d.strip() and d.strip() != "-1"]
    try:
        return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
    except OSError:
        return []


def candidate_options(context: StageContext, plan: Plan, planned: Planned) -> ChildOptions:
    """A fresh run of the unmodified script: same seed, step-level checks only, every learning
    rate times the multiplier, and its writes kept away from the user's files."""
    return script_options(
        context.target,
        context.config,
        max_steps=plan.start.step + plan.horizon,
        threads=plan.threads,
        detect=False,
        probes=[NAME],
        lr_multiplier=planned.multiplier,
        # a re-run: its writes go to its own scratch folder, removed when the run is done
        scratch_dir=_scratch(plan, planned),
        extra={
            NAME: {"multiplier": planned.multiplier, "clip": planned.clip, "site": planned.site}
        },
    )


def _scratch(plan: Plan, planned: Planned) -> str:
    return os.path.join(plan.workdir, f"{planned.key}.scratch")


_WATCHED = Planned(1.0, "watched")  # the watched run, as the sweep's x1


def run(context: StageContext) -> StageOutcome:
    settings = context.config.lr_sweep
    reason = skip_reason(context.watch, context.config.watch.timeout_s)
    if reason is None and context.watch.failed_step is None and not settings.when_finite:
        reason = (
            "the watched run stayed finite: there is no failure for the learning rate to "
            "explain (`nandoctor sweep-lr` sweeps anyway)"
        )
    if reason:
        return StageOutcome(StageResult("skipped", reason))
    if reason := _without_a_rate(context.watch):
        # A positive fact against the rate, not only a gap: the failure is not its doing.
        details = {"conclusion": conclusions.NO_RATE}
        return StageOutcome(StageResult("skipped", reason, details=details))
    start = _before_the_onset(sweep_start(context),
                              record_from(_WATCHED, context.watch, settings, max(len(context.watch.steps), 1)),
                              settings)  # fmt: skip
    swept = _sweep_from(context, start)
    if isinstance(swept, StageOutcome):
        return swept
    search, plan = swept
    asked_again = start.point is not None and search.past_saving()
    if asked_again:
        # From the point even the smallest rate failed no later than x1: either the run was
        # doomed before the point, or the rate does not matter at all (a schedule, a
        # temperature). Which one only a sweep from step 0 can tell; the verdict must not
        # depend on where a point happened to fall.
        ruled = conclusions.past_saving_reason(search)
        start = Start(None, f"from step 0: from the rewind point at step {start.step} {ruled}")
        swept = _sweep_from(context, start)
        if isinstance(swept, StageOutcome):
            return swept
        search, plan = swept
    summary = conclusions.summary(search, plan.horizon)
    details = conclusions.details(search, plan.horizon, plan.jobs)
    details["from_step"] = start.step
    if start.point:
        failed_at = context.watch.failed_step
        summary = (f"candidates resumed from the rewind point at step {start.step}, "
                   f"{failed_at - start.step} steps before the failure, each run for up to "
                   f"{plan.horizon} steps from there: {summary}")  # fmt: skip
    elif asked_again:
        summary = f"candidates started {start.why}: {summary}"
    return StageOutcome(StageResult("ran", summary, details=details), conclusions.findings(search))


def _sweep_from(context: StageContext, start: Start) -> tuple[Search, Plan] | StageOutcome:
    """The search run with every candidate starting at `start`, or the stage's outcome when
    there is nothing to sweep from there."""
    settings = context.config.lr_sweep
    steps = len(context.watch.steps) - start.step
    baseline = record_from(_WATCHED, context.watch, settings, max(steps, 1), first_step=start.step)
    if baseline.verdict.verdict == "stable":
        details = {
            "recommended_lr_multiplier": 1.0,
            "conclusion": conclusions.NOT_IMPLICATED,
            "horizon": steps,
            "runs": [conclusions.run_row(baseline)],
        }
        summary = conclusions.not_implicated_summary(baseline)
        return StageOutcome(StageResult("ran", summary, details=details))
    if not start.point and (reason := _beyond_horizon(baseline, settings, start.why)):
        return StageOutcome(StageResult("skipped", reason))
    plan = choose_plan(context, baseline, start)
    norms = context.watch.grad_norms[: context.watch.failed_step]
    exploded = gradient_explosion(norms, settings.explosion_factor)
    search = Search(settings, baseline, plan.horizon_capped, context.watch.first("recurrent"),
                    exploded, plan.jobs)  # fmt: skip
    run_search(context, search, plan)
    return search, plan


def run_search(context: StageContext, search: Search, plan: Plan) -> None:
    """Start candidates as slots free up, stop the ones that blew up or no longer matter."""
    settings = context.config.lr_sweep
    pool = Pool(plan.workdir, plan.jobs, plan.timeout_s, plan.devices)
    started: dict[str, Planned] = {}
    asked_to_stop: set[str] = set()
    try:
        while not search.done:
            for planned in search.take(pool.free):
                started[planned.key] = planned
                pool.start(planned, candidate_options(context, plan, planned), plan.start)
            for planned in search.doomed():
                active = pool.active.get(planned.key)
                pool.stop(planned.key, DISCARD_GRACE_S)
                search.forget(planned, active.steps if active else 0)
            item = pool.next_item(timeout=0.5)
            if item is None:
                continue
            kind, key, payload = item
            if kind == EVENT:
                active = pool.active.get(key)
                if payload.get("event") == "step" and active and key not in asked_to_stop:
                    if active.due_for_blow_up_check() and blew_up(
                        active.losses, settings, plan.horizon
                    ):
                        pool.stop(key)  # diverged already: no need to run out the horizon
                        asked_to_stop.add(key)
                    _progress(context, search, pool, plan)
                continue
            planned = started[key]
            shutil.rmtree(_scratch(plan, planned), ignore_errors=True)
            if key not in search.running:
                continue  # stopped as no longer needed
            search.record(record_from(planned, payload, settings, plan.horizon,
                                      first_step=plan.start.step,
                                      timeout_s=plan.timeout_s,
                                      stopped_by_sweep=key in asked_to_stop))  # fmt: skip
            _progress(context, search, pool, plan)
    finally:
        pool.shutdown()
        for planned in started.values():
            shutil.rmtree(_scratch(plan, planned), ignore_errors=True)


def _progress(context: StageContext, search: Search, pool: Pool, plan: Plan) -> None:
    done = len(search.results) - 1 + len(search.clip_runs) + len(search.alone_runs)
    going = " · ".join(
        f"×{label(run.planned.multiplier)} step {run.steps}/{plan.horizon}"
        for run in pool.active.values()
        if run.stop_requested_at is None
    )
    context.progress(
        f"lr_sweep: {done} run{'s' if done != 1 else ''} done" + (f" · {going}" if going else "")
    )
