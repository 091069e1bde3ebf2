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
