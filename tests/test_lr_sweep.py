"""The learning-rate sweep: verdict rules and search on synthetic histories, the multiplier and
write redirection inside real child runs, and `nandoctor sweep-lr` end to end."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from rich.console import Console

from conftest import SCRIPTS, line_of
from nandoctor.child.options import ChildOptions
from nandoctor.config import load_config
from nandoctor.errors import ConfigError
from nandoctor.runner import run_child
from nandoctor.stages.lr_sweep import Settings
from nandoctor.stages.lr_sweep.render import render_details, sparkline
from nandoctor.stages.lr_sweep.search import (
    Planned,
    RunRecord,
    Search,
    clip_value,
    optimizer_sites,
    round_down,
    round_down_125,
)
from nandoctor.stages.lr_sweep.verdicts import Verdict, classify, failure_pattern

SETTINGS = Settings()
SWEEP = ("--jobs", "2", "--halvings", "6")


def _verdict(losses, grads=None, horizon=None, **kwargs) -> Verdict:
    grads = grads if grads is not None else [1.0] * len(losses)
    return classify(losses, grads, SETTINGS, horizon=horizon or len(losses), **kwargs)


# ---- verdict rules ------------------------------------------------------------------------------
def test_a_noisy_but_converging_loss_is_stable():
    for seed in range(20):
        rng = random.Random(seed)
        losses = [(2.0 * math.exp(-t / 10) + 0.5) * (1 + 0.2 * rng.gauss(0, 1)) for t in range(60)]
        grads = [1 + 0.3 * abs(rng.gauss(0, 1)) for _ in range(60)]
        assert _verdict(losses, grads).verdict == "stable", seed


def test_a_noisy_plateau_is_stable_and_flagged_stalled():
    rng = random.Random(0)
    verdict = _verdict([1.0 + 0.05 * rng.gauss(0, 1) for _ in range(40)])
    assert verdict.verdict == "stable"
    assert "stalled" in verdict.warning


def test_a_nonfinite_value_is_d1():
    verdict = _verdict([1.0, 0.9, 0.8], nonfinite_step=3)
    assert (verdict.verdict, verdict.reason, verdict.failure_step) == ("diverged", "D1", 3)


def test_a_loss_far_above_its_best_is_d2():
    losses = [5.0 * 0.8**t for t in range(10)] + [5.0 * 1.9**t for t in range(10)]
    verdict = _verdict(losses, horizon=20)
    assert (verdict.verdict, verdict.reason) == ("diverged", "D2")


def test_a_blow_up_the_run_recovers_from_is_not_d2():
    losses = [2.0, 1.0, 0.3, 0.2, 0.2, 20.0, 1.5, 0.8] + [0.4 / (1 + 0.2 * t) for t in range(24)]
    assert _verdict(losses).verdict == "stable"
    assert _verdict(losses[:7]).reason == "D2"  # still blown up when the history ends


def test_a_bounce_near_zero_is_not_a_blow_up():
    losses = [5.0 * 0.5**t for t in range(15)] + [0.01] * 5
    assert _verdict(losses).verdict == "stable"


def test_ending_above_the_start_is_d3():
    losses = [1.0] * 5 + [1.0 + 0.06 * t for t in range(15)]
    verdict = _verdict(losses)
    assert (verdict.verdict, verdict.reason) == ("diverged", "D3")


def test_minibatch_noise_above_a_low_first_draw_is_not_d3():
    # weights that barely move (a tiny learning rate): every loss is a draw of the same noise,
    # and the first draw happened to be low
    rng = random.Random(3)
    losses = [1.3] + [rng.choice([1.3, 2.5, 4.0, 7.0, 10.0]) for _ in range(19)]
    assert _verdict(losses).reason != "D3"


def test_minibatch_noise_around_a_flat_loss_is_not_u2():
    # a tiny learning rate: the weights barely move and the loss is batch-to-batch noise
    rng = random.Random(1)
    losses = [200.0 * math.exp(rng.gauss(0.0, 0.5)) for _ in range(20)]
    assert _verdict(losses).verdict == "stable"


def test_one_batch_far_out_in_a_heavy_tail_is_not_an_unrecovered_spike():
    # the next batches are ordinary again, though the average stays lifted for many steps
    losses = (
        [2.0 + 0.1 * (i % 3) for i in range(12)] + [60.0] + [2.0 + 0.1 * (i % 3) for i in range(12)]
    )
    assert _verdict(losses).verdict == "stable"


def test_one_batch_a_billion_times_out_keeps_the_average_lifted_to_the_end_and_is_no_blow_up():
    # a record in the wrong unit: its batch's loss is 1e10; the run trains on from the next
    # batch, but the smoothed loss has not come down by the last steps
    losses = (
        [30.0 / (1 + 0.2 * t) for t in range(45)] + [3e10] + [1.0 - 0.02 * t for t in range(15)]
    )
    verdict = _verdict(losses)
    assert verdict.reason not in ("D2", "D3"), verdict


def test_a_blow_up_in_the_last_step_of_a_finished_run_still_counts():
    losses = [1.0 / (1 + 0.05 * t) for t in range(30)] + [50.0]
    assert _verdict(losses).verdict == "diverged"


def test_repeated_loss_spikes_are_u1():
    # each spike's update throws the weights: the batch after it is still far above the level
    losses = [1.0 / (1 + 0.05 * t) for t in range(40)]
    for t in (15, 30):
        losses[t] *= 1.6
        losses[t + 1] *= 1.5
    verdict = _verdict(losses)
    assert (verdict.verdict, verdict.reason, verdict.pattern) == ("unstable", "U1", "spike")


def test_one_step_loss_spikes_that_leave_the_next_batch_alone_are_the_batches():
    # a heavy-tailed loss (a crowded image, a long sequence): the spike is that batch's, the
    # very next batch is at the usual level, at any rate
    losses = [1.0 / (1 + 0.05 * t) for t in range(40)]
    for t in (12, 20, 27, 33):
        losses[t] *= 3.0
    assert _verdict(losses).verdict == "stable"


def test_a_single_spike_that_recovers_is_stable():
    losses = [1.0 / (1 + 0.05 * t) for t in range(40)]
    losses[15] *= 1.6
    assert _verdict(losses).verdict == "stable"


def test_a_spike_to_a_higher_plateau_is_u1():
    losses = [1.0 / (1 + 0.05 * t) for t in range(30)] + [0.9] * 30
    verdict = _verdict(losses)
    assert (verdict.verdict, verdict.reason, verdict.failure_step) == ("unstable", "U1", 30)


def test_a_long_run_at_its_noise_floor_is_stable():
    # Heavy-tailed minibatch noise on a slowly falling loss, for as long as a candidate resumed
    # from a rewind point runs: blips that stand 6 sigmas out come at a steady rate, and the
    # smoothed loss sits above the median of the steps before any one of them.
    for seed in range(8):
        rng = random.Random(seed)
        losses = [(1.5 * 0.999**t + 0.1) * rng.gammavariate(2.0, 0.5) for t in range(2600)]
        grads = [rng.gammavariate(2.0, 0.5) for _ in range(2600)]
        assert _verdict(losses, grads).verdict == "stable", seed


def test_an_early_rise_that_recovers_is_the_catapult_phase():
    losses = [1.0, 1.2, 1.6, 1.3, 1.0, 0.8] + [0.8 / (1 + 0.1 * t) for t in range(24)]
    verdict = _verdict(losses)
    assert verdict.verdict == "stable"
    assert "catapult" in verdict.warning


def test_an_early_jump_that_never_comes_back_is_u1():
    verdict = _verdict([14.4, 900.0, 300.0] + [18.0] * 40)
    assert (verdict.verdict, verdict.reason, verdict.failure_step) == ("unstable", "U1", 1)
    recovered = _verdict([14.4, 900.0, 300.0] + [10.0 / (1 + 0.1 * t) for t in range(40)])
    assert recovered.verdict == "stable" and "catapult" in recovered.warning


def test_a_loss_that_creeps_up_is_u2():
    losses = [1.0 / (1 + 0.2 * t) for t in range(20)] + [0.2 * 1.05**t for t in range(20)]
    verdict = _verdict(losses)
    assert (verdict.verdict, verdict.reason) == ("unstable", "U2")


def test_a_gradient_norm_growing_by_orders_of_magnitude_is_u3():
    losses = [1.0 / (1 + 0.05 * t) for t in range(40)]
    grads = [1.2**t for t in range(40)]
    verdict = _verdict(losses, grads)
    assert (verdict.verdict, verdict.reason) == ("unstable", "U3")


def test_a_clipped_run_is_judged_by_its_loss_not_its_gradient_norm_before_the_clip():
    # A recurrence whose gradient keeps growing while the clip bounds every update: the
    # loss falling is what says it trains.
    losses = [1.0 / (1 + 0.05 * t) for t in range(40)]
    grads = [1.2**t for t in range(40)]
    assert _verdict(losses, grads, clipped=True).verdict == "stable"
    blowing_up = [1.0] * 10 + [2.0**t for t in range(30)]
    assert _verdict(blowing_up, grads, clipped=True).failing


def test_a_run_resumed_from_a_rewind_point_names_its_failure_step_counted_from_step_0():
    losses = [1.0, 0.9, 0.8, float("nan")]
    verdict = classify(losses, [1.0] * 4, SETTINGS, horizon=10, first_step=30)
    assert (verdict.failure_step, verdict.detail) == (33, "NaN/Inf at step 33")
    spikes = [1.0 / (1 + 0.05 * t) for t in range(40)]
    for t in (15, 30):
        spikes[t] *= 1.6
        spikes[t + 1] *= 1.5
    verdict = classify(spikes, [1.0] * 40, SETTINGS, horizon=40, first_step=100)
    assert verdict.detail.endswith(f"(step {verdict.failure_step})")
    assert verdict.failure_step >= 100


def test_a_grad_scaler_that_keeps_skipping_is_u4():
    losses = [1.0 / (1 + 0.05 * t) for t in range(40)]
    assert _verdict(losses, skipped_steps=5).reason == "U4"
    assert _verdict(losses, min_scale=0.5).reason == "U4"
    assert _verdict(losses, skipped_steps=1).verdict == "stable"


# ---- search -------------------------------------------------------------------------------------
def _record(multiplier: float, purpose: str, verdict: Verdict, clip=None, grads=None) -> RunRecord:
    return RunRecord(Planned(multiplier, purpose, clip), verdict, losses=[1.0] * 20,
                     grad_norms=grads or [1.0] * 20)  # fmt: skip


def _simulate(oracle, jobs: int, settings: Settings = SETTINGS, newest_first=False) -> Search:
    """Drive a Search with `oracle(planned) -> Verdict`, `jobs` runs at a time, finishing the
    oldest running candidate first (or the newest)."""
    baseline = _record(1.0, "watched", oracle(Planned(1.0, "watched")))
    search = Search(settings, baseline, False, jobs=jobs)
    running: list[Planned] = []
    while not search.done:
        running += search.take(jobs - len(running))
        for planned in search.doomed():
            running.remove(planned)
            search.forget(planned, 0)
        if running:
            planned = running.pop(-1 if newest_first else 0)
            search.record(_record(planned.multiplier, planned.purpose, oracle(planned),
                                  planned.clip))  # fmt: skip
    return search


def _threshold_oracle(boundary: float):
    def oracle(planned: Planned) -> Verdict:
        if planned.multiplier <= boundary:
            return Verdict("stable", "", "ok")
        return Verdict("diverged", "D1", "nan", failure_step=round(5 / planned.multiplier))

    return oracle


@pytest.mark.parametrize("boundary", [0.9, 0.3, 0.05, 0.004])
@pytest.mark.parametrize("jobs", [1, 2, 4])
def test_the_recommendation_is_stable_and_close_to_the_boundary(boundary, jobs):
    search = _simulate(_threshold_oracle(boundary), jobs)
    assert search.recommended is not None
    assert boundary / 8 <= search.recommended <= boundary
    assert search.verified
    assert not search.lr_insensitive()


def test_halving_stops_after_two_stable_runs_in_a_row():
    search = _simulate(_threshold_oracle(0.3), jobs=1)
    halvings = sorted(
        r.multiplier for r in search.results.values() if r.planned.purpose == "halving"
    )
    assert halvings == [2**-10, 0.125, 0.25, 0.5]  # x1/1024 is the early "not the lr" check


def _simulate_from_a_rewind_point(oracle) -> Search:
    """As `_simulate` with one job, for candidates resumed from a rewind point at step 40."""
    baseline = _record(1.0, "watched", oracle(Planned(1.0, "watched")))
    baseline.first_step = 40
    search = Search(SETTINGS, baseline, False)
    while not search.done:
        for planned in search.take(1):
            search.record(_record(planned.multiplier, planned.purpose, oracle(planned)))
    return search


def test_from_a_rewind_point_halving_goes_in_order_and_reuses_a_stable_run():
    search = _simulate_from_a_rewind_point(_threshold_oracle(0.3))
    ran = [r.multiplier for r in search.results.values() if r.planned.purpose != "watched"]
    assert 2**-10 not in ran  # two stable halvings answered it
    assert search.recommended in ran and search.verified
    assert not any(r.planned.purpose == "verify" for r in search.results.values())


def test_from_a_rewind_point_a_failure_like_x1s_calls_the_smallest_next():
    def oracle(planned):
        return Verdict("diverged", "D1", "nan", failure_step=50)

    search = _simulate_from_a_rewind_point(oracle)
    assert search.lr_insensitive()
    assert sorted(r.multiplier for r in search.results.values()) == [2**-10, 0.5, 1.0]


def test_candidates_past_the_answer_are_stopped():
    search = _simulate(_threshold_oracle(0.3), jobs=4)
    stopped = {p.multiplier for p, _ in search.stopped}
    finished = {r.multiplier for r in search.results.values()}
    assert not stopped & finished
    assert all(m < 0.125 for m in stopped)


def test_a_failure_at_the_same_step_for_every_multiplier_is_not_the_lr():
    def oracle(planned):
        return Verdict("diverged", "D1", "nan", failure_step=6)

    search = _simulate(oracle, jobs=2)
    assert search.lr_insensitive()
    assert search.recommended is None
    assert len(search.results) == 3  # x1, x1/2 and x1/1024 were enough to tell


def test_one_at_a_time_from_step_0_the_smallest_multiplier_runs_first():
    def fails_alike(planned):
        return Verdict("diverged", "D1", "nan", failure_step=6)

    def delayed_by_a_smaller_rate(planned):
        step = 6 if planned.multiplier == 1.0 else 40
        return Verdict("diverged", "D1", "nan", failure_step=step)

    alike = _simulate(fails_alike, jobs=1)
    assert alike.lr_insensitive()
    assert sorted(r.multiplier for r in alike.results.values()) == [2**-10, 1.0]
    delayed = _simulate(delayed_by_a_smaller_rate, jobs=1)
    assert not delayed.lr_insensitive()
    # How the failure moves with the rate needs x1/2 as well.
    assert {2**-10, 0.5, 1.0} <= {r.multiplier for r in delayed.results.values()}


@pytest.mark.parametrize("jobs", [2, 4])
def test_which_parallel_run_ends_first_does_not_change_the_runs_recorded(jobs):
    # From step 0, x1/2 and x1/1024 run together. When x1/1024 ends first and fails like x1,
    # x1/2 is still kept: one run at a time, it would have ended first. More jobs run more.
    def oracle(planned):
        return Verdict("diverged", "D1", "nan", failure_step=6)

    one_at_a_time = _simulate(oracle, jobs=1)
    racing = _simulate(oracle, jobs=jobs, newest_first=True)
    assert set(one_at_a_time.results) <= set(racing.results)
    assert not racing.stopped


def test_a_nan_is_ruled_out_only_by_a_nan_at_the_smallest_multiplier():
    def oracle(planned):
        if planned.multiplier == 1.0:
            return Verdict("diverged", "D1", "nan", failure_step=10)
        return Verdict("diverged", "D2", "smoothed loss 7.9x its best", failure_step=9)

    assert not _simulate(oracle, jobs=2).lr_insensitive()


def test_a_spiky_failure_gets_the_clip_experiment():
    def oracle(planned):
        if planned.clip is not None or planned.multiplier <= 0.3:
            return Verdict("stable", "", "ok")
        return Verdict("unstable", "U1", "2 loss spikes", failure_step=12, pattern="spike")

    search = _simulate(oracle, jobs=2)
    assert search.clip_run is not None
    assert search.clip_run.multiplier == 1.0
    assert search.clip_run.verdict.verdict == "stable"


@pytest.mark.parametrize("jump_at, clipped", [(27, True), (12, False)])
def test_a_gradient_jump_just_before_x1_failed_gets_the_clip_experiment(jump_at, clipped):
    """x1's norm jumped a few steps before it failed and was back down by the failure (momentum
    carried that update): no "spike" pattern at the failure, but the clip is the question."""

    def oracle(planned):
        if planned.clip is not None or planned.multiplier <= 0.5:
            return Verdict("stable", "", "loss 2 -> 1")
        return Verdict("diverged", "D1", "nan", failure_step=30)

    def record(planned):
        norms = [5.0 + (i % 3) for i in range(30)]
        if planned.multiplier == 1.0 and planned.clip is None:
            norms[jump_at] = 200.0
        return RunRecord(planned, oracle(planned), losses=[2.0 - i / 30 for i in range(30)],
                         grad_norms=norms)  # fmt: skip

    search = Search(SETTINGS, record(Planned(1.0, "watched")), False)
    while not search.done:
        for planned in search.take(2):
            search.record(record(planned))
    assert (search.clip_run is not None) is clipped
    if clipped:
        assert search.clip_run.multiplier == 1.0


def test_a_rate_a_schedule_moved_from_the_constructors_is_fixed_at_its_peak():
    """A warm-up from lr=0: scaling the constructor's 0 says nothing; the peak x1 ran at does."""
    from types import SimpleNamespace

    from nandoctor.stages.lr_sweep.conclusions import fix_text, recommended_lrs
    from nandoctor.stages.lr_sweep.runs import _watched_optimizers

    warm_up = [[0.0], [0.005], [0.01], [0.01]]
    baseline = RunRecord(Planned(1.0, "watched"), Verdict("diverged", "D1", "nan", 3),
                         first_step=10, losses=[1.0] * 4, grad_norms=[1.0] * 4, lrs=warm_up)  # fmt: skip
    search = Search(SETTINGS, baseline, False)
    search.recommended = 0.5
    optimizers = [{"class_name": "SGD", "location": None, "lrs": [0.0]}]
    assert "peaked at 0.01 (step 12; built with lr=0" in fix_text(search, optimizers, [])
    assert "make that peak 0.005" in fix_text(search, optimizers, [])
    assert recommended_lrs(search, optimizers) == [
        {"optimizer": "SGD", "location": None, "lrs": [0.005], "peak": True}
    ]
    built_at_its_rate = [{"class_name": "SGD", "location": None, "lrs": [0.01]}]
    assert "lr=0.005 (×1/2 of 0.01)" in fix_text(search, built_at_its_rate, [])
    # groups built at their own rates, the watched run's as the optimizer event records them
    groups = _watched_optimizers(SimpleNamespace(all=lambda kind: [
        {"type": "Adam", "settings": {"lr": 0.001}, "groups": 2, "lrs": [0.001, 0.01]}]))  # fmt: skip
    search.baseline.lrs[:] = [[0.001, 0.01]] * 4
    assert "per param group lr=0.0005, 0.005 (×1/2 of 0.001, 0.01)" in fix_text(search, groups, [])


