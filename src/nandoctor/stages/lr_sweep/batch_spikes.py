"""Gradient spikes that belong to batches, not to the learning rate.

When the rate is too high, each update overshoots and makes the next gradient larger: the
gradient norm grows with the updates, and at a rate a few times smaller it stays level. When
the loss surface has cliffs (a deep product of Jacobians, a polynomial of the inputs, a rare
hard batch), the gradient of certain batches is many times the usual whatever the rate, because
the weights at that step are about the same at every small rate: the candidates resume from
the same rewind point and see the same batches in the same order, so the same step jumps in
every one of them. A smaller rate then only shrinks the update each jump drives; gradient
clipping bounds that update and keeps the rate (Pascanu et al., 2013). The claim needs both:
the same steps jump at x1 and at rates at least 4x smaller, and x1 with gradients clipped
carries the run past the step where it failed, its loss ending about as low as at the smaller
rates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING

from nandoctor.gradient_spikes import finite_number

if TYPE_CHECKING:  # the search asks `shared_jumps` whether to try a clip: no import cycle
    from nandoctor.stages.lr_sweep.search import RunRecord, Search

JUMP = 5.0  # a step's gradient norm this many times the median of the steps before it
WINDOW = 10  # the steps before a step that say what "usual" is
_MIN_HISTORY = 5  # ... at least this many of them
_RATES_NEEDED = 2  # smaller rates that jump at the same step as x1 ...
_SMALLEST_NEEDED = 0.25  # ... one of them at most this multiple of x1
_AS_LOW = 1.2  # a clipped x1 trains when its late loss is at most this x the smaller rates' best
_LATE = 5  # the last steps whose median is a run's late loss
_RATE_ROSE = 1.5  # a jump where the rate rose this x above its window's median is the rate's


@dataclass(frozen=True)
class BatchSpikes:
    step: int  # the first step where x1 and the smaller rates all jumped
    jumps: dict[float, float]  # multiplier -> its jump at that step (its norm over its level)
    steps: tuple[int, ...]  # every such step
    clip: RunRecord  # x1 with gradients clipped, past the failure
    clip_loss: float  # its late loss
    rates_loss: float  # the best late loss of the smaller rates


def jumps_of(
    record: RunRecord, end: int | None = None, before: RunRecord | None = None
) -> dict[int, float]:
    """{absolute step: its gradient norm over the median of the steps before it} for each step
    of `record` (up to index `end`) whose norm jumped `JUMP` x above them, unless the learning
    rate itself rose there: a schedule that steps the rate up makes every candidate jump at
    the same step, and that is the rate's doing, not a batch's. A run resumed from a rewind
    point measures its first steps against the watched run's steps before the point
    (`before`'s, else its own): they are its history too, so a jump right after the point
    counts wherever the point fell."""
    lead = before if before is not None else record
    norms = lead.norms_before + record.grad_norms[:end]
    rates = [_peak(lrs) for lrs in lead.lrs_before + record.lrs]
    offset = record.first_step - len(lead.norms_before)
    found = {}
    for i in range(max(_MIN_HISTORY, len(lead.norms_before)), len(norms)):
        prior = [g for g in norms[max(0, i - WINDOW) : i] if finite_number(g)]
        if len(prior) < _MIN_HISTORY or not finite_number(norms[i]):
            continue
        level = median(prior)
        if level > 0 and norms[i] >= JUMP * level and not _rate_rose(rates, i):
            found[offset + i] = norms[i] / level
    return found


def _peak(lrs) -> float | None:
    values = [lr for lr in lrs or () if finite_number(lr)]
    return max(values) if values else None


def _rate_rose(rates: list[float | None], i: int) -> bool:
    """The learning rate at step `i` (or the step before, whose update made its weights) is
    `_RATE_ROSE` x the median rate of the window before."""
    prior = [r for r in rates[max(0, i - WINDOW) : max(0, i - 1)] if r is not None]
    recent = [r for r in rates[max(0, i - 1) : i + 1] if r is not None]
    return bool(prior and recent) and max(recent) > _RATE_ROSE * median(prior)


def late_loss(record: RunRecord) -> float | None:
    values = [v for v in record.losses if finite_number(v)]
    return median(values[-_LATE:]) if values else None


def smaller_rates(baseline: RunRecord, measured: list[RunRecord]) -> list[RunRecord]:
    """The unclipped candidates below x1 that started where x1's record starts (same batches
    at the same steps)."""
    return [r for r in measured if r.planned.clip is None and r.multiplier < 1
            and r.first_step == baseline.first_step]  # fmt: skip


def shared_jumps(baseline: RunRecord, smaller: list[RunRecord]) -> dict[int, dict[float, float]]:
    """{step: {multiplier: its jump}} for each step before x1's failure where x1's gradient norm
    jumped and so did that of at least `_RATES_NEEDED` smaller rates, one of them at most
    `_SMALLEST_NEEDED` x."""
    failed_at = baseline.verdict.failure_step
    if failed_at is None:
        return {}
    at_one = jumps_of(baseline, end=failed_at - baseline.first_step)
    their_jumps = {r.multiplier: jumps_of(r, before=baseline) for r in smaller}
    shared = {}
    for step in sorted(at_one):
        rates = {m: found[step] for m, found in their_jumps.items() if step in found}
        if len(rates) >= _RATES_NEEDED and min(rates) <= _SMALLEST_NEEDED:
            shared[step] = {1.0: at_one[step], **rates}
    return shared


def batch_spikes(search: Search) -> BatchSpikes | None:
    """The evidence that gradient spikes, not the rate, broke x1, or None."""
    smaller = smaller_rates(search.baseline, search.measured())
    shared = shared_jumps(search.baseline, smaller)
    if not shared:
        return None
    trained = _clipped_past_the_failure(search, smaller, search.baseline.verdict.failure_step)
    if trained is None:
        return None
    clip, clip_loss, rates_loss = trained
    first = min(shared)
    return BatchSpikes(first, shared[first], tuple(sorted(shared)), clip, clip_loss, rates_loss)


def _clipped_past_the_failure(
    search: Search, smaller: list[RunRecord], failed_at: int
) -> tuple[RunRecord, float, float] | None:
    """(the clipped x1 run with the lowest late loss, that loss, the smaller rates' best) when
    one ran past x1's failure without diverging and ends about as low as the smaller rates."""
    rates = [loss for r in smaller if r.verdict.verdict != "diverged"
             and (loss := late_loss(r)) is not None]  # fmt: skip
    clipped = [(r, loss) for r in search.clip_runs
               if math.isclose(r.multiplier, 1.0) and r.verdict.verdict in ("stable", "unstable")
               and r.first_step + r.steps > failed_at and (loss := late_loss(r)) is not None]  # fmt: skip
    if not rates or not clipped:
        return None
    best_rate = min(rates)
    clip, loss = min(clipped, key=lambda pair: pair[1])
    if loss > best_rate + (_AS_LOW - 1) * abs(best_rate):
        return None
    return clip, loss, best_rate
