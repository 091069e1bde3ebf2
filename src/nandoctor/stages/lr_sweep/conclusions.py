"""What the sweep's runs add up to: the stage's JSON details, its summary and its findings."""

from __future__ import annotations

import math

from nandoctor.report.model import Finding, Location
from nandoctor.stages.lr_sweep.batch_spikes import BatchSpikes, batch_spikes
from nandoctor.stages.lr_sweep.search import CLIP, RunRecord, Search, same, site_of
from nandoctor.stages.lr_sweep.verdicts import progress

NAME = "lr_sweep"
LEARNING_RATE, INSENSITIVE, NONE_STABLE, NOT_IMPLICATED, NO_RATE = (
    "learning_rate",
    "lr_insensitive",
    "no_stable_multiplier",
    "not_implicated",
    "no_learning_rate",  # the optimizer has none: nothing to sweep, and not the cause
)


def past_saving_reason(search: Search) -> str:
    smallest = search.result_at(search.grid[-1])
    return (
        f"even ×{label(search.grid[-1])} failed no later than ×1 (steps "
        f"{smallest.verdict.failure_step} and {search.baseline.verdict.failure_step})"
    )


def label(multiplier: float) -> str:
    """1, 1/2, 1/4 ... for the halving grid; 0.35 for anything else."""
    if multiplier > 0:
        k = -math.log2(multiplier)
        if k >= 0 and abs(k - round(k)) < 1e-9:
            return "1" if round(k) == 0 else f"1/{2 ** round(k)}"
    return f"{multiplier:.3g}"


def number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def peak_lrs(record: RunRecord) -> list[float]:
    """The largest learning rate each param group got in this run (schedules vary it)."""
    groups = max((len(lrs) for lrs in record.lrs), default=0)
    peaks = []
    for g in range(groups):
        values = [lrs[g] for lrs in record.lrs if len(lrs) > g and lrs[g] is not None]
        peaks.append(max(values) if values else None)
    return peaks


def final_loss(record: RunRecord) -> float | None:
    return next((v for v in reversed(record.losses) if v is not None and math.isfinite(v)), None)


def losses(record: RunRecord) -> list[float | None]:
    """The run's loss per step to 4 significant digits (None where none was seen)."""
    return [
        float(f"{v:.4g}") if v is not None and math.isfinite(v) else None for v in record.losses
    ]


def run_row(record: RunRecord) -> dict:
    verdict = record.verdict
    peaks = peak_lrs(record)
    return {
        "multiplier": record.multiplier,
        "label": label(record.multiplier),
        "purpose": record.planned.purpose,
        "clip": record.planned.clip,
        "clipped_steps": record.clipped_steps,
        # an `alone` run lowered only the rates of the optimizers built at this line
        "only_optimizers_at": _site_dict(record.planned.site),
        "lr": peaks[0] if peaks else None,
        "lrs": peaks,
        "steps": record.steps,
        "first_nonfinite_step": record.nonfinite_step,
        "final_loss": final_loss(record),
        "verdict": verdict.verdict,
        "reason": verdict.reason,
        "detail": verdict.detail,
        "failure_step": verdict.failure_step,
        "pattern": verdict.pattern,
        "warning": verdict.warning,
        "duration_s": round(record.duration_s, 2),
        "losses": losses(record),
    }


def conclusion_of(search: Search) -> str:
    if search.lr_insensitive():
        return INSENSITIVE
    if search.recommended is None:
        return NONE_STABLE
    return LEARNING_RATE


def dose_response(search: Search) -> float | None:
    """Slope of log(failure step) against log(multiplier) over the diverged runs: about -1 when
    the failure comes proportionally later as the learning rate falls, about 0 when it does not
    move."""
    points = {
        r.multiplier: r.verdict.failure_step
        for r in search.measured()
        if r.verdict.verdict == "diverged" and r.verdict.failure_step is not None
    }
    if len(points) < 2:
        return None
    xs = [math.log(m) for m in points]
    ys = [math.log(step + 1) for step in points.values()]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
    return round(slope, 3)


