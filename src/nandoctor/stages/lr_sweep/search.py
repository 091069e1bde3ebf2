"""Which multipliers to run, which runs to stop, and what the results recommend.

Halving: multipliers 1/2, 1/4, ... 1/2**halvings, in that order except that from step 0 the
smallest goes first (second, beside x1/2, where candidates run in parallel), and from a rewind point it goes next once a candidate failed at about the
step x1 did: if even it fails there, the learning rate is not the cause and the sweep ends
early. Otherwise halving stops at `stable_in_a_row` consecutive stable runs; running
candidates past that point can no longer change the answer and are stopped, unless they started
before the run whose result settled it: a search running one candidate at a time would have
finished them first, and what the sweep concludes from its runs (spikes at the same batches at
several rates) must not depend on which of two parallel runs happened to end first.
Refinement: geometric midpoints between the largest stable multiplier (every smaller one tested
stable too) and the smallest failing one above it. Recommendation: that stable multiplier times
a safety margin (1/sqrt 2 when refined and the horizon reached 1.5x the failure, else 1/2), or
the largest multiplier already run stable at or below that, else run once to verify it. Clip
experiment: a run that failed through spikes rather than steady growth (or at all, in a
recurrent model, after x1's gradient norm exploded, or when x1 failed too soon to tell) is
re-run with gradient clipping; so is x1 when its gradient norm jumped at the steps where the
smaller rates' jumped too (the same batches at every rate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median
from typing import TYPE_CHECKING

from nandoctor.stages.lr_sweep.batch_spikes import jumps_of, shared_jumps, smaller_rates
from nandoctor.stages.lr_sweep.verdicts import Explosion, Verdict

if TYPE_CHECKING:
    from nandoctor.stages.lr_sweep import Settings

HALVING, REFINE, VERIFY, CLIP, DONE = "halving", "refine", "verify", "clip", "done"
ALONE = "alone"  # the recommendation applied to one optimizer's rate, the others' left as built
# A gradient-norm jump this many steps or fewer before x1's failure is what drove it: momentum
# carries one update over the next steps, and the norm itself may be back down by the failure.
_JUMP_LEAD = 5


@dataclass(frozen=True)
class Planned:
    """One candidate: the script with every learning rate times `multiplier`, or only the
    rates of the optimizers built at `site` (file, line), the `optimizer`-th such line."""

    multiplier: float
    purpose: str  # watched | halving | refine | verify | clip | alone
    clip: float | None = None  # max gradient norm, for the clip experiment
    optimizer: int | None = None
    site: tuple[str, int] | None = None

    @property
    def key(self) -> str:
        clip = f"-clip{self.clip:.6g}" if self.clip is not None else ""
        alone = f"-opt{self.optimizer}" if self.optimizer is not None else ""
        return f"m{self.multiplier:.6g}{clip}{alone}"


@dataclass
class RunRecord:
    """What one run showed, as plain values, and its verdict."""

    planned: Planned
    verdict: Verdict
    losses: list[float | None] = field(default_factory=list)
    grad_norms: list[float | None] = field(default_factory=list)
    lrs: list[list[float | None]] = field(default_factory=list)  # per step, per param group
    nonfinite_step: int | None = None
    ended: str = ""
    duration_s: float = 0.0
    optimizers: list[dict] = field(default_factory=list)
    schedulers: list[dict] = field(default_factory=list)
    # A run resumed from a rewind point: its histories start at this step; `verdict` and
    # `nonfinite_step` count from step 0.
    first_step: int = 0
    # The watched run's last steps before `first_step` (gradient norms and rates), the same for
    # every candidate resumed there: what "usual" was at the steps right after the point.
    norms_before: list[float | None] = field(default_factory=list)
    lrs_before: list[list[float | None]] = field(default_factory=list)
    losses_before: list[float | None] = field(default_factory=list)  # all of them, from step 0

    @property
    def multiplier(self) -> float:
        return self.planned.multiplier

    @property
    def steps(self) -> int:
        return len(self.losses)

    @property
    def clipped_steps(self) -> int | None:
        """Steps whose gradient norm (recorded before the clip acts) was above the clip value:
        the steps clipping changed. None for a run without clipping."""
        clip = self.planned.clip
        if clip is None:
            return None
        return sum(1 for g in self.grad_norms if g is not None and not g <= clip * (1 + 1e-6))


# Optimizers built at more lines than this are not tried one by one (a run per line).
_MAX_ALONE = 4


def optimizer_sites(optimizers: list[dict]) -> list[tuple[str, int]]:
    """The lines (file, line) where optimizers with a learning rate were built, in order: one
    line may build a fresh optimizer every round, and lowering its rate is one change."""
    sites = []
    for opt in optimizers:
        site = site_of(opt)
        has_rate = any(lr is not None for lr in opt.get("lrs") or [])
        if has_rate and site is not None and site not in sites:
            sites.append(site)
    return sites


def site_of(optimizer: dict) -> tuple[str, int] | None:
    """(file, line) of the call that built an optimizer record, None where it is unknown."""
    where = optimizer.get("location") or {}
    site = (where.get("file"), where.get("line"))
    return None if None in site else site


def same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)


def round_down(value: float, digits: int = 2) -> float:
    """`value` rounded down to `digits` significant digits: 0.3536 -> 0.35."""
    scale = 10 ** (math.floor(math.log10(value)) - digits + 1)
    return round(math.floor(value / scale + 1e-9) * scale, 12)


def round_down_125(value: float) -> float:
    """The largest 1, 2 or 5 x 10**k not above `value`: a clip value a person would write."""
    power = 10 ** math.floor(math.log10(value))
    return max(step * power for step in (1, 2, 5) if step * power <= value * (1 + 1e-9))


def clip_value(grad_norms: list[float | None], settings: Settings) -> float | None:
    """Clip threshold from a healthy gradient-norm history: the `clip_quantile` of the norms,
    kept between `clip_min_median` and `clip_max_median` times their median."""
    norms = [g for g in grad_norms if g is not None and math.isfinite(g)]
    norms = norms[max(2, len(norms) // 20) :]  # the first steps' norms are transiently large
    if len(norms) < settings.clip_min_steps:
        return None
    middle = median(norms)
    ordered = sorted(norms)
    quantile = ordered[min(len(ordered) - 1, int(settings.clip_quantile * len(ordered)))]
    raw = min(max(quantile, settings.clip_min_median * middle), settings.clip_max_median * middle)
    return round_down_125(raw) if raw > 0 else None


class Search:
    """The sweep's plan; fed finished runs, it says what to start and what to stop."""

    def __init__(
        self,
        settings: Settings,
        baseline: RunRecord,
        horizon_capped: bool,
        recurrent: dict | None = None,
        exploded: Explosion | None = None,
        jobs: int = 1,
    ) -> None:
        self.settings = settings
        self.baseline = baseline
        self.horizon_capped = horizon_capped
        # The watched run's `recurrent` event: weights applied again and again to their own
        # output, whose gradients explode geometrically (clipping is the remedy to try).
        self.recurrent = recurrent
        # The watched run's gradient norm rose by orders of magnitude before it failed: whether
        # clipping alone lets x1 train is the question that tells spikes from a rate too high.
        self.exploded = exploded
        self.grid = [2.0**-k for k in range(1, settings.halvings + 1)]
        order = self.grid
        if baseline.first_step == 0 and len(self.grid) > 2:
            # From step 0 a failing candidate costs as much as the failure took: the smallest
            # multiplier runs early, to tell that the rate does not matter. One at a time it
            # goes first (where it fails as x1 did, the sweep is one candidate); with more
            # jobs, second, beside x1/2. From a rewind point a failing candidate stops soon
            # after the point, and halving down to the smallest costs less than one stable run.
            rest = self.grid[1:-1]
            order = ([self.grid[-1], self.grid[0], *rest] if jobs == 1
                     else [self.grid[0], self.grid[-1], *rest])  # fmt: skip
        self.queue: list[Planned] = [Planned(m, HALVING) for m in order]
        self.running: dict[str, Planned] = {}
        self._started: dict[str, int] = {}  # key -> the order it was started in
        self._last_recorded = -1  # the start order of the last halving run recorded
        self.results: dict[str, RunRecord] = {baseline.planned.key: baseline}
        self.stopped: list[tuple[Planned, int]] = []  # (run, steps it had done)
        self.stage = HALVING
        self.rounds = 0
        self.recommended: float | None = None
        self.clip_runs: list[RunRecord] = []  # each clip tried, loosest first
        # With several optimizers, the recommendation applied to each one's rate alone.
        self.alone_runs: list[RunRecord] = []
        self.clip_source: float | None = None  # the run whose gradient norms set the clip value
        self.clip_basis = "the healthy gradient norms"  # what of that run's norms set it

    # ---- what the sweep loop asks --------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.stage == DONE and not self.running

    def take(self, free: int) -> list[Planned]:
        """Up to `free` candidates to start now."""
        while not self.queue and not self.running and self.stage != DONE:
            self._next_stage()
        started = []
        while self.queue and len(started) < free:
            planned = self.queue.pop(0)
            self.running[planned.key] = planned
            self._started[planned.key] = len(self._started)
            started.append(planned)
        return started

    def record(self, record: RunRecord) -> None:
        if self.running.pop(record.planned.key, None) is None:
            return  # a run that was stopped as no longer needed
        if record.planned.purpose == CLIP:
            self.clip_runs.append(record)
            self._tighter_clip(record)
            return
        if record.planned.purpose == ALONE:
            self.alone_runs.append(record)
            return
        self.results[record.planned.key] = record
        self._last_recorded = self._started.get(record.planned.key, -1)
        if self.stage == HALVING and self._fails_like_the_baseline(record):
            self._smallest_next()
        if self.stage == HALVING and self._halving_settled():
            self.queue = [p for p in self.queue if p.purpose != HALVING]

    def doomed(self) -> list[Planned]:
        """Running candidates that can no longer change the answer and that started after the
        run whose result said so."""
        if self.stage != HALVING:
            return []
        cut = len(self.grid) + 1 if not self._halving_settled() else 0
        streak_end = self._streak_end()
        if streak_end is not None:
            cut = min(cut, streak_end + 1)
        return [p for p in self.running.values()
                if p.purpose == HALVING and self._index(p) >= cut
                and self._started.get(p.key, -1) > self._last_recorded]  # fmt: skip

    def forget(self, planned: Planned, steps_done: int) -> None:
        """A doomed run was stopped: keep it out of the results."""
        if self.running.pop(planned.key, None) is not None:
            self.stopped.append((planned, steps_done))

    def _tighter_clip(self, tried: RunRecord) -> None:
        """A clip that did not train is tried again 10x tighter: people clip well below the
        ordinary gradient norm (1.0 against norms in the hundreds), and a clip at twice that
        norm lets the first huge steps through."""
        value = tried.planned.clip
        if tried.verdict.verdict == "stable" or value is None:
            return
        if len(self.clip_runs) >= self.settings.clip_tries:
            return
        self.queue.append(Planned(tried.multiplier, CLIP, clip=round_down_125(value / 10)))

    @property
    def clip_run(self) -> RunRecord | None:
        """The last clip tried: the one that trained, or the tightest."""
        return self.clip_runs[-1] if self.clip_runs else None

    # ---- conclusions ---------------------------------------------------------------------------
    def measured(self) -> list[RunRecord]:
        """Every finished run with a usable verdict, largest multiplier first (clip run apart)."""
        runs = [r for r in self.results.values() if r.verdict.verdict != "error"]
        return sorted(runs, key=lambda r: -r.multiplier)

    def bracket(self) -> tuple[float | None, float | None]:
        """(largest stable multiplier with every smaller tested one stable too, smallest failing
        multiplier above it)."""
        stable = None
        for record in reversed(self.measured()):
            if record.verdict.failing:
                break
            stable = record.multiplier
        if stable is None:
            return None, None
        failing = [r.multiplier for r in self.measured() if r.verdict.failing]
        above = [m for m in failing if m > stable]
        return stable, (min(above) if above else None)

    def past_saving(self) -> bool:
        """From a rewind point in the second half of the run: the smallest multiplier failed no
        later than x1. Either the failure was set before the point (its updates after it barely
        move the weights) or the rate does not matter at all; only candidates from step 0 can
        tell which (sweep.run starts them). From a point in the first half, most of the updates
        before the failure were varied: the same result says the rate does not matter."""
        step, base = self._smallest_failed_alike(), self.baseline.verdict.failure_step
        if step is None or base is None or not base / 2 < self.baseline.first_step:
            return False
        return step <= base

    def lr_insensitive(self) -> bool:
        """The smallest multiplier fails at about the step the unscaled run failed at."""
        return self._about_the_baseline_failure(self._smallest_failed_alike())

    def _about_the_baseline_failure(self, step: int | None) -> bool:
        base = self.baseline.verdict.failure_step
        if step is None or base is None:
            return False
        return step <= max(self.settings.insensitive_ratio * base, base + 1)

    def _fails_like_the_baseline(self, record: RunRecord) -> bool:
        """Failed the way x1 did at about the same step."""
        return self._about_the_baseline_failure(self._failed_alike(record))

    def _smallest_next(self) -> None:
        """A halving candidate failed at about the step x1 did: the smallest multiplier runs next,
        to tell at once whether the rate matters at all."""
        smallest = [p for p in self.queue if same(p.multiplier, self.grid[-1])]
        self.queue = smallest + [p for p in self.queue if p not in smallest]

    def _smallest_failed_alike(self) -> int | None:
        """The step where the smallest multiplier failed the way x1 did, or None."""
        smallest = self.result_at(self.grid[-1])
        return None if smallest is None else self._failed_alike(smallest)

    def _failed_alike(self, record: RunRecord) -> int | None:
        """The step where `record` failed the way x1 did, or None. A NaN/Inf at x1 is
        reproduced only by a NaN/Inf: a noisy loss at a tiny rate (one sample per step) that a
        smoothing rule calls blown up is no evidence about that failure."""
        verdict = record.verdict
        if not verdict.failing or (self.baseline.verdict.reason == "D1" and verdict.reason != "D1"):
            return None
        return verdict.failure_step

    def result_at(self, multiplier: float) -> RunRecord | None:
        return next((r for r in self.results.values() if same(r.multiplier, multiplier)), None)

    @property
    def verified(self) -> bool:
        if self.recommended is None:
            return False
        run = self.result_at(self.recommended)
        return run is not None and run.verdict.verdict == "stable"

    # ---- stages --------------------------------------------------------------------------------
    def _index(self, planned: Planned) -> int:
        return round(-math.log2(planned.multiplier))

    def _grid_result(self, k: int) -> RunRecord | None:
        return self.result_at(2.0**-k)

    def _streak_end(self) -> int | None:
        """The first index where `stable_in_a_row` finished, stable halvings in a row end."""
        streak = 0
        for k in range(1, len(self.grid) + 1):
            record = self._grid_result(k)
            stable = record is not None and record.verdict.verdict == "stable"
            streak = streak + 1 if stable else 0
            if streak >= self.settings.stable_in_a_row:
                return k
        return None

    def _halving_settled(self) -> bool:
        end = self._streak_end()
        if end is not None and all(self._grid_result(k) for k in range(1, end + 1)):
            return True
        smallest = self._grid_result(len(self.grid))
        if (
            smallest is not None
            and smallest.verdict.failing
            and (self.lr_insensitive() or self._grid_result(1) is not None)
        ):
            # Not even the smallest multiplier trains stably. Where it failed later than x1,
            # x1/2 is still run: how the failure moves with the rate is what tells a rate too
            # high from a failure it only delays.
            return True
        return all(self._grid_result(k) for k in range(1, len(self.grid) + 1))

    def _next_stage(self) -> None:
        """Halving -> refinement rounds -> verification of the recommendation -> each
        optimizer's rate alone -> clip -> done."""
        if self.stage == HALVING:
            self.stage = REFINE
        if self.stage == REFINE:
            if not self.lr_insensitive() and self._plan_refinement():
                return
            self.stage = VERIFY
            self._recommend()
            if self._plan_verification():
                return
        elif self.stage == VERIFY and self.recommended is not None and not self.verified:
            self.recommended = self.bracket()[0]  # the verifying run failed: fall back
        if self.stage == VERIFY:
            self.stage = ALONE
            if self._plan_alone():
                return
        if self.stage == ALONE:
            self.stage = CLIP
            if self._plan_clip():
                return
        self.stage = DONE

    def _plan_alone(self) -> bool:
        """With several optimizers that have a rate, the verified recommendation is run once
        more per optimizer with only that one's rate lowered: which rate the failure needs
        lowered is a fact a run can show (a decoder at 10x its encoder's rate), where which
        gradients grew is not (an encoder's gradients grow with the decoder weights they pass
        through)."""
        sites = optimizer_sites(self.baseline.optimizers)
        if not self.verified or not 2 <= len(sites) <= _MAX_ALONE:
            return False
        self.queue.extend(Planned(self.recommended, ALONE, optimizer=i, site=site)
                          for i, site in enumerate(sites))  # fmt: skip
        return True

    def _plan_refinement(self) -> bool:
        stable, failing = self.bracket()
        if stable is None or failing is None or self.rounds >= self.settings.refine_rounds:
            return False
        ratio = failing / stable
        if ratio <= self.settings.refine_ratio:
            return False
        self.rounds += 1
        points = self.settings.refine_points
        for i in range(1, points + 1):
            self.queue.append(Planned(stable * ratio ** (i / (points + 1)), REFINE))
        return True

    def _recommend(self) -> None:
        stable, failing = self.bracket()
        if stable is None or self.lr_insensitive():
            self.recommended = None
            return
        refined = self.rounds > 0 and failing is not None and failing / stable < 2 - 1e-9
        catapult = "catapult" in self.result_at(stable).verdict.warning
        confident = refined and not self.horizon_capped and not catapult
        target = stable * (self.settings.margin_refined if confident else self.settings.margin)
        # The largest multiplier already run stable at or below the target (x1/4 for 0.354 x
        # 0.7071, or the halving's second stable run) is advice already verified: no run of
        # the full horizon is spent on a value a few percent larger.
        tested = [
            r.multiplier
            for r in self.measured()
            if r.verdict.verdict == "stable" and r.multiplier <= target * (1 + 1e-3)
        ]
        self.recommended = max(tested) if tested else round_down(target)

    def _plan_verification(self) -> bool:
        if not self.settings.verify_recommendation or self.recommended is None:
            return False
        if self.result_at(self.recommended) is not None:
            return False
        self.queue.append(Planned(self.recommended, VERIFY))
        return True

    def _too_short_to_tell(self, record: RunRecord) -> bool:
        """x1 failed within a few steps: too few gradient norms to tell a spike from a growth,
        so whether clipping alone lets it keep its rate is the question to ask."""
        return record is self.baseline and record.steps < self.settings.clip_min_steps

    def _jumped_before_failing(self, record: RunRecord) -> bool:
        """x1's gradient norm jumped in the last steps before it failed (the update that step
        drove is what threw the weights; the norm may be back down by the failure itself), or
        at steps where the smaller rates' jumped too (the same batches at every rate,
        `batch_spikes`). Whether a clip alone lets x1 train is the question that tells a
        spike from a rate too high."""
        if record is not self.baseline or record.verdict.failure_step is None:
            return False
        failed_at = record.verdict.failure_step
        jumps = jumps_of(record, end=failed_at - record.first_step)
        return any(step >= failed_at - _JUMP_LEAD for step in jumps) or bool(
            shared_jumps(record, smaller_rates(record, self.measured()))
        )

    def _plan_clip(self) -> bool:
        """Re-run the largest multiplier that failed through spikes (or failed at all, in a
        recurrent model or after x1's gradient norm exploded) with gradients clipped at a value
        taken from healthy gradient norms: those of the recommended (stable) run, else those of
        the failing run before it failed, else twice the exploded run's early level."""
        if not self.settings.clip_experiment or self.lr_insensitive():
            return False
        spiky = [r for r in self.measured() if r.verdict.failing
                 and (r.verdict.pattern == "spike" or self.recurrent or self.exploded
                      or self._too_short_to_tell(r) or self._jumped_before_failing(r))]  # fmt: skip
        if not spiky:
            return False
        target = max(spiky, key=lambda r: r.multiplier)
        reference = self.result_at(self.recommended) if self.recommended is not None else None
        if reference is not None and reference.verdict.verdict == "stable":
            norms, self.clip_source = reference.grad_norms, reference.multiplier
        else:
            norms = target.grad_norms[: target.verdict.failure_step - target.first_step]
            self.clip_source = target.multiplier
        value = clip_value(norms, self.settings)
        if value is None and self.exploded is not None:
            # too few steps before the explosion for a quantile of them
            level = self.exploded.level
            value = round_down_125(self.settings.clip_min_median * level)
            self.clip_source = 1.0
            self.clip_basis = (
                f"{self.settings.clip_min_median:g}x the early gradient norm {level:.3g}"
            )
        if value is None:
            return False
        self.queue.append(Planned(target.multiplier, CLIP, clip=value))
        return True