def test_a_run_that_took_much_memory_sweeps_one_candidate_at_a_time():
    from types import SimpleNamespace

    from nandoctor.stages.lr_sweep.sweep import _jobs_on_the_cpu

    def context(peak_mb):
        watch = SimpleNamespace(end={"peak_rss_mb": peak_mb})
        return SimpleNamespace(config=SimpleNamespace(lr_sweep=SETTINGS), watch=watch)

    assert _jobs_on_the_cpu(context(300.0), cores=4) == 4
    assert _jobs_on_the_cpu(context(SETTINGS.parallel_max_rss_mb + 1), cores=4) == 1


def test_a_recurrent_model_gets_the_clip_experiment_and_it_leads_when_it_holds():
    from nandoctor.stages.lr_sweep.conclusions import findings

    def oracle(planned):
        if planned.clip is not None or planned.multiplier <= 0.3:
            return Verdict("stable", "", "ok")
        return Verdict("diverged", "D1", "nan", failure_step=12, pattern="growth")

    recurrent = {"module": "rnn", "type": "RNN", "chain": 60}
    baseline = _record(1.0, "watched", oracle(Planned(1.0, "watched")))
    search = Search(SETTINGS, baseline, False, recurrent)
    while not search.done:
        for planned in search.take(2):
            search.record(_record(planned.multiplier, planned.purpose, oracle(planned),
                                  planned.clip, grads=[1.0 + 0.1 * (i % 3) for i in range(19)]
                                  + [30.0]))  # fmt: skip
    assert search.clip_run is not None and search.clip_run.multiplier == 1.0
    by_category = {f.category: f for f in findings(search)}
    clip, rate = by_category["exploding_gradients"], by_category["learning_rate"]
    assert clip.confidence > rate.confidence and "recurrence of rnn" in clip.title
    assert clip.code == "EG502"  # measured apart from the clips of other models
    # without a recurrence, a steady growth gets no clip experiment
    plain = _simulate(oracle, jobs=2)
    assert plain.clip_run is None