def construction(search: Search) -> tuple[list[dict], list[dict]]:
    """The optimizers and schedulers the script constructed, as the candidate runs saw them."""
    for record in search.results.values():
        if record.optimizers:
            return record.optimizers, record.schedulers
    return [], []


def recommended_lrs(search: Search, optimizers: list[dict]) -> list[dict]:
    """Each optimizer's rates times the recommendation: the constructor's, or the peak a
    schedule moved them to (`peak: true`) when it was built with another (a warm-up from 0)."""
    m = search.recommended
    if m is None:
        return []
    if (peak := _moved_peak_rate(search.baseline, optimizers)) is not None:
        return [{"optimizer": optimizers[0].get("class_name"),
                 "location": optimizers[0].get("location"), "lrs": [peak[0] * m], "peak": True}]  # fmt: skip
    return [
        {
            "optimizer": opt.get("class_name"),
            "location": opt.get("location"),
            "lrs": [None if lr is None else lr * m for lr in opt.get("lrs", [])],
        }
        for opt in optimizers
    ]


def details(search: Search, horizon: int, jobs: int) -> dict:
    optimizers, schedulers = construction(search)
    stable, failing = search.bracket()
    runs = [run_row(r) for r in search.measured()]
    runs += [run_row(r) for r in search.results.values() if r.verdict.verdict == "error"]
    runs += [run_row(r) for r in search.clip_runs]
    runs += [run_row(r) for r in search.alone_runs]
    return {
        "recommended_lr_multiplier": search.recommended,
        "verified": search.verified,
        "conclusion": conclusion_of(search),
        "horizon": horizon,
        "horizon_capped": search.horizon_capped,
        "baseline_failure_step": search.baseline.verdict.failure_step,
        "jobs": jobs,
        "bracket": {"stable": stable, "failing": failing},
        "recommended_lrs": recommended_lrs(search, optimizers),
        "schedulers": [
            {"kind": s.get("class_name"), "location": s.get("location")} for s in schedulers
        ],
        "dose_response_slope": dose_response(search),
        "runs": runs,
        "stopped_early": [{"multiplier": p.multiplier, "steps": n} for p, n in search.stopped],
    }


def summary(search: Search, horizon: int) -> str:
    base = search.baseline.verdict
    conclusion = conclusion_of(search)
    smallest = label(search.grid[-1])
    if conclusion == INSENSITIVE:
        low = search.result_at(search.grid[-1]).verdict
        since = search.baseline.first_step
        return (
            f"not the learning rate: ×1 and ×{smallest} both fail at about the same step "
            f"({base.failure_step} and {low.failure_step}); a {2 ** len(search.grid)}x smaller "
            "learning rate did not move the failure"
            + (f" (from step {since} on: the rate before it was not varied)" if since else "")
        )
    if conclusion == NONE_STABLE:
        return f"no multiplier down to ×{smallest} trained stably for {horizon} steps"
    stable, _ = search.bracket()
    base_lr = run_row(search.baseline)["lr"]
    lr = base_lr * search.recommended if base_lr is not None else None
    check = ", verified stable" if search.verified else ", not verified"
    return (
        f"×1 {base.verdict} ({base.detail}); stable at ×{label(stable)} and below; "
        f"recommended ×{label(search.recommended)} (lr {number(lr)}){check}"
    )


def not_implicated_summary(baseline: RunRecord) -> str:
    return (
        f"×1 trained stably for {baseline.steps} steps ({baseline.verdict.detail}): "
        "the learning rate is not implicated"
    )


def findings(search: Search) -> list[Finding]:
    found = []
    if conclusion_of(search) == LEARNING_RATE:
        found.append(_learning_rate_finding(search))
    clip = search.clip_run
    if (spikes := batch_spikes(search)) is not None:
        found.append(_batch_spikes_finding(search, spikes))
    # A clip that changed no step changed nothing: the run it helped would have trained as it
    # was (a failure that did not repeat), so it is no evidence about gradients.
    elif clip is not None and clip.verdict.verdict == "stable" and clip.clipped_steps:
        found.append(_clip_finding(search, clip))
    return found


