"""Causal rules and ranking, on findings built by hand (no child processes)."""

import dataclasses

from nandoctor.gradient_spikes import find_cliff
from nandoctor.ranking import (
    RunFacts,
    apply_causal_rules,
    apply_verified_rules,
    at_the_producing_line,
    at_the_written_value,
    growth_before_failure,
    rank_causes,
)
from nandoctor.report.model import Finding, Location


def finding(category, confidence=0.8, stage="anomaly", verified=None, severity="error", line=3):
    return Finding(stage=stage, category=category, title=f"{category} title", confidence=confidence,
                   evidence=(f"{stage} saw {category}",), fix="fix", location=Location("t.py", line),
                   severity=severity, verified_fix=verified)  # fmt: skip


def test_a_failure_before_any_update_cannot_be_the_learning_rate():
    findings = [finding("learning_rate", 0.9, stage="lr_sweep"), finding("invalid_operation", 0.7)]
    ranked = rank_causes(apply_causal_rules(findings, RunFacts(failed_step=0)))
    assert [c.category for c in ranked] == ["invalid_operation"]


def test_a_domain_error_after_the_loss_blew_up_points_at_the_learning_rate():
    facts = RunFacts(failed_step=6, losses=(1.0, 0.9, 3.0, 40.0, 900.0, 2e4),
                     optimizer_location=Location("t.py", 5))  # fmt: skip
    ranked = rank_causes(apply_causal_rules([finding("invalid_operation", 0.85)], facts))
    assert [c.category for c in ranked] == ["learning_rate", "invalid_operation"]
    assert ranked[0].location == Location("t.py", 5)
    assert "grew from 0.9 to 2e+04" in ranked[0].evidence[0]


def test_growth_needs_an_order_of_magnitude():
    assert growth_before_failure(RunFacts(failed_step=5, losses=(1.0, 0.8, 1.2, 1.5, 2.0))) is None
    assert growth_before_failure(RunFacts(failed_step=3, grad_norms=(1.0, 50.0, 400.0))) is not None


def test_initialization_explains_an_overflow_at_the_first_step():
    findings = [finding("precision", 0.6), finding("initialization", 0.5, stage="init_check")]
    ranked = rank_causes(apply_causal_rules(findings, RunFacts(failed_step=0)))
    assert [c.category for c in ranked] == ["initialization", "precision"]


def test_a_verified_fix_outranks_a_more_confident_guess():
    ranked = rank_causes([finding("precision", 0.95), finding("data", 0.6, verified=True)])
    assert [c.category for c in ranked] == ["data", "precision"]
    assert [c.rank for c in ranked] == [1, 2]


def test_one_cause_per_category_with_the_evidence_of_every_stage():
    findings = [finding("data", 0.85), finding("data", 0.95, stage="data_scan", line=9)]
    (cause,) = rank_causes(findings)
    assert cause.location.line == 9 and cause.stage == "data_scan"
    assert cause.evidence == ("data_scan saw data", "[anomaly] anomaly saw data")


def test_of_equal_findings_the_one_at_the_line_the_first_nan_came_from_leads():
    # two models' attention biases left uninitialized: the word model's runs first
    word, sent = (dataclasses.replace(finding("initialization", 0.84, stage="init_check", line=n),
                                      title=f"non-finite weights before training: {name}")
                  for n, name in ((90, "bias_word"), (121, "bias_sent")))  # fmt: skip
    traced = finding("initialization", 0.5, stage="anomaly", line=90)
    ranked = rank_causes([sent, word, traced])
    assert ranked[0].location.line == 90
    assert rank_causes([sent, word])[0].location.line == 121  # no trace: the order as before


def test_hints_never_become_causes():
    assert rank_causes([finding("initialization", 0.9, severity="hint")]) == []


def test_a_loss_scaled_before_backward_is_exploding_gradients():
    facts = RunFacts(
        failed_step=3, loss_scale={"factor": 2.0**20, "location": {"file": "t.py", "line": 50}}
    )
    (cause,) = rank_causes(apply_causal_rules([], facts))
    assert cause.category == "exploding_gradients" and cause.location.line == 50
    assert "1.049e+06" in cause.title


