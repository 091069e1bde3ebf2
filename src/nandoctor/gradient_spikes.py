"""A gradient cliff in the watched run: one step whose gradient norm jumped by orders of
magnitude above a steady history.

This is the signature of exploding gradients (Pascanu et al., 2013: a steep "cliff" of the loss
surface, met through a recurrence, a deep product of Jacobians or a rare batch), and it tells
them apart from a learning rate that is too high. When the rate is too high, each update
overshoots and makes the next gradient larger: the gradient norm builds up over several steps
by a factor per step, and a 100x jump comes only after steps that already grew. At a cliff
the steps before were ordinary, so the weights had moved by ordinary amounts: the jump comes
from the landscape or the batch, not from the updates. And the slope jumps out of proportion
to the height: an overshooting update raises the loss about as much as its gradient (a
quadratic bowl: the loss with the square of the gradient), while at a cliff the gradient jumps
far more than the loss does. The one huge update it drives throws the weights far away, and
the NaN/Inf comes a step or a few later. The remedy keeps the
learning rate and bounds the step: gradient clipping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

from nandoctor.report.model import Finding, Location

JUMP_FACTOR = 100.0  # a step's gradient norm this many times the median of the steps before it
_STEADY_FACTOR = 10.0  # ... while every one of those steps was within this factor of it
_OUT_OF_PROPORTION = 10.0  # ... and this many times more than the loss of that step jumped
_WINDOW = 20  # the steps before a jump that say what "usual" is
_MIN_HISTORY = 3  # steps of history needed before a jump can be judged


@dataclass(frozen=True)
class Cliff:
    step: int
    norm: float  # the gradient norm of that step
    level: float  # the median gradient norm of the steps before it
    low: float  # the smallest and largest norms of those steps
    high: float
    loss: float  # the loss of that step
    loss_jump: float  # that loss over the median loss of the steps before it
    clip: float  # a clip value from the ordinary norms before the jump


def finite_number(value) -> bool:
    """A recorded loss or gradient norm that is a finite number (not None, NaN or Inf)."""
    return isinstance(value, (int, float)) and math.isfinite(value)


def find_cliff(grad_norms, losses, failed_step: int | None) -> Cliff | None:
    """The first step before the failure whose gradient norm jumped `JUMP_FACTOR` x above its
    usual level, or None. Only the first jump is judged: one that came after norms had already
    been growing is divergence built up over the updates, not a cliff."""
    end = min(len(grad_norms), failed_step if failed_step is not None else len(grad_norms))
    for step in range(_MIN_HISTORY, end):
        norms = [g for g in grad_norms[max(0, step - _WINDOW) : step] if finite_number(g)]
        if len(norms) < _MIN_HISTORY:
            continue
        level, norm = median(norms), grad_norms[step]
        if not finite_number(norm):
            return None  # a non-finite norm has no proportion to the loss to judge
        if level <= 0 or norm < JUMP_FACTOR * level:
            continue
        if not all(level / _STEADY_FACTOR <= g <= _STEADY_FACTOR * level for g in norms):
            return None  # the norms were already moving: no steady level to jump from
        loss_jump = _loss_jump(losses, step)
        if loss_jump is None or norm < _OUT_OF_PROPORTION * max(1.0, loss_jump) * level:
            return None  # the loss jumped as much: an overshooting update, not a cliff
        loss = losses[step]
        return Cliff(step, norm, level, min(norms), max(norms), loss, loss_jump,
                     clip_value_from(norms))  # fmt: skip
    return None


def _loss_jump(losses, step: int) -> float | None:
    """The loss of `step` over the median loss of the steps before it; None when it cannot be
    told (a non-finite loss, or losses that are not all positive)."""
    prior = [v for v in losses[max(0, step - _WINDOW) : step] if finite_number(v)]
    if step >= len(losses) or not finite_number(losses[step]) or len(prior) < _MIN_HISTORY:
        return None
    if losses[step] <= 0 or min(prior) <= 0:
        return None
    return losses[step] / median(prior)


def clip_value_from(norms: list[float]) -> float:
    """Twice the usual gradient norm, rounded down to 1, 2 or 5 x 10**k: a value a person would
    write, above every ordinary step and far below the jump."""
    from nandoctor.stages.lr_sweep.search import round_down_125

    return round_down_125(2 * median(norms))


def cliff_finding(cliff: Cliff, optimizer_location: Location | None) -> Finding:
    return Finding(
        stage="diagnosis",
        category="exploding_gradients",
        title=f"the gradient norm jumped {cliff.norm / cliff.level:.3g}x in one step (step "
        f"{cliff.step}), after steady steps",
        confidence=0.8,
        evidence=(
            f"step {cliff.step}: gradient norm {cliff.norm:.4g}, against a median of "
            f"{cliff.level:.4g} over the steps before it",
            f"its loss {cliff.loss:.4g} was {cliff.loss_jump:.3g}x their median: the gradient "
            "jumped far more than the loss, as at a cliff of the loss surface",
            f"the steps before it stayed between {cliff.low:.4g} and {cliff.high:.4g}: the jump "
            "came in one step, not built up by growing updates as a rate too high does",
            "the update it drove came before the first NaN/Inf",
        ),
        fix=(
            "clip gradients before each update: "
            f"`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={cliff.clip:g})` "
            "(above the ordinary steps' norms); the learning rate can stay"
        ),
        location=optimizer_location,
        remedy={"kind": "clip_gradients", "max_norm": cliff.clip},
        code="EG602",
    )