def _batch_spikes_finding(search: Search, spikes: BatchSpikes) -> Finding:
    clip, value = spikes.clip, spikes.clip.planned.clip
    at_rates = ", ".join(f"×{label(m)} {jump:.3g}x" for m, jump in sorted(spikes.jumps.items(),
                                                                         reverse=True))  # fmt: skip
    more = len(spikes.steps) - 1
    evidence = (
        f"at step {spikes.step} the gradient norm jumped above its level at every rate: "
        f"{at_rates}" + (f" (and at {more} more such steps)" if more else ""),
        "the candidates resume from the same point and see the same batches: the batch makes "
        "the jump, and a smaller rate only shrinks the update it drives",
        f"×1 with gradients clipped at {value:g}: {clip.verdict.detail}, past step "
        f"{search.baseline.verdict.failure_step} where ×1 failed; its late loss "
        f"{spikes.clip_loss:.4g} against {spikes.rates_loss:.4g} at the best smaller rate",
    )
    return Finding(
        stage=NAME,
        category="exploding_gradients",
        title=f"gradient spikes at the same batches at every learning rate: ×1 trains once "
        f"they are clipped at {value:g}",
        confidence=0.8,
        evidence=evidence,
        fix=(
            "clip gradients before `optimizer.step()`: "
            f"`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={value:g})`; the "
            "learning rate can stay"
        ),
        location=None,
        verified_fix=True,
        remedy={
            "kind": "clip_gradients",
            "max_norm": value,
            "multiplier": 1.0,
            "keeps_the_rate": True,
            "trains_at_the_rate": True,
        },  # fmt: skip
        code="EG503",
    )


def _learning_rate_finding(search: Search) -> Finding:
    base = search.baseline.verdict
    stable, _ = search.bracket()
    measured = search.measured()
    failing = [r for r in measured if r.verdict.failing]
    calm = [r for r in measured if r.verdict.verdict == "stable"]
    evidence = [
        f"×{label(r.multiplier)} (lr {number(run_row(r)['lr'])}): {r.verdict.verdict}, "
        f"{r.verdict.detail}"
        for r in failing
    ]
    evidence.append(
        f"stable for {max(r.steps for r in calm)} steps: "
        + ", ".join(
            f"×{label(r.multiplier)} (lr {number(run_row(r)['lr'])}, {r.verdict.detail})"
            for r in calm[:3]
        )
        + (f" and {len(calm) - 3} smaller" if len(calm) > 3 else "")
    )
    if search.verified:
        evidence.append(f"the recommended ×{label(search.recommended)} was run: stable")
    if (slope := dose_response(search)) is not None and slope < -0.3:
        evidence.append(f"the failure comes later as the learning rate falls (slope {slope:.2g})")
    non_monotone = any(r.verdict.failing and r.multiplier < stable for r in measured)
    confidence = (0.9 if base.verdict == "diverged" else 0.75) - (0.15 if non_monotone else 0.0)
    optimizers, schedulers = construction(search)
    culprit = the_rate_to_lower(search)
    if culprit is not None:
        evidence.extend(_alone_evidence(search, culprit))
    return Finding(
        stage=NAME,
        category="learning_rate",
        title=f"learning rate too high: ×1 {base.verdict}, stable at ×{label(stable)} and below",
        confidence=confidence,
        evidence=tuple(evidence),
        fix=fix_text(search, optimizers, schedulers, culprit),
        location=lr_location(optimizers, schedulers, culprit),
        verified_fix=search.verified,
        code="LR501",
        progress=_smaller_rate_progress(search),
    )


def _smaller_rate_progress(search: Search) -> float | None:
    """How far the loss fell at the largest smaller rate that trains, from step 0 (the
    watched run's steps before the candidates' rewind point included)."""
    training = [r for r in search.measured() if r.multiplier < 1 and _trains(r, search)]
    if not training:
        return None
    reference = max(training, key=lambda r: r.multiplier)
    return progress(search.baseline.losses_before[: reference.first_step] + reference.losses)


