"""lr_sweep stage: re-run the script with every learning rate halved, and halved again, until
it trains stably; recommend the largest stable multiplier with a safety margin.

Each candidate is a fresh child run of the unmodified script (same seed, its writes sent to a
scratch folder) whose learning rates are multiplied around each optimizer step by global step
hooks (`nandoctor.instrument.lr_scaling`), so schedules and per-group ratios keep their shape.
The verdict rules are in `verdicts`, the search in `search`, parallel runs in `runs`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from nandoctor.errors import ConfigError
from nandoctor.report.model import StageResult
from nandoctor.stages import StageContext, StageOutcome

NAME = "lr_sweep"

# (setting, lowest, highest, flag that sets it): checked when a profile or config is loaded.
_BOUNDS = {
    "halvings": (1, 20, "--halvings"),
    "jobs": (0, 256, "--jobs"),
    "max_jobs": (1, 256, None),
    "max_steps": (1, 1_000_000, "--steps"),
    "min_steps": (1, 1_000_000, None),
    "stable_in_a_row": (1, 20, None),
    "refine_rounds": (0, 10, None),
    "refine_points": (1, 16, None),
    "margin": (1e-6, 1.0, None),
    "margin_refined": (1e-6, 1.0, None),
    "clip_quantile": (0.0, 1.0, None),
    "clip_max_active": (0.0, 1.0, None),
    "clip_tries": (1, 10, None),
}


@dataclass(frozen=True)
class Settings:
    """Settings of this stage (the `lr_sweep:` section of a profile)."""

    # Also sweep when the watched run stayed finite. `nandoctor run` does not: a finite run has
    # no failure for the learning rate to explain, and a sweep would cost several re-runs of a
    # healthy script; `nandoctor sweep-lr` always sweeps.
    when_finite: bool = False
    # ---- budget and search -------------------------------------------------------------------
    halvings: int = 10  # multipliers 1/2, 1/4, ... down to 1/2**halvings (`--halvings`)
    jobs: int = 0  # candidates run at once (`--jobs`); 0: one per core, or per accelerator
    max_jobs: int = 8  # cap on the automatic `jobs`
    parallel_max_rss_mb: float = 1024  # automatic `jobs` on the CPU: 1 when the watched run's
    # peak memory was above this (each candidate holds its own model and optimizer state)
    max_steps: int = 200  # longest horizon of a candidate, in optimizer steps (`--steps`)
    min_steps: int = 20  # shortest horizon, so early failures still get a fair trial
    # From a rewind point before the failure at step K (child/rewind.py), candidates repeat
    # only the steps from there, and must stay stable through K+1 plus `rewound_margin` x
    # (K+1) steps (at least `horizon_margin`). The newest point at least `rewind_min_lead`
    # steps before the failure is used (a smaller learning rate needs steps to act), if a
    # candidate repeats at most `rewound_max_steps` steps from it.
    rewind_min_lead: int = 20
    rewound_margin: float = 0.25
    rewound_max_steps: int = 20000
    horizon_factor: float = 1.5  # horizon = factor x the step the unscaled run failed at ...
    horizon_margin: int = 5  # ... plus this many steps
    run_timeout_s: float | None = None  # per candidate (`--timeout`); None: 60 s + 3x the
    # watched run's time per step x horizon, at most watch.timeout_s
    stable_in_a_row: int = 2  # halving stops after this many consecutive stable runs
    insensitive_ratio: float = 1.5  # smallest multiplier failing by this x the unscaled run's
    # failure step: the learning rate is not the cause
    refine_rounds: int = 1  # rounds of geometric refinement between stable and failing
    refine_points: int = 1  # multipliers tried per refinement round
    refine_ratio: float = 1.2  # no refinement once failing/stable multipliers are this close
    margin: float = 0.5  # recommended = largest stable multiplier x margin ...
    margin_refined: float = 0.7071  # ... or x this after refinement with a full horizon
    verify_recommendation: bool = True  # run the recommended multiplier if not already run
    # ---- verdicts (see verdicts.py for the rules D1-D3, U1-U4) --------------------------------
    blowup_factor: float = 4.0  # D2: smoothed loss above this x its best so far ...
    blowup_min_fraction: float = 0.5  # ... and above this x the initial loss
    runaway_factor: float = 1.5  # D3: run ends with smoothed loss above this x the initial ...
    runaway_sigmas: float = 2.0  # ... and above it by this many sigmas of minibatch noise (also
    # the least rise a U2 growth must show)
    spike_sigmas: float = 6.0  # U1/U3: a spike exceeds the median by this many robust sigmas
    spike_ratio: float = 1.25  # U1: ... and this x the median of the steps before it
    big_spike_ratio: float = 2.0  # U1: one spike this big that does not recover is enough
    spike_window: int = 32  # U1/U3: steps before a value that define "normal" for it
    growth_factor: float = 1.25  # U2: rising loss whose last quarter is this x its best
    grad_growth_factor: float = 10.0  # U3: last-quarter gradient norm this x the first's
    grad_spikes: int = 3  # U3: this many gradient-norm spikes (6 sigma and 3x the median)
    # U1/U3 on long runs: minibatch noise crosses any spike threshold at a steady rate per step,
    # so the spikes needed grow with the steps judged, to this fraction of them (2 in 200).
    spikes_per_step: float = 0.01
    scaler_calibration_steps: int = 20  # U4: GradScaler skips before this step are expected
    scaler_min_skips: int = 2  # U4: more skips than max(this, fraction x steps) ...
    scaler_skip_fraction: float = 0.02  # ... mean the scaler keeps overflowing
    stall_progress: float = 0.01  # stable runs whose loss fell by less than this are "stalled"
    # ---- clip experiment -----------------------------------------------------------------------
    clip_experiment: bool = True  # re-run a spiky failing multiplier with gradient clipping
    explosion_factor: float = 100.0  # ... or x1 itself, when its gradient norm rose this x
    # above its level over the first steps before the failure (clipping is the remedy to try)
    clip_quantile: float = 0.98  # clip value: this quantile of healthy gradient norms ...
    clip_min_median: float = 2.0  # ... at least this x their median ...
    clip_max_median: float = 5.0  # ... at most this x their median, rounded down to 1-2-5
    clip_min_steps: int = 10  # healthy norms needed to derive a clip value
    clip_max_active: float = 0.25  # clipping that changed more than this fraction of the steps
    # is a smaller step size by another name: no evidence of gradient spikes
    clip_tries: int = 3  # a clip that did not train is tried again 10x tighter, this many runs
    # in all (people clip well below the ordinary norm: 1.0 against norms in the hundreds)

    def __post_init__(self) -> None:
        for item in fields(self):
            bounds = _BOUNDS.get(item.name)
            value = getattr(self, item.name)
            if bounds and not bounds[0] <= value <= bounds[1]:
                flag = f" ({bounds[2]})" if bounds[2] else ""
                raise ConfigError(
                    f"{NAME}.{item.name}{flag} must be between {bounds[0]:g} and "
                    f"{bounds[1]:g}: got {value}"
                )


def run(context: StageContext) -> StageOutcome:
    from nandoctor.stages.lr_sweep.sweep import run as run_sweep

    return run_sweep(context)


def rules_out_the_rate(result: StageResult | None) -> str | None:
    """The sweep's summary when it showed that a much smaller learning rate fails at about the
    step x1 failed at, or that the optimizer has no learning rate (the rate is not the cause),
    else None."""
    from nandoctor.stages.lr_sweep.conclusions import INSENSITIVE, NO_RATE

    if result is None or (result.details or {}).get("conclusion") not in (INSENSITIVE, NO_RATE):
        return None
    return result.summary


def render_details(result: StageResult, console) -> None:
    from nandoctor.stages.lr_sweep.render import render_details as render

    render(result, console)


def install_probe(session, options) -> None:
    """In a candidate run: scale every learning rate by this run's multiplier."""
    from nandoctor.instrument.lr_scaling import LrScaling

    extra = options.extra.get(NAME, {})
    scaling = LrScaling(
        session,
        multiplier=float(extra.get("multiplier", options.lr_multiplier)),
        clip=extra.get("clip"),
        stop_file=extra.get("stop_file"),
        only_site=extra.get("site"),
    )
    scaling.install()
    session.hooks.add_undo(scaling.remove)
