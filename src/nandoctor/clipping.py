"""Gradient clipping the script relies on but that never acts.

A script that calls `clip_grad_norm_` was written to survive rare huge gradients. Three
mistakes leave the call in place and the gradients unclipped, and each is seen directly when
the clip runs:
- it is given no tensors: `params = model.parameters()` made once is a generator, and the
  first call consumes it (pytorch/pytorch#148259); every later call clips an empty list;
- no tensor it is given has a gradient: it runs before `backward()` or after `zero_grad()`;
- it runs after `optimizer.step()`: the update already used the unclipped gradients.
In a run that then failed, the failure came through the protection the script meant to have:
the cause is exploding gradients, fixed by making that clip act (its re-run clips at the
script's own max_norm before each step, at the script's own learning rate).
"""

from __future__ import annotations

import math

from nandoctor.report.model import Finding, Location
from nandoctor.source_values import clipped_argument

_WHAT_WENT_WRONG = {
    "no_tensors": "it was given no tensors",
    "no_gradients": "none of the tensors it was given had a gradient",
    "after_step": "it ran after optimizer.step(), which had already used the unclipped gradients",
}
_FIX = {
    "no_tensors": "pass the clip a list it can read at every call: "
    "`params_to_clip = list(model.parameters())`, or `model.parameters()` in the call itself",
    "no_gradients": "call the clip between `loss.backward()` and `optimizer.step()`",
    "after_step": "call the clip between `loss.backward()` and `optimizer.step()`",
}


def ineffective_clip_findings(clips: list[dict], failed_step: int | None) -> list[Finding]:
    """One finding for the first way the script's clipping failed to act before the failure."""
    if failed_step is None:
        return []
    first = next((c for c in clips if c.get("problem") and c["step"] <= failed_step), None)
    return [] if first is None else [_finding(first, clips)]


def _finding(clip: dict, clips: list[dict]) -> Finding:
    problem, step, limit = clip["problem"], clip["step"], clip.get("limit")
    call = Location.from_dict(clip.get("location"))
    evidence = [
        f"{clip['kind']} at step {step}: {_WHAT_WENT_WRONG[problem]}, so that step's "
        "update was not clipped"
    ]
    if earlier := next((c for c in clips if c.get("problem") is None and c["step"] < step), None):
        evidence.append(f"at step {earlier['step']} a clip was given {earlier['tensors']} "
                        f"tensors, {earlier['with_grad']} with a gradient")  # fmt: skip
    location = call
    made = clipped_argument(call.file, call.line) if problem == "no_tensors" and call else None
    if made is not None:
        evidence.append(f"what it is given is made once, at line {made.line}: `{made.code}`; "
                        f"the clip is called at {call.short()}")  # fmt: skip
        location = Location(call.file, made.line, None, made.code)
    given = (made.code if made else call.code if call else None) or ""
    if problem == "no_tensors" and (clip.get("iterator") or ".parameters()" in given):
        evidence.append("`model.parameters()` is a generator: empty once an earlier call has "
                        "read it")  # fmt: skip
    evidence.append("the script meant its gradients clipped, and the updates before the "
                    "failure were not")  # fmt: skip
    by_norm = clip["kind"] == "clip_grad_norm_" and _positive(limit)
    return Finding(
        stage="diagnosis",
        category="exploding_gradients",
        title=f"the script's gradient clipping did not bound the updates from step {step} on: "
        f"{_WHAT_WENT_WRONG[problem].split(',')[0]}",
        confidence=0.8,
        evidence=tuple(evidence),
        fix=_FIX[problem],
        location=location,
        remedy={"kind": "clip_gradients", "max_norm": limit, "script_clip": True}
        if by_norm
        else None,
        code="EG603",
    )


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0