_MOVED = 2.0  # a schedule moved the rate when it ran this x above the constructor's

# Schedulers whose own arguments (max_lr, base_lr) set the learning rate, not the optimizer's lr.
_SETS_ITS_OWN_LR = ("OneCycleLR", "CyclicLR")


def lr_location(
    optimizers: list[dict], schedulers: list[dict], culprit: RunRecord | None = None
) -> Location | None:
    """The line to edit: a scheduler that sets the learning rate itself, else the optimizer
    (of several, the one whose rate alone lowered lets the run train)."""
    owner = next((s for s in schedulers if s.get("class_name") in _SETS_ITS_OWN_LR), None)
    if owner is not None and (location := Location.from_dict(owner.get("location"))):
        return location
    if culprit is not None:
        return Location.from_dict(_site_dict(culprit.planned.site))
    return Location.from_dict(optimizers[0].get("location")) if optimizers else None


def the_rate_to_lower(search: Search) -> RunRecord | None:
    """Of several optimizers, the run that lowered one line's rates alone and trained, where
    lowering any other line's alone still failed: that rate is the one the failure needs
    lowered, the others can stay as they are."""
    runs = search.alone_runs
    trained = [r for r in runs if _trains(r, search)]
    others_fail = all(r.verdict.failing for r in runs if r not in trained)
    return trained[0] if len(trained) == 1 and len(runs) >= 2 and others_fail else None


def _alone_evidence(search: Search, culprit: RunRecord) -> list[str]:
    factor = f"×{label(culprit.multiplier)}"
    lines = [f"{factor} on the rate of the optimizer built{_at(_site_dict(culprit.planned.site))} "
             f"alone: {culprit.verdict.verdict}, {culprit.verdict.detail}"]  # fmt: skip
    lines += [f"{factor} on the rate of the one built{_at(_site_dict(r.planned.site))} alone: "
              f"{r.verdict.verdict}, {r.verdict.detail}"
              for r in search.alone_runs if r is not culprit]  # fmt: skip
    return lines


def _site_dict(site: tuple[str, int] | None) -> dict | None:
    return {"file": site[0], "line": site[1]} if site else None


def fix_text(
    search: Search,
    optimizers: list[dict],
    schedulers: list[dict],
    culprit: RunRecord | None = None,
) -> str:
    m = search.recommended
    factor = f"×{label(m)}"
    if not optimizers:
        return f"multiply every learning rate of the script by {m:.3g}"
    # the rates x1 ran at are the step-counting optimizer's: a peak is read with one optimizer
    peak = _moved_peak_rate(search.baseline, optimizers)
    if culprit is not None:
        site = culprit.planned.site
        optimizers = [opt for opt in optimizers if site_of(opt) == tuple(site)] or optimizers
    parts = []
    for opt in optimizers:
        lrs = [lr for lr in opt.get("lrs", []) if lr is not None]
        if not lrs:
            continue
        if peak is not None:
            rate, step = peak
            change = (f"its rate peaked at {rate:.3g} (step {step}; built with lr={lrs[0]:.3g}, "
                      f"the script's schedule moves it): make that peak {rate * m:.3g} ({factor})")  # fmt: skip
        elif len(set(lrs)) == 1:
            change = f"lr={lrs[0] * m:.3g} ({factor} of {lrs[0]:.3g})"
        else:
            new = ", ".join(f"{lr * m:.3g}" for lr in lrs)
            old = ", ".join(f"{lr:.3g}" for lr in lrs)
            change = f"per param group lr={new} ({factor} of {old})"
        parts.append(f"{change} in {opt.get('class_name')}{_at(opt.get('location'))}")
    text = "lower the learning rate: " + "; ".join(parts)
    if culprit is not None:
        text += "; the other optimizers' rates can stay as they are"
    if schedulers:
        kinds = ", ".join(f"{s.get('class_name')}{_at(s.get('location'))}" for s in schedulers)
        text += (
            f"; scale the learning rates the scheduler sets by the same {factor} ({kinds}, "
            "e.g. a max_lr or base_lr argument)"
        )
    return text


