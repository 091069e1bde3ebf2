"""Gradients that exploded through a recurrence in a script that updates its weights by hand.

Gradients through a recurrence are products of one Jacobian per time step, and they explode
geometrically with the length of the chain (Pascanu et al., 2013): the remedy is to clip them.
Where the script builds a torch.optim optimizer, the learning-rate sweep re-runs x1 with
gradients clipped and weighs the clip against a smaller rate (EG502). A script that updates its
parameters itself (`p.data.add_(p.grad, alpha=-lr)`, the old char-RNN tutorials) gives the
sweep no rate to scale, so nothing would try the clip: this finding proposes it when the
watched run shows both a recurrence and a gradient norm that rose by orders of magnitude before
the failure, and the fix's re-run (verify.py, which clips right after each backward pass)
decides whether it is the cause.
"""

from __future__ import annotations

from nandoctor.report.model import Finding
from nandoctor.runner import RunOutcome
from nandoctor.stages.lr_sweep.search import clip_value
from nandoctor.stages.lr_sweep.verdicts import gradient_explosion

_EXPLOSION = 100.0  # the gradient norm rose this many times above its early level


def hand_updated_recurrence_finding(watch: RunOutcome, settings) -> Finding | None:
    """The clip to try for a recurrence whose gradients exploded when no sweep can try it, or
    None. `settings`: the sweep's (lr_sweep.Settings), whose rules pick the clip value."""
    failed = watch.failed_step
    recurrent = watch.first("recurrent")
    if failed is None or recurrent is None or not watch.updates_by_hand:
        return None
    if watch.all("gradient_clip"):
        return None  # the script clips already: a clip that acted is no remedy, one that
        # never acted is EG603's
    norms = watch.grad_norms[:failed]
    explosion = gradient_explosion(norms, _EXPLOSION)
    value = clip_value(norms[: max(1, len(norms) // 3)], settings)
    if explosion is None or value is None:
        return None
    return Finding(
        stage="diagnosis",
        category="exploding_gradients",
        title=f"gradients explode through the recurrence of {recurrent['module']}, and the "
        "script clips none",
        confidence=0.7,
        evidence=(
            f"{recurrent['module']} ({recurrent['type']}) is applied {recurrent['chain']} times "
            "in a row to its own output",
            f"the gradient norm rose from {explosion.level:.3g} to {explosion.peak:.3g} before the "
            "failure",
            "the script updates its parameters itself: no optimizer whose rate a sweep could "
            "scale, and no gradient clipping",
        ),
        fix=(
            "clip gradients after `loss.backward()` and before the update: "
            f"`torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm={value:g})` (above "
            "the ordinary norms of the first steps); the learning rate can stay"
        ),
        location=None,
        remedy={"kind": "clip_gradients", "max_norm": value},
        code="EG604",
    )