def test_the_constant_a_loss_was_multiplied_by_is_read_from_its_autograd_node():
    torch = __import__("pytest").importorskip("torch")
    from nandoctor.instrument.tensors import constant_factor

    weights = torch.nn.Parameter(torch.ones(3))
    loss = (weights * 2).sum() / 4
    assert constant_factor(loss * 2.0**20) == 2.0**20
    assert constant_factor(1e6 * loss) == 1e6
    assert constant_factor(loss * weights.sum()) is None  # a product of two tensors is no scale
    assert constant_factor(loss) is None


def test_a_cause_without_a_remedy_has_another_finding_of_its_category_verified():
    from dataclasses import replace

    from nandoctor.verify import fixes_to_try

    primary = finding("data", confidence=0.95, stage="data_scan", line=3)
    with_remedy = replace(finding("data", confidence=0.85, line=9), remedy={"kind": "x"})
    other = replace(finding("precision", confidence=0.6, line=12), remedy={"kind": "y"})
    chosen = fixes_to_try([primary, with_remedy, other], max_fixes=3)
    assert chosen == [with_remedy, other]
    assert fixes_to_try([primary, with_remedy, other], max_fixes=1) == [with_remedy]
    # once verified, that finding is the cause's primary: its line and fix are shown
    verified = replace(with_remedy, verified_fix=True)
    assert rank_causes([primary, verified])[0].location.line == 9


STEADY = [2.0, 1.8, 2.2, 1.9, 2.1, 2.0]


def test_a_jump_after_steady_steps_is_a_gradient_cliff():
    cliff = find_cliff([*STEADY, 5e3, None], [1.0] * 8, failed_step=7)
    assert (cliff.step, cliff.clip) == (6, 2.0)  # twice the usual 2.0, rounded down to 1-2-5


def test_growth_built_up_over_the_updates_is_no_cliff():
    growing = [1.0, 3.0, 9.0, 27.0, 81.0, 243.0, 729.0]  # a rate too high: x3 per step
    assert find_cliff([*growing, None], [1.0] * 8, failed_step=7) is None
    assert find_cliff([3e3, None], [1.0, None], failed_step=1) is None  # no history to judge


def test_a_gradient_cliff_explains_the_growth_after_it():
    facts = RunFacts(failed_step=8, grad_norms=(*STEADY, 5e3, 1e9, None),
                     losses=(1.0, 0.9, 0.9, 0.8, 0.8, 0.7, 0.8, 5e6, None))  # fmt: skip
    ranked = rank_causes(apply_causal_rules([finding("learning_rate", 0.55)], facts))
    assert [(c.category, c.code) for c in ranked] == [
        ("exploding_gradients", "EG602"),
        ("learning_rate", ""),
    ]
    assert "jumped at step 6" in ranked[1].evidence[-1]


def test_clipping_that_trains_at_the_original_rate_outranks_a_smaller_rate():
    def clipped(keeps_the_rate):
        return dataclasses.replace(
            finding("exploding_gradients", 0.36, stage="lr_sweep", verified=True),
            remedy={"kind": "clip_gradients", "max_norm": 5.0, "multiplier": 1.0,
                    "keeps_the_rate": keeps_the_rate},
        )  # fmt: skip

    # the rate's own record is better than the clip's: the clip still leads, as the reason
    # the report gives for it says
    rate = finding("learning_rate", 0.66, stage="lr_sweep", verified=True)
    ranked = rank_causes(apply_verified_rules([rate, clipped(True)]))
    assert [c.category for c in ranked] == ["exploding_gradients", "learning_rate"]
    assert "the gradient spikes, not the rate" in ranked[1].evidence[-1]
    ranked = rank_causes(apply_verified_rules([rate, clipped(False)]))
    assert [c.category for c in ranked] == ["learning_rate", "exploding_gradients"]