@pytest.mark.parametrize("pattern, keeps", [("spike", True), ("growth", False)])
def test_a_clip_keeps_the_rate_only_when_x1_failed_by_a_jump(pattern, keeps):
    """Clipping that changed few steps trains at x1 in both cases; when x1's gradient norm had
    built up over several steps, the clip only cut a rate's feedback at its first turn."""
    from nandoctor.stages.lr_sweep.conclusions import findings
    from nandoctor.stages.lr_sweep.verdicts import Explosion

    def oracle(planned):
        if planned.clip is not None or planned.multiplier <= 0.3:
            return Verdict("stable", "", "loss 2 -> 1")
        return Verdict("diverged", "D1", "nan", failure_step=12, pattern=pattern)

    def record(planned):
        losses = [2.0 - i / 20 for i in range(20)]  # the same progress for every run that trains
        # one step's norm above the clip: the clip changed that step only
        return RunRecord(planned, oracle(planned), losses=losses, grad_norms=[1.0] * 19 + [50.0])

    baseline = record(Planned(1.0, "watched"))
    search = Search(SETTINGS, baseline, False, exploded=Explosion(1.0, 500.0))
    while not search.done:
        for planned in search.take(2):
            search.record(record(planned))
    assert search.clip_run is not None and search.clip_run.clipped_steps == 1
    clip = next(f for f in findings(search) if f.category == "exploding_gradients")
    assert clip.remedy["keeps_the_rate"] is keeps
    assert any("built up over several steps" in line for line in clip.evidence) is not keeps