def _moved_peak_rate(baseline, optimizers: list[dict]) -> tuple[float, int] | None:
    """(the highest rate x1 ran at, its step) when one optimizer with one rate ran at rates a
    schedule set far from the one it was built with (a warm-up from lr=0): scaling the
    constructor's number would say nothing."""
    if len(optimizers) != 1 or len(set(optimizers[0].get("lrs") or [None])) != 1:
        return None
    built = optimizers[0]["lrs"][0]
    rates = [(max(lrs), baseline.first_step + i) for i, lrs in enumerate(baseline.lrs)
             if lrs and all(lr is not None for lr in lrs)]  # fmt: skip
    if built is None or not rates:
        return None
    rate = max(r for r, _ in rates)
    step = min(s for r, s in rates if r == rate)
    return (rate, step) if rate > _MOVED * built else None


def _at(location: dict | None) -> str:
    loc = Location.from_dict(location)
    return f" at {loc.short()}" if loc else ""


def _clip_finding(search: Search, clip: RunRecord) -> Finding:
    m, value = clip.multiplier, clip.planned.clip
    before = next(
        r for r in search.measured() if same(r.multiplier, m) and r.planned.purpose != CLIP
    )
    lr = run_row(clip)["lr"]
    keep = "" if same(m, 1.0) else f", with the learning rate at ×{label(m)} (lr {number(lr)})"
    looser = [r for r in search.clip_runs if r is not clip]
    first_value = (looser[0] if looser else clip).planned.clip
    evidence = [
        f"×{label(m)} (lr {number(lr)}): {before.verdict.verdict}, {before.verdict.detail}",
        f"clip value {first_value:g} from {search.clip_basis} of the run at "
        f"×{label(search.clip_source)}"
        + (", then 10x tighter while it did not train" if looser else ""),
        *(f"clipped at {r.planned.clip:g}: {r.verdict.verdict}, {r.verdict.detail}"
          for r in looser),
        f"×{label(m)} with gradients clipped at {value:g}: stable for {clip.steps} steps "
        f"({clip.verdict.detail}); clipping changed {clip.clipped_steps} of them",
    ]  # fmt: skip
    if search.exploded is not None:
        evidence.insert(0, f"at ×1 the gradient norm rose from {search.exploded.level:.3g} to "
                           f"{search.exploded.peak:.3g} before the failure")  # fmt: skip
    title = f"gradient spikes: ×{label(m)} trains stably once gradients are clipped at {value:g}"
    confidence = 0.7
    if (recurrent := search.recurrent) is not None:
        # Gradients through a recurrence are products of one Jacobian per time step: they
        # explode at any learning rate that trains, and clipping (Pascanu et al., 2013) keeps
        # the rate that works for the rest of the run. It leads a smaller rate that also helps.
        evidence.insert(0, f"{recurrent['module']} ({recurrent['type']}) is applied "
                           f"{recurrent['chain']} times in a row to its own output")  # fmt: skip
        title = (f"gradients explode through the recurrence of {recurrent['module']}: "
                 f"×{label(m)} trains stably once they are clipped at {value:g}")  # fmt: skip
        confidence = 0.92
    if recurrent is None and (stands_in := _stands_in_for_a_smaller_rate(clip, search)):
        evidence.append(stands_in)
        confidence *= 0.6
    keeps_the_rate = same(m, 1.0) and _keeps_the_rate(clip, search)
    if keeps_the_rate and not _a_smaller_rate_trains(clip, search):
        evidence.append("no smaller learning rate trains: each one either failed or barely "
                        "moved the loss (stalled); clipped at the original rate, the loss fell "
                        f"{progress(clip.losses):.0%}")  # fmt: skip
    elif keeps_the_rate:
        evidence.append("clipped at the original learning rate, on a few steps only, the loss "
                        "falls about as far as at the smaller rate that trains")  # fmt: skip
    return Finding(
        stage=NAME,
        category="exploding_gradients",
        title=title,
        confidence=confidence,
        evidence=tuple(evidence),
        fix=(
            "clip gradients before `optimizer.step()`: "
            f"`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={value:g})`{keep}"
        ),
        location=None,
        verified_fix=True,
        remedy={
            "kind": "clip_gradients",
            "max_norm": value,
            "multiplier": m,
            "keeps_the_rate": keeps_the_rate,
            # clipping alone trains at the original rate (the loss not stalled): with the
            # script's own clipping switched off, turning it on is the fix (ranking.py)
            "trains_at_the_rate": same(m, 1.0)
            and progress(clip.losses) > search.settings.stall_progress,
        },
        # The recurrence claim is a code of its own: how often it is right is measured apart
        # from the clips that also helped elsewhere (codes.measured_confidence).
        code="EG501" if recurrent is None else "EG502",
    )