def test_clipping_that_trains_at_the_rate_leads_when_the_scripts_own_clip_is_switched_off():
    """The clip shrank more than a quarter of the updates (too many for rare spikes), so on
    its own it stays below the smaller rate; with the script's own clipping switched off, turning it on is the fix that
    keeps the rate the script was written for."""
    from nandoctor.source_values import WrittenAt

    clip = dataclasses.replace(
        finding("exploding_gradients", 0.42, stage="lr_sweep", verified=True),
        remedy={"kind": "clip_gradients", "max_norm": 1.0, "multiplier": 1.0,
                "keeps_the_rate": False, "trains_at_the_rate": True},
    )  # fmt: skip
    rate = finding("learning_rate", 0.9, stage="lr_sweep", verified=True)
    switched_off = WrittenAt(28, 'parser.add_argument("--clip", default=0)', "--clip")
    ranked = rank_causes(apply_verified_rules([rate, clip], switched_off))
    assert [c.category for c in ranked] == ["exploding_gradients", "learning_rate"]
    assert "switched off (line 28" in ranked[1].evidence[-1]
    assert [c.category for c in rank_causes(apply_verified_rules([rate, clip]))] == [
        "learning_rate",
        "exploding_gradients",
    ]
    stalled = dataclasses.replace(clip, remedy={**clip.remedy, "trains_at_the_rate": False})
    ranked = rank_causes(apply_verified_rules([rate, stalled], switched_off))
    assert [c.category for c in ranked] == ["learning_rate", "exploding_gradients"]


def test_standardized_inputs_that_train_at_the_original_rate_outrank_a_smaller_rate():
    # raw counts in the thousands: a smaller rate trains, and so do the same inputs standardized
    # at the original rate; their scale is what to fix
    scale = dataclasses.replace(
        finding("data", 0.3, stage="data_scan", verified=True),
        remedy={"kind": "standardize_inputs", "tensors": {"batch[0]": (500.0, 300.0)}},
    )
    rate = finding("learning_rate", 0.9, stage="lr_sweep", verified=True)
    ranked = rank_causes(apply_verified_rules([rate, scale]))
    assert [c.category for c in ranked] == ["data", "learning_rate"]
    unverified = dataclasses.replace(scale, verified_fix=False)
    ranked = rank_causes(apply_verified_rules([rate, unverified]))
    assert [c.category for c in ranked] == ["learning_rate", "data"]


def test_a_run_in_float32_that_trains_at_the_original_rate_outranks_a_smaller_rate():
    # a bfloat16 clamp that rounds to 1: a smaller rate only reaches the edge later, the same
    # run in float32 trains at the rate the script was written for
    dtype = dataclasses.replace(
        finding("precision", 0.9, stage="device_compare", verified=True),
        remedy={"kind": "float32"},
    )
    rate = finding("learning_rate", 0.4, stage="lr_sweep", verified=True)
    ranked = rank_causes(apply_verified_rules([rate, dtype]))
    assert [c.category for c in ranked] == ["precision", "learning_rate"]
    assert "in float32 trains at the original learning rate" in ranked[1].evidence[-1]
    unverified = dataclasses.replace(dtype, verified_fix=False)
    ranked = rank_causes(apply_verified_rules([rate, unverified]))
    assert [c.category for c in ranked] == ["learning_rate", "precision"]


def test_a_guard_that_keeps_the_rate_finite_but_does_not_train_leaves_the_rate_first():
    # The guard of a log keeps x1 finite, but its loss first blew up and ends above where it
    # started, while x1/2 trains: the blow-up was the rate's, the log only where it surfaced.
    guard = dataclasses.replace(
        finding("invalid_operation", 0.9, verified=True),
        remedy={"kind": "guard_op", "op": "log"}, progress=-0.4,
    )  # fmt: skip
    rate = dataclasses.replace(finding("learning_rate", 0.7, stage="lr_sweep", verified=True),
                               progress=0.3)  # fmt: skip
    ranked = rank_causes(apply_verified_rules([rate, guard]))
    assert [c.category for c in ranked] == ["learning_rate", "invalid_operation"]
    assert (
        "the loss rose 40% from where it started, and at a smaller learning rate it fell 30%"
        in ranked[1].evidence[-1]
    )
    # falling about as far as at the smaller rate, the guard trains at the rate: the formula
    trains = dataclasses.replace(guard, progress=0.2)
    ranked = rank_causes(apply_verified_rules([rate, trains]))
    assert [c.category for c in ranked] == ["invalid_operation", "learning_rate"]
    # a loss that rises at the smaller rate too (a policy's) tells nothing: the guard held
    rising = dataclasses.replace(rate, progress=-0.6)
    ranked = rank_causes(apply_verified_rules([rising, guard]))
    assert [c.category for c in ranked] == ["invalid_operation", "learning_rate"]