def _searched_with(record, exploded) -> Search:
    """A search, two candidates at a time, whose runs `record(planned) -> RunRecord` makes; x1
    is `record` of the watched run, its gradient norm `exploded`."""
    search = Search(SETTINGS, record(Planned(1.0, "watched")), False, exploded=exploded)
    while not search.done:
        for planned in search.take(2):
            search.record(record(planned))
    return search


def test_a_clip_leads_when_the_smaller_rates_survive_only_by_not_training():
    """Smaller rates that are stable because their loss barely moves (stalled) show the rate
    can be made too small to fail, not that it trains: a clip at x1 whose loss falls keeps the
    rate, even acting on every step."""
    from nandoctor.stages.lr_sweep.conclusions import findings
    from nandoctor.stages.lr_sweep.verdicts import Explosion

    def oracle(planned):
        if (planned.clip or 2.0) <= 1.0 or planned.multiplier <= 0.1:
            return Verdict("stable", "", "finite")
        return Verdict("diverged", "D1", "nan", failure_step=12, pattern="spike")

    def record(planned):
        trains = planned.clip is not None
        losses = [2.0 - i / 20 if trains else 2.0 + 0.001 * (i % 2) for i in range(20)]
        return RunRecord(planned, oracle(planned), losses=losses, grad_norms=[5.0] * 20)

    search = _searched_with(record, Explosion(5.0, 5000.0))
    clip = next(f for f in findings(search) if f.category == "exploding_gradients")
    assert search.clip_run.clipped_steps == 20
    assert clip.remedy["keeps_the_rate"]
    assert any(line.startswith("no smaller learning rate trains") for line in clip.evidence)


def _clip_search(clipped_norm: float, baseline_steps: int) -> Search:
    """x1 fails by a steady growth after `baseline_steps`, rates up to x1/4 train; a clip at x1
    trains as far, every step's gradient norm `clipped_norm`."""

    def oracle(planned):
        if planned.clip is not None or planned.multiplier <= 0.3:
            return Verdict("stable", "", "loss 2 -> 1")
        return Verdict("diverged", "D1", "nan", failure_step=baseline_steps, pattern="growth")

    def record(planned, steps=20):
        norm = clipped_norm if planned.clip is not None else 1.0
        return RunRecord(planned, oracle(planned), losses=[2.0 - i / 20 for i in range(steps)],
                         grad_norms=[norm] * steps)  # fmt: skip

    search = Search(SETTINGS, record(Planned(1.0, "watched"), baseline_steps), False)
    while not search.done:
        for planned in search.take(2):
            search.record(record(planned))
    return search


def test_a_clip_that_changed_no_step_is_no_evidence():
    """x1 failed, and x1 'clipped' trained without the clip ever acting: the failure did not
    repeat, and clipping cannot be what fixed it."""
    from nandoctor.stages.lr_sweep.conclusions import findings

    search = _clip_search(clipped_norm=1e-3, baseline_steps=3)
    assert search.clip_run is not None and search.clip_run.clipped_steps == 0
    assert [f.category for f in findings(search)] == ["learning_rate"]


def test_x1_failing_too_soon_to_show_a_pattern_gets_the_clip_experiment_at_x1():
    """Two steps hold no gradient-norm history to tell a spike from a growth: whether clipping
    lets x1 keep its rate is asked directly. With twenty, a steady growth is not clipped."""
    assert _clip_search(100.0, baseline_steps=2).clip_run.multiplier == 1.0
    assert _clip_search(100.0, baseline_steps=20).clip_run is None


@pytest.mark.parametrize("losses, swept", [([2.0, 1.8, 1.9, 1.7, 1.8], False),
                                            ([2.0, 1.8, 9.0, 80.0, 900.0], True)])  # fmt: skip
def test_values_made_outside_torch_rule_out_the_rate_only_in_a_run_not_diverging(losses, swept):
    """A NaN that entered torch from numpy after the loss had grown tenfold may have been
    computed from the model's own outputs (targets matched in Python): the sweep still runs."""
    from nandoctor.runner import RunOutcome
    from nandoctor.stages.lr_sweep.sweep import skip_reason

    steps = [{"event": "step", "step": i, "loss": v} for i, v in enumerate(losses)]
    birth = {"step": len(losses), "phase": "data", "op": "input", "inputs_nonfinite": True}
    events = [{"event": "optimizer", "type": "SGD"}, *steps,
              {"event": "nonfinite", "step": len(losses), "phase": "data", "birth": birth}]  # fmt: skip
    reason = skip_reason(RunOutcome(events=events), timeout_s=60.0)
    assert (reason is None) is swept