def _trains(record: RunRecord, search: Search) -> bool:
    """Stable with the loss still falling: a run that survived by barely moving its loss
    (stalled) shows that the rate can be made too small to fail, not that it trains."""
    return (record.verdict.verdict == "stable"
            and progress(record.losses) > search.settings.stall_progress)  # fmt: skip


def _a_smaller_rate_trains(clip: RunRecord, search: Search) -> bool:
    return any(_trains(r, search) and r.multiplier < clip.multiplier for r in search.measured())


def _acts_on_most_steps(clip: RunRecord, settings) -> bool:
    return (clip.clipped_steps or 0) > settings.clip_max_active * max(clip.steps, 1)


def _stands_in_for_a_smaller_rate(clip: RunRecord, search: Search) -> str | None:
    """Why the clip that trained did what a smaller learning rate does, or None. Through a
    recurrence gradients explode at any rate that trains, and clipping is the remedy still;
    when no smaller rate trained either, nothing stands in for the clip. Elsewhere two signs
    say the rate is what drove the failure:
    - the clip bounded more of the updates than rare spikes would (`clip_max_active`): a
      smaller step size by another name;
    - at x1 the gradient norm built up over several steps before the failure (the pattern a
      rate too high gives: each overshoot makes the next gradient larger). Clipping then
      changes few steps only because it cuts that feedback at its first turn."""
    if not _a_smaller_rate_trains(clip, search):
        return None
    if _acts_on_most_steps(clip, search.settings):
        share = search.settings.clip_max_active
        return (f"it shrank {clip.clipped_steps} of {clip.steps} updates (more than {share:.0%}), "
                "as a smaller learning rate would: too many for rare spikes")  # fmt: skip
    if search.baseline.verdict.pattern == "growth":
        return (
            "at ×1 the gradient norm built up over several steps before the failure, as "
            "under a rate too high: clipping cut that growth as a smaller rate does"
        )
    return None


def _keeps_the_rate(clip: RunRecord, search: Search) -> bool:
    """Clipping alone lets the original rate train: it acted on rare spikes, not as a smaller
    step size, and the loss fell at least half as far, relative to where it started, as at
    the largest smaller rate that trains (with none that trains, only stalled or failing
    ones, clipping is what trains). A clip that only holds a stalled run proves nothing."""
    if progress(clip.losses) <= search.settings.stall_progress:
        return False
    if not _a_smaller_rate_trains(clip, search):
        return True  # clipping is what trains
    if _acts_on_most_steps(clip, search.settings):
        return False  # also through a recurrence, as a smaller step size by another name
    if search.recurrent is None and _stands_in_for_a_smaller_rate(clip, search):
        return False
    training = [r for r in search.measured() if _trains(r, search)]
    reference = max(training, key=lambda r: r.multiplier)
    wanted = progress(reference.losses)
    return wanted <= 0 or progress(clip.losses) >= 0.5 * wanted
