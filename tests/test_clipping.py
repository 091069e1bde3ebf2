"""Gradient clipping the script relies on but that never acts (EG603): seen when the clip runs,
located where the user fixes it, and a cause when making it act trains."""

from __future__ import annotations

import pytest

from conftest import line_of
from nandoctor.clipping import ineffective_clip_findings


@pytest.mark.parametrize(
    ("script", "problem_words"),
    [
        # `params_to_clip = model.parameters()` once: the first clip consumes the generator
        ("clip_consumed_generator.py", "given no tensors"),
        # clip_grad_norm_ after optimizer.step(): the update used the gradients unclipped
        ("clip_after_step.py", "after optimizer.step()"),
        # inside optimizer.step(closure), before backward(): its re-run must clip after the
        # closure's backward, which comes after the step's pre-hooks
        ("clip_before_backward_closure.py", "none of the tensors it was given had a gradient"),
    ],
)
def test_a_clip_that_never_acted_is_the_cause_when_making_it_act_trains(
    nandoctor, script, problem_words
):
    result = nandoctor("run", script, "--stages", "anomaly")
    assert result.exit_code == 1
    top = result.report["causes"][0]
    assert (top["category"], top["code"], top["verified_fix"]) == (
        "exploding_gradients",
        "EG603",
        True,
    )
    assert problem_words in top["title"]
    assert top["location"]["line"] == line_of(script, "# fix here")
    assert "clipped to norm 1" in top["evidence"][-1]


def _clip(step: int, problem: str | None, **more) -> dict:
    event = {"kind": "clip_grad_norm_", "problem": problem, "step": step, "limit": 1.0,
             "tensors": 4, "with_grad": 4, "iterator": False, "location": None}  # fmt: skip
    return {**event, **more}


def test_a_clip_that_acted_or_failed_only_after_the_failure_is_no_finding():
    assert ineffective_clip_findings([_clip(0, None)], failed_step=7) == []
    assert ineffective_clip_findings([_clip(0, None), _clip(9, "no_gradients")], 7) == []
    assert ineffective_clip_findings([_clip(0, "no_gradients")], failed_step=None) == []


def test_clipping_by_value_is_named_but_gets_no_norm_remedy():
    (finding,) = ineffective_clip_findings(
        [_clip(2, "no_gradients", kind="clip_grad_value_", limit=0.5)], failed_step=5
    )
    assert finding.code == "EG603" and finding.remedy is None
    assert "none of the tensors it was given had a gradient" in finding.evidence[0]


def test_a_hand_updated_recurrence_whose_gradient_exploded_gets_the_clip_tried(nandoctor):
    # No optimizer: no sweep can try a clip at the script's rate, so the diagnosis proposes
    # it (EG604) and its re-run clips right after each backward pass.
    script = "hand_updated_char_rnn.py"
    result = nandoctor("run", script, "--stages", "anomaly")
    assert result.exit_code == 1
    assert "EG604" in {f["code"] for f in result.report["findings"]}
    top = result.report["causes"][0]
    assert (top["category"], top["verified_fix"]) == ("exploding_gradients", True)
    assert top["location"]["line"] == line_of(script, "loss.backward()")


def _watch(*events):
    from nandoctor.runner import RunOutcome

    norms = [1.0 + 0.1 * (i % 3) for i in range(60)] + [400.0, 9e4]
    steps = [{"event": "step", "step": i, "loss": 1.0, "grad_norm": g}
             for i, g in enumerate(norms)]  # fmt: skip
    failure = {"event": "nonfinite", "step": len(norms), "phase": "backward"}
    recurrent = {"event": "recurrent", "module": "rnn", "type": "RNN", "chain": 30}
    return RunOutcome(events=[recurrent, *steps, failure, *events])


def test_the_recurrence_clip_is_proposed_only_where_no_other_clip_is_tried():
    from nandoctor.recurrence import hand_updated_recurrence_finding
    from nandoctor.stages.lr_sweep import Settings

    finding = hand_updated_recurrence_finding(_watch(), Settings())
    assert finding.code == "EG604" and finding.remedy["kind"] == "clip_gradients"
    assert 1.0 < finding.remedy["max_norm"] < 10.0  # above the ordinary norms of the first steps
    # an optimizer the sweep scales tries the clip itself (EG502); a script that clips
    # already is no case for adding one
    for event in ({"event": "optimizer"}, {"event": "gradient_clip"}):
        assert hand_updated_recurrence_finding(_watch(event), Settings()) is None