def test_a_clip_that_does_not_train_is_tried_tighter_and_leads_when_nothing_else_trains():
    """People clip well below the ordinary norm; a clip at twice it lets the first huge steps
    through. With no smaller rate stable, a clip that trains is the fix even if it acts on
    every step: no smaller step size stands in for it."""
    from nandoctor.stages.lr_sweep.conclusions import findings
    from nandoctor.stages.lr_sweep.verdicts import Explosion

    def oracle(planned):
        if planned.clip is not None and planned.clip <= 1.0:
            return Verdict("stable", "", "loss 2 -> 1")
        if planned.multiplier < 1.0:  # unstable later, at every smaller rate
            return Verdict("unstable", "U2", "loss grew to 1.5x its best", failure_step=15)
        return Verdict("diverged", "D1", "nan", failure_step=5, pattern="spike")

    def record(planned):
        losses = [2.0 - i / 20 for i in range(20)]
        return RunRecord(planned, oracle(planned), losses=losses, grad_norms=[5.0] * 20)

    search = _searched_with(record, Explosion(5.0, 5000.0))
    assert [r.planned.clip for r in search.clip_runs] == [10, 1]
    assert search.clip_run.verdict.verdict == "stable" and search.clip_run.clipped_steps == 20
    (clip,) = findings(search)
    assert clip.category == "exploding_gradients" and clip.remedy["keeps_the_rate"]
    assert any(line.startswith("clipped at 10: diverged") for line in clip.evidence)
    assert not any("as a smaller learning rate would" in line for line in clip.evidence)


def _batch_spike_search(jump_at, rate_step_at: int | None = None, resumed_at: int = 0) -> Search:
    """x1 fails at step 30 and is spiky; rates up to x1/4 train. `jump_at(multiplier)`: the
    step where that run's gradient norm jumps 20x (None: no jump). A clip at x1 survives with
    loss spikes, its late loss as low as the smaller rates'. `rate_step_at`: the step where a
    schedule raises every run's rate 30x. `resumed_at`: the step of the rewind point every
    candidate starts from (the watched run's steps before it are its lead-in)."""

    def oracle(planned):
        if planned.clip is not None:
            return Verdict("unstable", "U1", "2 loss spikes (step 12)", failure_step=12)
        if planned.multiplier <= 0.3:
            return Verdict("stable", "", "loss 2 -> 1")
        return Verdict("diverged", "D1", "nan", failure_step=30, pattern="spike")

    def rate(planned, step):
        return [0.1 * planned.multiplier * (30 if rate_step_at and step >= rate_step_at else 1)]

    def record(planned, steps=40):
        jump = jump_at(1.0 if planned.clip is not None else planned.multiplier)
        norms = [1.0 + 0.1 * (i % 3) for i in range(resumed_at, steps)]
        if jump is not None and resumed_at <= jump < steps:
            norms[jump - resumed_at] = 20.0
        losses = [2.0 - i / steps for i in range(resumed_at, steps)]
        lrs = [rate(planned, i) for i in range(resumed_at, steps)]
        return RunRecord(planned, oracle(planned), losses=losses, grad_norms=norms, lrs=lrs,
                         first_step=resumed_at)  # fmt: skip

    watched = record(Planned(1.0, "watched"), steps=30)
    lead_in = range(max(0, resumed_at - 10), resumed_at)
    watched.norms_before.extend(1.0 + 0.1 * (i % 3) for i in lead_in)
    watched.lrs_before.extend(rate(watched.planned, i) for i in lead_in)
    search = Search(SETTINGS, watched, False)
    while not search.done:
        for planned in search.take(2):
            search.record(record(planned))
    return search


def test_gradient_spikes_at_the_same_batches_at_every_rate_are_the_cause_when_a_clip_trains():
    """The same step jumps at x1, x1/2 and x1/4: the batch makes the jump, and clipping at
    x1 carries the run past its failure with a loss as low as the smaller rates'."""
    from nandoctor.stages.lr_sweep.conclusions import findings

    search = _batch_spike_search(lambda multiplier: 20)
    found = {f.category: f for f in findings(search)}
    spikes = found["exploding_gradients"]
    assert spikes.code == "EG503" and spikes.remedy["keeps_the_rate"]
    assert spikes.remedy["multiplier"] == 1.0 and spikes.verified_fix
    assert "at step 20 the gradient norm jumped" in spikes.evidence[0]
    assert "learning_rate" in found  # the rate trains too: ranking weighs the two


def test_a_jump_right_after_the_rewind_point_counts_against_the_steps_before_it():
    """Resumed 2 steps before the jump: the candidates' own history is too short to say what
    "usual" was, the watched run's steps before the point (the same for every candidate) do."""
    from nandoctor.stages.lr_sweep.conclusions import findings

    search = _batch_spike_search(lambda multiplier: 20, resumed_at=18)
    spikes = {f.category: f for f in findings(search)}["exploding_gradients"]
    assert spikes.code == "EG503"
    assert "at step 20 the gradient norm jumped" in spikes.evidence[0]


def test_a_jump_that_comes_later_as_the_rate_falls_is_the_rate_s():
    """x1 jumps at step 20, x1/2 at 26, x1/4 at 32: the rate drives when the jump comes."""
    from nandoctor.stages.lr_sweep.conclusions import findings

    search = _batch_spike_search(lambda multiplier: round(20 + 12 * (1 - multiplier)))
    assert all(f.code != "EG503" for f in findings(search))


def test_a_jump_where_the_schedule_raised_the_rate_is_the_rate_s():
    """Every run jumps at step 21 because a step schedule raised every rate 30x at step 20."""
    from nandoctor.stages.lr_sweep.conclusions import findings

    search = _batch_spike_search(lambda multiplier: 21, rate_step_at=20)
    assert all(f.code != "EG503" for f in findings(search))


def test_a_script_whose_rare_batches_jump_at_every_rate_is_told_to_clip(nandoctor):
    # A handful of far-out rows make a cross network's gradient jump at the same batches at
    # every rate: clipping at the script's own rate is the verified fix, located after its
    # backward() (the script sets no clipping), and the rate stays below it.
    script = "cross_network_batch_cliffs.py"
    result = nandoctor("run", script)
    assert result.exit_code == 1
    causes = result.report["causes"]
    assert (causes[0]["category"], causes[0]["code"]) == ("exploding_gradients", "EG503")
    assert causes[0]["verified_fix"] is True
    assert causes[0]["location"]["line"] == line_of(script, "loss.backward()")
    rates = [c for c in causes if c["category"] == "learning_rate"]
    assert all(c["confidence"] < causes[0]["confidence"] for c in rates)


def test_optimizer_sites_are_the_lines_that_built_optimizers_with_a_rate():
    at = lambda line, lrs: {"location": {"file": "t.py", "line": line}, "lrs": lrs}  # noqa: E731
    # a fresh optimizer every round at line 5 is one line to change; no rate, no line
    built = [at(5, [0.1]), at(9, [None]), at(5, [0.1]), at(7, [0.01, 0.02]), {"lrs": [1.0]}]
    assert optimizer_sites(built) == [("t.py", 5), ("t.py", 7)]