def test_a_fix_rerun_that_never_reached_the_failing_step_verifies_nothing():
    # A script can end without one update (a GradScaler that skips every step once its scale
    # fell to 0): finite, but it never got to where the original run failed.
    from nandoctor.runner import RunOutcome
    from nandoctor.verify import _verdict

    remedy = {"kind": "float32"}
    built = {"event": "optimizer", "index": 0}
    ended = {"event": "end", "outcome": "finished"}
    held, line = _verdict(RunOutcome(events=[built, ended]), 12, remedy, failed_at=0, before=[])
    assert not held and "before the step that failed" in line
    # without an optimizer there is no step to reach: a finished run is the evidence there is
    held, line = _verdict(RunOutcome(events=[ended]), 12, remedy, failed_at=0, before=[])
    assert held, line
    steps = [{"event": "step", "step": i, "loss": 1.0 - 0.02 * i} for i in range(12)]
    trained = RunOutcome(events=[*steps, {"event": "end", "outcome": "finished"}])
    held, line = _verdict(trained, 12, remedy, failed_at=0, before=[])
    assert held, line


def test_data_leads_with_the_first_numpy_error_of_the_batch_that_failed():
    # One line per error, in the order first seen: a setup warning at step 0, then the failing
    # batch's 255 / 0 (inf) and the 0 * inf (NaN) it makes on the next line.
    def error(kind, line, step):
        return {"error": kind, "step": step, "location": {"file": "t.py", "line": line}}

    errors = [error("invalid value", 9, 0), error("divide by zero", 64, 11),
              error("invalid value", 65, 11)]  # fmt: skip
    data = dataclasses.replace(finding("data", line=80), code="DA201")
    (moved,) = at_the_producing_line([data], errors, failed_step=12)
    assert moved.location.line == 64
    assert "entered torch at t.py:80" in moved.evidence[0]
    (kept,) = at_the_producing_line([data], errors[1:], failed_step=5)  # made after the failure
    assert kept.location.line == 80


def test_the_script_s_own_clip_that_never_acted_names_the_line_of_a_clip_the_sweep_verified():
    sweep = dataclasses.replace(
        finding("exploding_gradients", 0.92, stage="lr_sweep", verified=True, line=40),
        remedy={"kind": "clip_gradients", "max_norm": 1.0},
    )
    own = dataclasses.replace(finding("exploding_gradients", 0.5, stage="diagnosis", line=12),
                              remedy={"kind": "clip_gradients", "max_norm": 5.0,
                                      "script_clip": True})  # fmt: skip
    [cause] = rank_causes([sweep, own])
    assert cause.location == Location("t.py", 12)
    assert cause.confidence == 0.92 and cause.verified_fix


_HAND_SGD = """import argparse
p = argparse.ArgumentParser()
p.add_argument('--lr', type=float, default=0.1)
args = p.parse_args()
for w in params:
    w.data.add_(w.grad, alpha=-args.lr)
"""


def test_a_hand_updated_rate_leads_at_its_line_or_says_the_command_line_gives_it(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(_HAND_SGD)
    rate = dataclasses.replace(finding("learning_rate"), location=Location(str(script), 6))
    (written,) = at_the_written_value([rate], (), hand_updated_in=str(script))
    assert written.location.line == 3  # the argparse default
    (given,) = at_the_written_value([rate], ("--lr", "5"), hand_updated_in=str(script))
    assert given.location.line == 6  # nothing in the script to edit: the cause stays
    assert given.evidence[-1].endswith("its rate is given on the command line (--lr 5)")
