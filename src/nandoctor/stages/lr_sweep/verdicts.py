"""Verdict of one run from its loss and gradient-norm history: diverged, unstable or stable.

Rules (thresholds in `Settings`, defaults in parentheses). The loss is smoothed with a
bias-corrected EMA whose memory scales with the horizon H; the initial loss is the median of
the first k0 = min(5, H/10) losses, or the very first loss (taken before any update) if lower.
- D1 diverged: a NaN/Inf reached the loss, a gradient or a parameter.
- D2 diverged: the smoothed loss rose above `blowup_factor` (4) x its best so far, and above
  `blowup_min_fraction` (0.5) x the initial loss (a bounce near zero is not a blow-up), with
  the median of the raw losses of that step and the two after it (those there are, at the end
  of a run) above that factor too (one batch far out in a heavy tail lifts the average for
  many steps), unless the whole run recovered: it ends below the initial loss and within that
  factor of its best.
- D3 diverged: the run ended with the smoothed loss above `runaway_factor` (1.5) x the initial,
  and above it by more than `runaway_sigmas` (2) sigmas of the loss's minibatch noise, with the
  median of the raw losses of the last max(3, H/10) steps above that factor too.
- U1 unstable: in the first max(3, H/10) steps, a jump above `big_spike_ratio` (2) x the first
  loss, and by more than `spike_sigmas` robust sigmas of the run's step-to-step changes (not
  minibatch noise), that never came back below it; later, two loss spikes (above the level of the previous
  steps by `spike_sigmas` (6) robust sigmas of their step-to-step changes, and by
  `spike_ratio` (1.25) x), or one spike of `big_spike_ratio` x after which neither the smoothed
  loss nor the median of the raw losses came back to where the smoothed loss was before the
  spike within max(10, H/10) steps. On runs longer than
  200 steps the spikes needed grow to `spikes_per_step` (1 %) of the steps. A spike counts only
  when the next step is above the threshold too (`lasting`): a one-step spike that leaves the
  next batch at its usual level is that batch's (a heavy-tailed loss), at any rate. An early
  rise that ends below the first loss is the catapult phase: stable, with a warning.
- U2 unstable: the loss grows over the second half (Theil-Sen slope > 0) and its last quarter
  sits above `growth_factor` (1.25) x the best smoothed loss, and above it by more than
  `runaway_sigmas` sigmas of the minibatch noise.
- U3 unstable: the gradient norm of the last quarter is `grad_growth_factor` (10) x that of the
  first quarter, or `grad_spikes` (3) gradient-norm spikes (6 sigmas and 3x the level; more
  on long runs, and lasting, as for U1). Not in a run whose gradients the sweep clipped: the norm is
  recorded before the clip, which bounds what the update takes of it, so only the loss tells
  whether that run trains.
- U4 unstable: a GradScaler skipped more than max(`scaler_min_skips`, `scaler_skip_fraction`
  x steps) steps after `scaler_calibration_steps`, or its scale fell below 1.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import median
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nandoctor.stages.lr_sweep import Settings

_MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Verdict:
    verdict: str  # diverged | unstable | stable | error
    reason: str  # D1..D3, U1..U4; "" when stable; "error"
    detail: str  # one phrase for the table and the evidence
    failure_step: int | None = None  # the step the rule fired at
    pattern: str | None = None  # failing runs: "spike" (sudden) or "growth" (steady)
    warning: str = ""  # stable runs: the catapult phase, or a stalled loss

    @property
    def failing(self) -> bool:
        return self.verdict in ("diverged", "unstable")


def ema(values: list[float], beta: float) -> list[float]:
    """Bias-corrected exponential moving average (as in the LR range tests of fastai/Lightning)."""
    out, average = [], 0.0
    for t, value in enumerate(values, 1):
        average = beta * average + (1 - beta) * value
        out.append(average / (1 - beta**t))
    return out


def robust_sigma(values: list[float]) -> float:
    center = median(values)
    return _MAD_TO_SIGMA * median(abs(v - center) for v in values)


def change_sigma(values: list[float]) -> float:
    """Robust sigma of the step-to-step changes: the series' noise, which a trend does not
    inflate."""
    return robust_sigma([b - a for a, b in zip(values, values[1:], strict=False)])


def loss_noise(values: list[float]) -> float:
    """The minibatch noise of one loss: that of a step-to-step change over sqrt 2."""
    return change_sigma(values) / math.sqrt(2)


def theil_sen(values: list[float]) -> float:
    """Median of the pairwise slopes: a trend that one outlier cannot fake."""
    slopes = [
        (values[j] - values[i]) / (j - i)
        for i in range(len(values))
        for j in range(i + 1, len(values))
    ]
    return median(slopes) if slopes else 0.0


def spike_steps(
    values: list[float], sigmas: float, ratio: float, window: int
) -> list[tuple[int, float]]:
    """(step, level before it) of each value that jumps above its recent level by `sigmas`
    robust sigmas of the step-to-step changes (a trend is not noise) and by `ratio` x."""
    found = []
    for t in range(8, len(values)):
        level, threshold = _spike_threshold(values, t, sigmas, ratio, window)
        if values[t] > threshold:
            found.append((t, level))
    return found


def _spike_threshold(
    values: list[float], t: int, sigmas: float, ratio: float, window: int
) -> tuple[float, float]:
    """(level, threshold) of the steps before step t: their recent median, and what a value must
    exceed to be a spike (`sigmas` robust sigmas of their changes above it, and `ratio` x it)."""
    before = values[max(0, t - window) : t]
    level = median(before[-5:])
    return level, max(level + sigmas * change_sigma(before), ratio * abs(level))


def lasting(
    values: list[float], found: list[tuple[int, float]], sigmas: float, ratio: float, window: int
) -> list[tuple[int, float]]:
    """The spikes of `found` whose next step was still above the threshold: the update it drove
    moved the weights far enough to show on the next batch. A one-step spike that leaves the
    next batch at its usual level is that batch's (a heavy-tailed loss: a crowded image, a rare
    long sequence); a rate too high shows in what the update does after it. A spike at the last
    step cannot be told and counts."""
    return [(t, level) for t, level in found if t + 1 >= len(values)
            or values[t + 1] > _spike_threshold(values, t, sigmas, ratio, window)[1]]  # fmt: skip


def failure_pattern(grad_norms: list[float | None]) -> str | None:
    """How the gradient norm behaved up to a failure: "growth" when it kept growing, "spike"
    when a steady history ended in a sudden jump, None when neither (or too short to tell)."""
    g = [x for x in grad_norms if x is not None and math.isfinite(x)]
    if len(g) < 6:
        return None
    history = g[:-1]
    quarter = max(2, len(history) // 4)
    if median(history[-quarter:]) >= 3 * median(history[:quarter]):
        return "growth"
    center = median(history)
    jumped = g[-1] > 3 * center and g[-1] > center + 6 * robust_sigma(history)
    return "spike" if jumped else None


@dataclass(frozen=True)
class Explosion:
    """The gradient norm rose from `level` (its median over the first third of the steps) to
    `peak` before a failure."""

    level: float
    peak: float


def gradient_explosion(grad_norms: list[float | None], factor: float) -> Explosion | None:
    """The finite gradient norms of a failing run rose `factor` x above their early level: the
    updates that preceded the failure were driven by exploding gradients, whatever drove them."""
    g = [x for x in grad_norms if x is not None and math.isfinite(x)]
    if len(g) < 2:
        return None
    level, peak = median(g[: max(1, len(g) // 3)]), max(g)
    return Explosion(level, peak) if level > 0 and peak >= factor * level else None


def classify(
    losses: list[float | None],
    grad_norms: list[float | None],
    settings: Settings,
    *,
    horizon: int,
    nonfinite_step: int | None = None,
    skipped_steps: int = 0,
    min_scale: float | None = None,
    clipped: bool = False,
    first_step: int = 0,
) -> Verdict:
    """The verdict of one (possibly partial) run; every rule is documented in the module.
    The histories start at step `first_step` (a run resumed from a rewind point); the verdict's
    failure step, and the step its detail names, count from step 0."""
    verdict = _judged(losses, grad_norms, settings, horizon, nonfinite_step, skipped_steps,
                      min_scale, clipped)  # fmt: skip
    if verdict.failure_step is None:
        return verdict
    step = verdict.failure_step + first_step
    return dataclasses.replace(verdict, failure_step=step, detail=verdict.detail.format(step=step))


def _judged(losses, grad_norms, settings, horizon, nonfinite_step, skipped_steps, min_scale,
            clipped) -> Verdict:  # fmt: skip
    """`classify` on steps counted from the histories' start; a detail names the failure step
    as `{step}`."""
    if nonfinite_step is not None:
        detail = "NaN/Inf at step {step}"
        return Verdict("diverged", "D1", detail, nonfinite_step, failure_pattern(grad_norms))
    values = [v for v in losses if v is not None]
    bad = next((t for t, v in enumerate(values) if not math.isfinite(v)), None)
    if bad is not None:
        return Verdict("diverged", "D1", "NaN/Inf at step {step}", bad, "growth")
    grads = [g for g in grad_norms if g is not None and math.isfinite(g)]
    if not values and not grads:
        return Verdict("error", "error", "no optimizer step completed")
    for rule in (_blow_up, _runaway, _early_rise, _spikes, _growth):
        verdict = rule(values, grads, settings, horizon)
        if verdict is not None and not (
            verdict.reason == "D2" and _recovered(values, settings, horizon)
        ):
            return verdict
    verdict = (None if clipped else _gradient_rules(grads, settings)) or _scaler_rules(
        len(values), skipped_steps, min_scale, settings
    )
    if verdict is not None:
        return verdict
    return Verdict(
        "stable", "", _stable_detail(values), warning=_warning(values, settings, horizon)
    )


def _start(values: list[float], horizon: int) -> tuple[int, float]:
    """k0, and the initial loss: the median of the first k0 steps, or the very first loss
    (taken before any update, so the same in every run) when a large step already pushed the
    others up."""
    k0 = max(1, min(5, math.ceil(horizon / 10)))
    return k0, min(values[0], median(values[:k0]))


def _smooth(values: list[float], horizon: int) -> list[float]:
    beta = min(0.98, max(0.8, 1 - 10 / max(horizon, 1)))
    return ema(values, beta)


_PERSIST = 3  # steps from a blow-up whose median must be blown up too


def _blow_up(values, grads, settings, horizon, *, partial: bool = False) -> Verdict | None:
    """D2. The smoothed loss far above its best, and the raw losses there too: one batch far
    out in a heavy tail lifts the average for many steps, but the median of it and the steps
    after it is ordinary. A blow-up in the last steps of a finished run counts; in a run still
    going (`partial`) it waits for those steps."""
    if len(values) < 2:
        return None
    k0, initial = _start(values, horizon)
    smooth = _smooth(values, horizon)
    nonneg = min(values) >= 0
    sigma = change_sigma(values) or 0.0
    best = math.inf
    for t in range(k0, len(smooth)):
        best = min(best, smooth[t])
        if nonneg:
            blown = (
                smooth[t] > settings.blowup_factor * best
                and smooth[t] > settings.blowup_min_fraction * initial
            )
        else:
            blown = smooth[t] - best > 3 * max(initial - best, 10 * sigma, 1e-12)
        if blown and _persists(values[t : t + _PERSIST], best, settings, partial):
            ratio = f"{smooth[t] / best:.3g}x its best" if best > 0 else "far above its best"
            return Verdict("diverged", "D2", f"smoothed loss {ratio} at step {{step}}", t,
                           failure_pattern(grads[: t + 1]))  # fmt: skip
    return None


def _persists(window: list[float], best: float, settings: Settings, partial: bool) -> bool:
    """The raw losses from the blow-up on are blown up too. Near the end of a finished run,
    the steps there are what is judged: the smoothed loss still carries one far-out batch many
    steps later, so an ordinary last step is no blow-up."""
    if len(window) < _PERSIST and partial:
        return False
    if not window or best <= 0:
        return True
    return median(window) > settings.blowup_factor * best


def _recovered(values: list[float], settings: Settings, horizon: int) -> bool:
    """A whole run whose blow-up was transient: by its end the smoothed loss is back below
    where it started and within `blowup_factor` of its best (a catapult, not a divergence)."""
    smooth = _smooth(values, horizon)
    _, initial = _start(values, horizon)
    return smooth[-1] < initial and smooth[-1] <= settings.blowup_factor * min(smooth)


def _runaway(values, grads, settings, horizon) -> Verdict | None:
    if not values:
        return None
    k0, initial = _start(values, horizon)
    if len(values) < 2 * k0 + 2 or min(values) < 0:
        return None
    smooth = _smooth(values, horizon)
    if smooth[-1] <= settings.runaway_factor * initial:
        return None
    # One batch far out in a heavy tail lifts the smoothed loss for many steps: the last raw
    # losses must sit up there too.
    last = values[-max(3, math.ceil(horizon / 10)) :]
    if median(last) <= settings.runaway_factor * initial:
        return None
    # Minibatch noise is no runaway: the initial loss is one or a few draws, and a run whose
    # weights barely move (a tiny learning rate) ends above a low first draw as often as not.
    if smooth[-1] - initial <= settings.runaway_sigmas * loss_noise(values):
        return None
    t = len(smooth) - 1
    while t > 0 and smooth[t - 1] > settings.runaway_factor * initial:
        t -= 1
    detail = f"loss ended {smooth[-1] / initial:.3g}x above where it started"
    return Verdict("diverged", "D3", detail, t, failure_pattern(grads))


def _early_rise(values, grads, settings, horizon) -> Verdict | None:
    """U1 for the first steps, before the spike rule has a history: the loss jumped above
    `big_spike_ratio` x its first value and never came back below that first value."""
    if len(values) < 3 or values[0] <= 0:
        return None
    early = max(3, len(values) // 10)
    peak_at = max(range(1, min(early, len(values))), key=lambda t: values[t])
    if values[peak_at] <= settings.big_spike_ratio * values[0]:
        return None
    # Minibatch noise is no jump: it must also stand out of the run's step-to-step changes (a
    # loss that has not moved at a tiny learning rate still varies batch to batch).
    if values[peak_at] - values[0] <= settings.spike_sigmas * change_sigma(values):
        return None
    if _smooth(values, horizon)[-1] < values[0]:
        return None  # it recovered: `_warning` notes the early rise
    detail = (
        f"loss jumped to {values[peak_at] / values[0]:.3g}x its start at step {{step}} "
        "and never came back below it"
    )
    return Verdict("unstable", "U1", detail, peak_at, "spike")


def _spikes(values, grads, settings, horizon) -> Verdict | None:
    found = spike_steps(values, settings.spike_sigmas, settings.spike_ratio, settings.spike_window)
    if not found:
        return None
    smooth = _smooth(values, horizon)
    recovery = max(10, horizon // 10)
    unrecovered = []
    for t, level in found:
        after = smooth[t + 1 : t + 1 + recovery]
        judged = len(after) >= min(recovery, 3)  # a spike at the very end cannot be judged
        big = values[t] >= settings.big_spike_ratio * abs(level)
        if big and judged and not _recovered_from(values, smooth, t, recovery):
            unrecovered.append(t)
    needed = _spikes_needed(2, len(values), settings)
    found = lasting(values, found, settings.spike_sigmas, settings.spike_ratio,
                    settings.spike_window)  # fmt: skip
    if len(found) < needed and not unrecovered:
        return None
    t = unrecovered[0] if unrecovered else found[needed - 1][0]
    what = "a loss spike that did not recover" if unrecovered else f"{len(found)} loss spikes"
    return Verdict("unstable", "U1", f"{what} (step {{step}})", t, "spike")


def _recovered_from(values: list[float], smooth: list[float], t: int, recovery: int) -> bool:
    """The loss came back to where it was before the spike at `t`. Smoothed against smoothed:
    on a noisy loss the average sits above the median of the steps before the spike, and would
    never come back below that level. Or the raw losses after it, by their median: one batch
    far out in a heavy tail lifts the average for many steps though the steps after it are
    ordinary again (a plateau stays up in both)."""
    after = values[t + 1 : t + 1 + recovery]
    return any(s <= smooth[t - 1] for s in smooth[t + 1 : t + 1 + recovery]) or (
        bool(after) and median(after) <= smooth[t - 1]
    )


def _growth(values, grads, settings, horizon) -> Verdict | None:
    if len(values) < 8:
        return None
    k0, _ = _start(values, horizon)
    smooth = _smooth(values, horizon)
    half, quarter = len(values) // 2, max(2, len(values) // 4)
    best = min(smooth[k0:])
    late = median(values[-quarter:])
    # Minibatch noise is no growth: the rise must stand out of the loss's step-to-step noise
    # (at a tiny learning rate the loss varies batch to batch around where it started).
    if late - best <= settings.runaway_sigmas * loss_noise(values):
        return None
    if theil_sen(smooth[half:]) > 0 and late > settings.growth_factor * best:
        detail = f"loss grew to {late / best:.3g}x its best without recovering"
        return Verdict("unstable", "U2", detail, len(values) - quarter, "growth")
    return None


def _gradient_rules(grads: list[float], settings: Settings) -> Verdict | None:
    if len(grads) < 8:
        return None
    quarter = max(2, len(grads) // 4)
    early, late = median(grads[1 : quarter + 1]), median(grads[-quarter:])
    if early > 0 and late > settings.grad_growth_factor * early:
        detail = f"gradient norm grew {late / early:.3g}x"
        return Verdict("unstable", "U3", detail, len(grads) - quarter, "growth")
    found = spike_steps(grads, settings.spike_sigmas, 3.0, settings.spike_window)
    found = lasting(grads, found, settings.spike_sigmas, 3.0, settings.spike_window)
    needed = _spikes_needed(settings.grad_spikes, len(grads), settings)
    if len(found) >= needed:
        detail = f"{len(found)} gradient-norm spikes"
        return Verdict("unstable", "U3", detail, found[needed - 1][0], "spike")
    return None


def _spikes_needed(count: int, steps: int, settings: Settings) -> int:
    """Spikes that make a run unstable: `count`, or on a long run `spikes_per_step` of its
    steps, whichever is more."""
    return max(count, math.ceil(settings.spikes_per_step * steps))


def _scaler_rules(steps: int, skipped: int, min_scale, settings: Settings) -> Verdict | None:
    if steps <= settings.scaler_calibration_steps:
        return None
    if skipped > max(settings.scaler_min_skips, settings.scaler_skip_fraction * steps):
        return Verdict("unstable", "U4", f"GradScaler skipped {skipped} steps", None, "spike")
    if min_scale is not None and min_scale < 1:
        return Verdict("unstable", "U4", f"GradScaler scale fell to {min_scale:.3g}", None, "spike")
    return None


def _stable_detail(values: list[float]) -> str:
    if not values:
        return "finite throughout"
    return f"loss {values[0]:.3g} -> {values[-1]:.3g}"


def _warning(values: list[float], settings: Settings, horizon: int) -> str:
    if len(values) < 4:
        return ""
    _, initial = _start(values, horizon)
    smooth = _smooth(values, horizon)
    early = max(3, len(values) // 10)
    if max(values[1:early]) > settings.spike_ratio * values[0] and smooth[-1] < values[0]:
        return "early rise that recovered (catapult phase)"
    if initial and (initial - smooth[-1]) / abs(initial) < settings.stall_progress:
        return "loss barely moved (stalled)"
    return ""


def progress(losses: list[float | None]) -> float:
    """How far the smoothed loss fell over a run, as a fraction of where it started."""
    values = [v for v in losses if v is not None and math.isfinite(v)]
    if len(values) < 2:
        return 0.0
    _, initial = _start(values, len(values))
    final = _smooth(values, len(values))[-1]
    return (initial - final) / abs(initial) if initial else 0.0


def blew_up(losses: list[float | None], settings: Settings, horizon: int) -> bool:
    """D1 or D2 on a partial history: the run has diverged and need not go on."""
    values = [v for v in losses if v is not None]
    if any(not math.isfinite(v) for v in values):
        return True
    return _blow_up(values, [], settings, horizon, partial=True) is not None