def test_of_two_optimizers_the_rate_the_failure_needs_lowered_is_named(nandoctor):
    # The decoder's rate is far above the encoder's: the recommendation applied to each
    # optimizer's rate alone trains only on the decoder's, so the cause is located at the
    # decoder's rate and its fix leaves the encoder's as it is.
    script = "lr_two_optimizers.py"
    result = nandoctor("run", script)
    assert result.exit_code == 1
    top = result.report["causes"][0]
    assert (top["category"], top["code"]) == ("learning_rate", "LR501")
    assert top["verified_fix"] is True
    assert top["location"]["line"] == line_of(script, "--lr-decoder")
    assert "the other optimizers' rates can stay as they are" in top["fix"]
    runs = result.report["stages"]["lr_sweep"]["runs"]
    alone = {r["only_optimizers_at"]["line"]: r["verdict"] for r in runs if r["purpose"] == "alone"}
    built = line_of(script, "optimizer_encoder = ")
    assert alone == {built: "diverged", built + 1: "stable"}


def test_clip_and_rounding_helpers():
    assert round_down(0.35355) == 0.35
    assert round_down(0.125) == 0.12
    assert round_down_125(7.3) == 5 and round_down_125(0.27) == 0.2 and round_down_125(1.0) == 1
    norms = [1.0 + 0.01 * (t % 7) for t in range(40)]
    assert clip_value(norms, SETTINGS) == 2  # max(q98, 2 x median) rounded down to 1-2-5
    assert clip_value(norms[:5], SETTINGS) is None


def test_settings_are_checked_with_the_flag_named():
    with pytest.raises(
        ConfigError, match=r"lr_sweep.halvings \(--halvings\) must be between 1 and 20: got 0"
    ):
        load_config(overrides={"lr_sweep": {"halvings": 0}})


# ---- rendering ----------------------------------------------------------------------------------
def test_the_table_shows_a_curve_per_run_and_the_answer():
    from nandoctor.report.model import StageResult

    details = {
        "horizon": 20,
        "jobs": 2,
        "conclusion": "learning_rate",
        "recommended_lr_multiplier": 0.25,
        "verified": True,
        "recommended_lrs": [{"optimizer": "SGD", "location": None, "lrs": [0.2]}],
        "runs": [
            {"multiplier": 1.0, "label": "1", "purpose": "watched", "lr": 0.8, "steps": 5,
             "first_nonfinite_step": 5, "final_loss": 7e13, "verdict": "diverged",
             "detail": "NaN/Inf at step 5", "losses": [6.6, 7.0, 90.0, 7e13]},
            {"multiplier": 0.25, "label": "1/4", "purpose": "halving", "lr": 0.2, "steps": 20,
             "first_nonfinite_step": None, "final_loss": 0.4, "verdict": "stable",
             "detail": "loss 6.62 -> 0.4", "losses": [6.6, 3.0, 1.0, 0.4]},
        ],
    }  # fmt: skip
    console = Console(width=160, record=True, color_system=None)
    render_details(StageResult("ran", "", details=details), console)
    text = console.export_text()
    assert "loss curve" in text and "✗" in text and "█" in text
    assert "recommended: ×1/4" in text and "lr 0.2" in text
    assert sparkline([3.0, 2.0, 1.0]).plain == "█▅▁"


# ---- inside the child: the multiplier and the scratch folder ------------------------------------
def _child_lrs(script: str, multipliers: tuple[float, ...], tmp_path: Path) -> dict:
    """Per-step, per-group learning rates the child's `step` events report, per multiplier."""
    outcomes = {}

    def run(m: float) -> None:
        workdir = tmp_path / f"m{m}"
        workdir.mkdir()
        options = ChildOptions(script=str(SCRIPTS / script), args=[], events_path="",
                               max_steps=100, seed=0, detect=False, probes=["lr_sweep"],
                               extra={"lr_sweep": {"multiplier": m}})  # fmt: skip
        outcomes[m] = run_child(options, str(workdir), timeout_s=120)

    threads = [threading.Thread(target=run, args=(m,)) for m in multipliers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {m: [s["lr"] for s in outcome.steps] for m, outcome in outcomes.items()}


@pytest.mark.parametrize(
    ("script", "steps", "groups"),
    [("lr_onecycle.py", 30, 1), ("lr_warmup_cosine_groups.py", 25, 2)],
)
def test_the_multiplier_keeps_the_schedule_shape(script, steps, groups, tmp_path):
    lrs = _child_lrs(script, (1.0, 0.25), tmp_path)
    plain, scaled = lrs[1.0], lrs[0.25]
    assert len(plain) == len(scaled) == steps
    assert len({tuple(step) for step in plain}) > steps // 2, "the schedule must vary the lr"
    for t, (unscaled, used) in enumerate(zip(plain, scaled, strict=True)):
        assert len(unscaled) == len(used) == groups
        for a, b in zip(unscaled, used, strict=True):
            assert b == pytest.approx(0.25 * a, rel=1e-9), f"step {t}"
    if groups == 2:  # per-group ratios survive (0.05 : 0.01)
        assert all(step[0] == pytest.approx(5 * step[1]) for step in scaled)
    else:  # OneCycleLR still peaks at its max_lr, times the multiplier
        assert max(step[0] for step in scaled) == pytest.approx(0.25 * 0.05, rel=1e-3)


def test_a_wrapper_optimizer_is_scaled_once(tmp_path):
    lrs = _child_lrs("lr_wrapped_optimizer.py", (0.5,), tmp_path)[0.5]
    assert lrs == [[pytest.approx(0.05)]] * 5


_CLOSURE_SCRIPT = """\
import torch
torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(16) * 5)
x = torch.randn(64, 16)
optimizer = torch.optim.SGD([w], lr=0.8)
for step in range(30):
    def closure():
        optimizer.zero_grad()
        loss = ((x @ w) ** 2).mean()
        loss.backward()
        return loss
    print(optimizer.step(closure).item())
"""


@pytest.mark.parametrize("closure", [False, True])
def test_the_clip_experiment_clips_after_the_norm_is_recorded(closure, tmp_path):
    """Also when the backward runs inside optimizer.step(closure) (Lightning, L-BFGS), after
    the step's pre-hooks: the norm recorded is the one the clip acted on."""
    script = SCRIPTS / "lr_diverging_sgd.py"
    if closure:
        script = tmp_path / "closure_sgd.py"
        script.write_text(_CLOSURE_SCRIPT)
    options = ChildOptions(script=str(script), args=[], events_path="",
                           max_steps=20, seed=0, detect=False, probes=["lr_sweep"],
                           extra={"lr_sweep": {"multiplier": 1.0, "clip": 1.0}})  # fmt: skip
    outcome = run_child(options, str(tmp_path), timeout_s=120)
    assert outcome.nonfinite is None, "lr 0.8 with gradients clipped at 1 stays finite"
    assert len(outcome.steps) == 20
    assert max(s["grad_norm"] for s in outcome.steps) > 1.0, "norms are reported before clipping"


def test_the_failure_pattern_tells_a_jump_from_a_growth():
    assert failure_pattern([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 40.0]) == "spike"
    assert failure_pattern([1.5**t for t in range(10)]) == "growth"
    assert failure_pattern([1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0]) is None


_REDIRECT_CHECK = textwrap.dedent(
    """
    import json, multiprocessing, os, shutil, sys
    from pathlib import Path
    import numpy, torch
    from nandoctor.instrument.files import redirect_writes

    user, scratch = Path(sys.argv[1]), sys.argv[2]
    redirect_writes(scratch)
    with open(user / "train.log", "a") as log:
        log.write("appended\\n")
    assert (user / "train.log").read_text() == "an earlier run\\nappended\\n"
    (user / "metrics.json").write_text(json.dumps({"loss": 1.0}))
    assert json.loads((user / "metrics.json").read_text()) == {"loss": 1.0}
    os.makedirs(user / "ckpt" / "deep", exist_ok=True)
    assert (user / "ckpt" / "deep").is_dir()
    torch.save({"w": torch.ones(3)}, user / "ckpt" / "model.pt.tmp")
    os.replace(user / "ckpt" / "model.pt.tmp", user / "ckpt" / "model.pt")
    assert torch.equal(torch.load(user / "ckpt" / "model.pt")["w"], torch.ones(3))
    numpy.save(user / "ckpt" / "array.npy", numpy.arange(3))
    assert numpy.load(user / "ckpt" / "array.npy").tolist() == [0, 1, 2]
    shutil.copy(user / "keep.txt", user / "copy.txt")
    assert (user / "copy.txt").read_text() == "keep me\\n"
    os.remove(user / "keep.txt")
    assert not (user / "keep.txt").exists()
    assert sorted(os.listdir(user)) == ["ckpt", "copy.txt", "metrics.json", "train.log"]
    worker = multiprocessing.get_context("fork").Process(
        target=lambda: (user / "from_worker.txt").write_text("w"))
    worker.start(); worker.join()
    assert worker.exitcode == 0 and (user / "from_worker.txt").read_text() == "w"
    print("ok")
    """
)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    } | {str(p.relative_to(folder)) + "/": b"" for p in folder.rglob("*") if p.is_dir()}


def _user_folder(tmp_path: Path) -> Path:
    user = tmp_path / "project"
    user.mkdir()
    (user / "train.log").write_text("an earlier run\n")
    (user / "keep.txt").write_text("keep me\n")
    return user


def test_redirected_writes_land_in_the_scratch_folder(tmp_path):
    user = _user_folder(tmp_path)
    before = _snapshot(user)
    scratch = tmp_path / "systmp" / "scratch"
    scratch.parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", _REDIRECT_CHECK, str(user), str(scratch)],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "TMPDIR": str(scratch.parent)},
    )  # fmt: skip
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
    assert _snapshot(user) == before
    mirrored = scratch / str(user).lstrip("/")
    assert (mirrored / "ckpt" / "model.pt").exists()
    assert (mirrored / "train.log").read_text() == "an earlier run\nappended\n"


def test_the_working_directory_is_redirected_even_inside_the_temp_folder(tmp_path):
    user = _user_folder(tmp_path)  # pytest's tmp_path sits inside the system temp folder
    code = (
        "import sys; from nandoctor.instrument.files import redirect_writes; "
        "redirect_writes(sys.argv[1]); open('made.txt', 'w').write('x'); "
        "assert open('made.txt').read() == 'x'; print('ok')"
    )
    scratch = tmp_path / "scratch"
    done = subprocess.run([sys.executable, "-c", code, str(scratch)], cwd=user,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr
    assert not (user / "made.txt").exists()
    assert (scratch / str(user).lstrip("/") / "made.txt").read_text() == "x"


# ---- `nandoctor sweep-lr` end to end ------------------------------------------------------------
@pytest.fixture
def config(tmp_path):
    """`--config FILE` with the watched run localizing as it goes (one child run, not two)."""

    def write(extra: str = "") -> tuple[str, str]:
        path = tmp_path / "sweep.yaml"
        path.write_text("watch:\n  localize: always\n" + extra)
        return "--config", str(path)

    return write


def test_a_diverging_sgd_gets_a_verified_smaller_lr(nandoctor, config):
    result = nandoctor("sweep-lr", "lr_diverging_sgd.py", *SWEEP, *config())
    assert result.exit_code == 1, result.stderr
    sweep = result.report["stages"]["lr_sweep"]
    assert sweep["status"] == "ran", sweep
    runs = {run["multiplier"]: run for run in sweep["runs"] if run.get("clip") is None}
    assert runs[1.0]["verdict"] == "diverged"
    assert all(run["verdict"] != "stable" for m, run in runs.items() if m >= 0.5)
    stable = {m for m, run in runs.items() if run["verdict"] == "stable"}
    largest_stable = max(m for m in stable if all(k in stable for k in runs if k < m))
    recommended = sweep["recommended_lr_multiplier"]
    assert largest_stable / 8 <= recommended <= largest_stable
    assert runs[recommended]["verdict"] == "stable"
    cause = next(c for c in result.report["causes"] if c["stage"] == "lr_sweep")
    assert cause["verified_fix"] is True
    assert f"lr={0.8 * recommended:.3g}" in cause["fix"]
    # the learning rate is written in the argparse default, and used at the SGD line
    assert cause["location"]["line"] == line_of("lr_diverging_sgd.py", 'add_argument("--lr"')
    assert "loss curve" in result.stdout and "recommended: ×" in result.stdout


def test_a_nan_before_any_update_skips_the_sweep(nandoctor, config):
    result = nandoctor("sweep-lr", "log_zero_loss.py", *SWEEP, *config())
    sweep = result.report["stages"]["lr_sweep"]
    assert sweep["status"] == "skipped"
    assert "step 0" in sweep["summary"] and "cannot be the cause" in sweep["summary"]
    assert not any(c.get("stage") == "lr_sweep" for c in result.report["causes"])


def test_a_failure_the_lr_does_not_move_is_not_blamed_on_it(nandoctor, config):
    result = nandoctor("sweep-lr", "lr_insensitive.py", "--jobs", "2", *config())
    sweep = result.report["stages"]["lr_sweep"]
    assert sweep["status"] == "ran", sweep
    assert sweep["conclusion"] == "lr_insensitive"
    assert sweep["recommended_lr_multiplier"] is None
    assert "not the learning rate" in sweep["summary"]
    assert not any(c.get("stage") == "lr_sweep" for c in result.report["causes"])
    smallest = min(run["multiplier"] for run in sweep["runs"])
    assert smallest == 2**-10


def test_an_overflow_the_lr_does_not_move_is_the_formulas(nandoctor):
    # exp(similarity / temperature) with a temperature annealed down: it overflows at the same
    # step at every learning rate, so the values that grew are not the rate's doing.
    script = "contrastive_temperature_annealed.py"
    result = nandoctor("run", script)
    assert result.exit_code == 1, result.stderr
    assert result.report["stages"]["lr_sweep"]["conclusion"] == "lr_insensitive"
    top = result.report["causes"][0]
    assert top["category"] == "invalid_operation", result.report["causes"]
    assert top["location"]["line"] == line_of(script, "torch.exp(")
    assert result.report["first_nonfinite"]["phase"] == "forward"
    assert any("learning-rate sweep" in line for line in top["evidence"])
    learning_rate = [c for c in result.report["causes"] if c["category"] == "learning_rate"]
    assert all(c["confidence"] < top["confidence"] for c in learning_rate)


def test_the_verdict_does_not_depend_on_where_the_rewind_point_fell(nandoctor, tmp_path):
    # Points as often as they can be taken (where they fall still depends on what each costs).
    # From a point in the run's second half even x1/1024 fails as early as x1, which cannot
    # tell a run doomed before the point from a rate that does not matter: the sweep asks
    # again from step 0, and the verdict is the one a sweep from step 0 gives.
    config = tmp_path / "points.yaml"
    config.write_text("rewind:\n  interval_fraction: 0.0\n  min_interval_s: 0.0\n")
    result = nandoctor("run", "contrastive_temperature_annealed.py", "--config", str(config))
    sweep = result.report["stages"]["lr_sweep"]
    assert sweep["conclusion"] == "lr_insensitive", sweep["summary"]
    asked_again = [r for r in result.report["run"]["reruns"] if "even ×1/1024" in r["why"]]
    assert all(r["from_step"] == 0 for r in asked_again)
    if asked_again:
        assert sweep["from_step"] == 0 and "from the rewind point at step" in sweep["summary"]
    assert result.report["causes"][0]["category"] == "invalid_operation"


def test_the_sweeps_reruns_leave_the_users_files_alone(nandoctor, config, tmp_path):
    user = _user_folder(tmp_path)
    before = _snapshot(user)
    system_temp = tmp_path / "systmp"  # the project folder must not sit in the temp folder
    system_temp.mkdir()
    options = ("--jobs", "2", "--halvings", "3", *config("lr_sweep:\n  refine_rounds: 0\n"))
    result = nandoctor("sweep-lr", "lr_writes_files.py", *options,
                       script_args=["--out", str(user)],
                       env={"TMPDIR": str(system_temp)})  # fmt: skip
    sweep = result.report["stages"]["lr_sweep"]
    assert sweep["status"] == "ran", sweep
    stable = [run for run in sweep["runs"] if run["verdict"] == "stable"]
    assert stable and all(run["steps"] > 8 for run in stable), "the re-runs must have written"
    assert not [run for run in sweep["runs"] if run["verdict"] == "error"], sweep["runs"]
    assert _snapshot(user) == before


def test_a_healthy_run_is_not_swept(nandoctor, config):
    result = nandoctor("run", "healthy_mlp.py", "--stages", "anomaly,lr_sweep", *config())
    assert result.exit_code == 0, result.stdout + result.stderr
    sweep = result.report["stages"]["lr_sweep"]
    assert sweep["status"] == "skipped" and "stayed finite" in sweep["summary"]
    assert result.report["causes"] == [] and not result.report["findings"]


def test_sweep_lr_judges_a_healthy_run_not_implicated_without_re_running_it(nandoctor, config):
    result = nandoctor("sweep-lr", "healthy_mlp.py", *config())
    assert result.exit_code == 0, result.stdout + result.stderr
    sweep = result.report["stages"]["lr_sweep"]
    assert sweep["status"] == "ran" and sweep["conclusion"] == "not_implicated"
    assert [run["multiplier"] for run in sweep["runs"]] == [1.0]


def test_hand_written_updates_are_steps_and_the_sweep_says_why_it_cannot_scale_them(nandoctor):
    result = nandoctor("run", "hand_sgd_diverges.py")
    assert result.exit_code == 1
    report = result.report
    losses = report["run"]["losses"]
    assert len(losses) == 4 and losses[-1] > 1e30  # four hand-made steps, the loss exploding
    sweep = report["stages"]["lr_sweep"]
    assert sweep["status"] == "skipped" and "no torch.optim optimizer" in sweep["summary"]
    top = report["causes"][0]
    assert top["category"] == "learning_rate"
    assert top["location"]["line"] == 12  # `lr = 3.0`, the rate `p.data.add_` is given


def test_gradients_taken_with_autograd_grad_are_backward_passes(nandoctor):
    """A functional loop (`torch.autograd.grad`, weights updated by hand) was watched as if it
    never trained: no step, no loss, and its nan printed every line of a run called healthy."""
    result = nandoctor("run", "autograd_grad_sgd_diverges.py")
    assert result.exit_code == 1, result.stdout + result.stderr
    report = result.report
    assert report["status"] == "nonfinite"
    losses = report["run"]["losses"]
    assert len(losses) == 3 and losses[-1] > 1e20  # three hand-made steps, the loss exploding
    top = report["causes"][0]
    assert top["category"] == "learning_rate"
    assert top["location"]["line"] == 8  # `step_size = 0.05`, the rate of `w1 -= step_size * g1`


def test_a_script_that_raises_on_the_nan_loss_it_read_is_diagnosed(nandoctor):
    # The trainer reads `loss.item()`, sees nan and raises before any backward on it.
    script = "raises_on_nan_loss.py"
    result = nandoctor("run", script)
    assert result.exit_code == 1, result.stdout + result.stderr
    report = result.report
    assert report["status"] == "nonfinite"
    assert report["run"]["script_error"]["type"] == "ValueError"
    first = report["first_nonfinite"]
    assert first["phase"] == "forward" and first["step"] == len(report["run"]["losses"])
    assert (
        first["reached"]
        == f"a value the script read at line {line_of(script, 'value = loss.item()')}"
    )
    top = report["causes"][0]
    assert top["category"] == "learning_rate" and top["verified_fix"] is True
    assert top["location"]["line"] == line_of(script, "torch.optim.SGD(")


def test_a_loss_that_diverges_until_math_exp_overflows_is_diagnosed(nandoctor):
    # pytorch/examples' perplexity: math.exp(loss) raises OverflowError before any NaN/Inf.
    script = "perplexity_overflow.py"
    result = nandoctor("run", script)
    assert result.exit_code == 3, result.stdout + result.stderr
    report = result.report
    assert report["status"] == "script_error" and report["first_nonfinite"] is None
    assert report["run"]["script_error"]["type"] == "OverflowError"
    assert report["run"]["diverged"]["step"] == len(report["run"]["losses"]) - 1
    assert "after its loss diverged" in result.stdout
    top = report["causes"][0]
    assert top["category"] == "learning_rate" and top["verified_fix"] is True
    assert top["location"]["line"] == line_of(script, "torch.optim.SGD(")
