"""From findings to ranked causes: causal rules across stages, then a deterministic order."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from nandoctor.codes import measured_confidence
from nandoctor.gradient_spikes import cliff_finding, find_cliff
from nandoctor.report.model import Cause, Finding, Location
from nandoctor.source_values import (
    SKIPPED_CLIP,
    WrittenAt,
    clip_setting,
    clipping_call,
    framework_name,
    hand_update_rate,
    lightning_trainer,
    passes_a_keyword,
    precision_setting,
    where_written,
)

_SEVERITY_ORDER = {"error": 0, "warning": 1}
_GROWTH_FACTOR_LOSS = 10.0  # loss before the failure this many times its early minimum...
_GROWTH_FACTOR_GRAD = 100.0  # ...or the gradient norm this many times its first value
_SYMPTOM_DISCOUNT = 0.6  # confidence kept by a finding another finding explains
_STRONG = 0.85  # a finding this confident can explain away another stage's
_KEPT_BELOW = 0.9  # a rate explained by a fix that held at it: this fraction of its confidence
# A fix at the original rate trains when its loss falls at least this share as far as at a
# smaller rate (the clip experiment asks the same, stages/lr_sweep/conclusions.py).
_AS_FAR = 0.5


@dataclass(frozen=True)
class RunFacts:
    """What the watched run measured, for reasoning across stages."""

    failed_step: int | None = None  # optimizer step of the first NaN/Inf that mattered
    failed_in_the_update: bool = False  # ... born inside optimizer.step(), which the lr scales
    losses: tuple = ()
    grad_norms: tuple = ()
    optimizer_location: Location | None = None
    loss_scale: dict | None = None  # a large constant the loss was multiplied by before backward()
    # Where the script entered a float16/bfloat16 autocast region, when that region (and not
    # the model's own weights) is what computed below float32.
    autocast: dict | None = None
    # Under autocast, the reduced dtype breaks a value the failing op's own formula brings (an
    # eps that rounds to 0, a -1e10 cast to float16), rather than values that grew past its
    # range: that op's line is what to edit, not where the precision was chosen.
    dtype_breaks_the_formula: bool = False
    # The learning-rate sweep's summary when a much smaller rate failed at about the same step.
    rate_ruled_out: str | None = None
    # The user's line of the backward() call that preceded the failure.
    backward_call: Location | None = None


def _finite(values) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def growth_before_failure(facts: RunFacts) -> str | None:
    """Evidence that values blew up over several steps before the failure, or None."""
    if growth := loss_growth(facts.losses):
        return growth
    norms = _finite(facts.grad_norms)
    if len(norms) >= 3 and norms[0] > 0 and norms[-1] > _GROWTH_FACTOR_GRAD * norms[0]:
        return f"the gradient norm grew from {norms[0]:.4g} to {norms[-1]:.4g} before the failure"
    return None


def loss_growth(losses) -> str | None:
    """The loss's last steps an order of magnitude above its early minimum, or None."""
    finite = _finite(losses)
    if len(finite) >= 3:
        early = min(finite[: max(1, len(finite) // 2)])
        late = max(finite[-3:])
        if early > 0 and late > _GROWTH_FACTOR_LOSS * early:
            return f"the loss grew from {early:.4g} to {late:.4g} before the failure"
    return None


def diverged_then_died(losses, died: bool) -> tuple[int, str] | None:
    """(step, evidence) when a script that died (an exception, a non-zero exit) with no
    NaN/Inf seen had seen its loss grow by an order of magnitude first: `OverflowError` in
    `math.exp(loss)`, an assert on the loss. That death is the failure to diagnose."""
    growth = loss_growth(losses) if died else None
    return (len(losses) - 1, growth) if growth else None


def scaled_loss(facts: RunFacts) -> Finding | None:
    """The loss was multiplied by a large constant before backward() with no GradScaler: every
    gradient is that many times too large unless the script divides it back."""
    if facts.loss_scale is None:
        return None
    factor = facts.loss_scale["factor"]
    return Finding(
        stage="diagnosis",
        category="exploding_gradients",
        title=f"the loss is multiplied by {factor:.4g} before backward(): gradients {factor:.3g}x too large",
        confidence=0.8,
        evidence=(
            f"backward() was called on the loss times {factor:.4g}, and no GradScaler was used",
            "unless each gradient is divided by that factor before optimizer.step(), every "
            "update is that many times too large",
        ),
        fix=(
            "divide the gradients by the scale before `optimizer.step()` or drop the scaling in "
            "float32 (`torch.amp.GradScaler` does both for mixed precision), and clip them: "
            "`torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)`"
        ),
        location=Location.from_dict(facts.loss_scale.get("location")),
        remedy={"kind": "clip_gradients", "max_norm": 1.0},
        code="EG601",
    )


def _still_improving(facts: RunFacts) -> bool:
    """The loss fell over the steps before the failure (at least a few of them)."""
    losses = _finite(facts.losses)
    return len(losses) >= 4 and losses[-1] < losses[0] and min(losses[-3:]) <= min(losses)


def _discounted(finding: Finding, reason: str) -> Finding:
    return dataclasses.replace(
        finding,
        confidence=finding.confidence * _SYMPTOM_DISCOUNT,
        evidence=(*finding.evidence, reason),
    )


def calibrated(finding: Finding) -> Finding:
    """The finding with its confidence moved towards its code's record on the dev split."""
    if not finding.code:
        return finding
    return dataclasses.replace(
        finding, confidence=measured_confidence(finding.code, finding.confidence)
    )


def apply_causal_rules(findings: list[Finding], facts: RunFacts) -> list[Finding]:
    """Reason across stages: what happened first and what explains what. Confidences start
    from each code's measured record (codes.py), then the rules move them."""
    result = [calibrated(f) for f in findings]
    if facts.failed_step == 0 and not facts.failed_in_the_update:
        # Step 0's loss comes from the first forward pass, before any update: the learning
        # rate cannot have caused it (the first update itself it scales).
        result = [
            dataclasses.replace(f, severity="hint") if f.category == "learning_rate" else f
            for f in result
        ]
    # Growth the learning rate does not drive says nothing against the failing op's formula.
    growth = (
        growth_before_failure(facts) if facts.failed_step and not facts.rate_ruled_out else None
    )
    cliff = find_cliff(facts.grad_norms, facts.losses, facts.failed_step)
    if cliff is not None:
        # One step's gradient jumped after steady steps: the growth after it is the update it
        # drove, not a rate too high (gradient_spikes.py).
        result.append(calibrated(cliff_finding(cliff, facts.optimizer_location)))
        result = _learning_rate_discounted(
            result, f"explained by the gradient that jumped at step {cliff.step}"
        )
        growth = growth and f"the gradient norm jumped at step {cliff.step}"
    if (
        not growth
        and _still_improving(facts)
        and any(f.stage == "anomaly" and f.category == "invalid_operation" for f in result)
    ):
        # A domain error hit while training was going well: a smaller learning rate only
        # postpones the step that reaches it (a sigmoid saturating to exactly 1 under log).
        result = [
            _discounted(f, "the loss was still falling when the op failed: a smaller learning "
                        "rate only postpones reaching it")
            if f.category == "learning_rate" else f
            for f in result
        ]  # fmt: skip
    if growth:
        result = [
            _discounted(f, f"a symptom: {growth}")
            if f.stage in ("anomaly", "device_compare")
            and f.category in ("invalid_operation", "precision")
            else f
            for f in result
        ]
        if cliff is None and not any(
            f.category == "learning_rate" and f.severity != "hint" for f in result
        ):
            result.append(calibrated(_learning_rate_suspect(growth, facts)))
    if any(f.stage == "device_compare" and f.category == "precision" and f.severity == "error"
           and f.confidence >= _STRONG for f in result):  # fmt: skip
        # A float64 reference stayed finite where the run did not: the domain error is made by
        # rounding, and clamping its input would only hide that.
        result = [
            dataclasses.replace(_discounted(f, "explained by precision: a float64 reference stays finite"), remedy=None)
            if f.stage == "anomaly" and f.category == "invalid_operation"
            else f
            for f in result
        ]  # fmt: skip
    if any(f.code == "OC103" for f in result):
        # A quotient of the update outgrew float32 whatever the rate (a denominator decaying
        # towards 0): the oversized updates it made are what grew the loss before it.
        result = _learning_rate_discounted(
            result, "explained by the optimizer update's own quotient, which outgrew float32"
        )
    if facts.rate_ruled_out:
        result = _learning_rate_discounted(
            result, f"the learning-rate sweep rules it out: {facts.rate_ruled_out}"
        )
    if any(_absurd_setting(f) and f.category == "optimizer_config" for f in result):
        # weight_decay=1000 or momentum=1.5 with a learning rate in range: a smaller learning
        # rate helps only by shrinking the absurd setting's effect (lr x weight_decay, say)
        result = _learning_rate_discounted(
            result, "explained by an optimizer setting far outside any sensible range"
        )
    if _chosen_in_script(facts.autocast) and not facts.dtype_breaks_the_formula:
        result = [_at_the_autocast_line(f, facts.autocast) if f.category == "precision" else f
                  for f in result]  # fmt: skip
    if facts.failed_step is not None and (scaled := scaled_loss(facts)):
        result.append(calibrated(scaled))
    init_errors = [f for f in result if f.category == "initialization" and f.severity == "error"]
    if init_errors and facts.failed_step is not None and facts.failed_step <= 1:
        result = [
            _discounted(f, "explained by the initialization: the weights were already out of scale")
            if f.stage == "anomaly" and f.category in ("precision", "learning_rate")
            else f
            for f in result
        ]  # fmt: skip
    return result


def apply_verified_rules(
    findings: list[Finding], clip_off: WrittenAt | None = None
) -> list[Finding]:
    """Reason over what the verification re-runs showed. A fix that lets the run train at the
    original learning rate makes what it fixes the root cause: a guard of the failing op (the
    formula), float32 where a reduced precision was in use (the dtype), gradient clipping
    whose loss falls as far as at a smaller rate (the spikes), or the inputs standardized
    (their scale). A smaller learning rate that also helps only
    postpones the step that reaches the op's edge, or shrinks every step to shrink the rare
    huge ones: it is ranked below the fix that held, whatever confidence each started with,
    so that the order never contradicts the reason the report gives. `clip_off`: the
    script's own clipping setting, when it switches clipping off (`grad_clip=None`,
    `--clip 0`); clipping that trains at the original rate then leads: the script provides
    the remedy for its rate, and it is off."""
    findings = _short_of_the_rate_kept_below(findings)
    held, reason = _held_at_the_rate(findings, clip_off)
    if not held:
        return findings
    return _learning_rate_kept_below(findings, held, reason)


def _trains_at_the_rate(finding: Finding) -> bool:
    """A fix at the original learning rate that held: a guard of the failing op, float32, the
    inputs standardized."""
    return _guard_held(finding) or _float32_held(finding) or _standardizing_held(finding)


def _short_of_the_rate(finding: Finding, findings: list[Finding]) -> str | None:
    """Why a fix that kept the original rate finite still does not train there, or None: its
    loss fell less than `_AS_FAR` as far as at the largest smaller rate that trains, both
    counted from step 0. It hides the symptom (a blow-up that recovered slowly, a loss that
    stalled high) of updates too large; that rate is the one to lower."""
    # A loss that does not fall at the smaller rate either (a policy's, an adversary's) says
    # nothing about which one trains.
    rates = [f.progress for f in findings
             if f.category == "learning_rate" and f.progress and f.progress > 0]  # fmt: skip
    if not rates or finding.progress is None or finding.progress >= _AS_FAR * max(rates):
        return None
    return (f"its fix keeps ×1 finite, but there the loss {_moved(finding.progress)} from "
            f"where it started, and at a smaller learning rate it {_moved(max(rates))}: the "
            "failure was a symptom of updates too large")  # fmt: skip


def _moved(fraction: float) -> str:
    return f"fell {fraction:.0%}" if fraction >= 0 else f"rose {-fraction:.0%}"


def _short_of_the_rate_kept_below(findings: list[Finding]) -> list[Finding]:
    short = {id(f): why for f in findings
             if _trains_at_the_rate(f) and (why := _short_of_the_rate(f, findings))}  # fmt: skip
    if not short:
        return findings
    rates = [f.confidence for f in findings if f.category == "learning_rate" and f.progress]
    below = _KEPT_BELOW * max(rates)
    return [dataclasses.replace(f, confidence=min(f.confidence, below), verified_fix=False,
                                evidence=(*f.evidence, short[id(f)]))
            if id(f) in short else f
            for f in findings]  # fmt: skip


def _held_at_the_rate(
    findings: list[Finding], clip_off: WrittenAt | None
) -> tuple[list[Finding], str]:
    """The findings whose verified fix trains at the original learning rate, and why that
    puts the rate below them; the first kind that held, in the order of the checks."""
    if held := [f for f in findings if _guard_held(f)]:
        return held, ("a guard of the failing op trains at the original learning rate: the "
                      "formula, not the learning rate, is what to fix")  # fmt: skip
    if held := [f for f in findings if _float32_held(f)]:
        return held, ("the same run in float32 trains at the original learning rate: the "
                      "reduced precision, not the learning rate, is what to fix")  # fmt: skip
    if held := [f for f in findings if _clip_kept_the_rate(f)]:
        return held, ("gradient clipping trains at the original learning rate as well as a "
                      "smaller rate does: the gradient spikes, not the rate, are what to "
                      "fix")  # fmt: skip
    if clip_off is not None and (held := [f for f in findings if _clip_trains_at_the_rate(f)]):
        # The clip's own confidence is low when it acted on most steps (a smaller step size by
        # another name): with the script's own clip switched off, it still leads the rate.
        return held, (f"the script's own gradient clipping is switched off (line "
                      f"{clip_off.line}: `{clip_off.code}`) and clipping trains at the "
                      "original learning rate: switching it on, not a smaller rate, is what "
                      "to fix")  # fmt: skip
    if held := [f for f in findings if _standardizing_held(f)]:
        # A data finding's confidence is low on its own (most large inputs are fine).
        return held, ("the same inputs standardized train at the original learning rate: "
                      "their scale, not the rate, is what to fix")  # fmt: skip
    return [], ""


def _learning_rate_kept_below(
    findings: list[Finding], held: list[Finding], reason: str
) -> list[Finding]:
    below = _KEPT_BELOW * max(f.confidence for f in held)
    return [dataclasses.replace(f, confidence=min(f.confidence, below))
            if f.category == "learning_rate" and not _absurd_setting(f) else f
            for f in _learning_rate_discounted(findings, reason)]  # fmt: skip


def _held(finding: Finding, category: str, *kinds: str) -> bool:
    """`finding` is of `category` and its fix, a remedy of one of `kinds`, held when re-run."""
    return (
        finding.category == category
        and bool(finding.verified_fix)
        and (finding.remedy or {}).get("kind") in kinds
    )


def _guard_held(finding: Finding) -> bool:
    return _held(finding, "invalid_operation", "guard_op", "move_bound",
                 "population_statistics", "finite_fill")  # fmt: skip


def _float32_held(finding: Finding) -> bool:
    return _held(finding, "precision", "float32", "float32_at")


def _standardizing_held(finding: Finding) -> bool:
    return _held(finding, "data", "standardize_inputs")


def _verified_clip(finding: Finding) -> dict:
    """The remedy of a gradient-clipping fix that held, or {}."""
    return finding.remedy if _held(finding, "exploding_gradients", "clip_gradients") else {}


def _clip_kept_the_rate(finding: Finding) -> bool:
    remedy = _verified_clip(finding)
    # the sweep's clip at x1, or the script's own clip made to act (at its own rate)
    return bool(remedy.get("keeps_the_rate") or remedy.get("script_clip"))


def _clip_trains_at_the_rate(finding: Finding) -> bool:
    return bool(_verified_clip(finding).get("trains_at_the_rate"))


def _learning_rate_discounted(findings: list[Finding], reason: str) -> list[Finding]:
    """Learning-rate findings explained by something else, except a learning rate that is
    itself far outside any sensible range."""
    return [
        _discounted(f, reason) if f.category == "learning_rate" and not _absurd_setting(f) else f
        for f in findings
    ]


def _absurd_setting(finding: Finding) -> bool:
    return (finding.remedy or {}).get("kind") == "optimizer_settings"


def _at_the_autocast_line(finding: Finding, autocast: dict) -> Finding:
    """A reduced precision that autocast chose is changed where the region is entered (its
    dtype, or the op taken out of it): that line leads, the op's own line stays as evidence."""
    location = Location.from_dict(autocast.get("location"))
    if location is None or location == finding.location:
        return finding
    op_line = f" (the op is at {finding.location.short()})" if finding.location else ""
    dtype = autocast.get("dtype")
    evidence = (
        f"it computed in {dtype} inside the autocast region entered at {location.short()}{op_line}"
    )
    remedy = finding.remedy
    if (remedy or {}).get("kind") == "float32_at":
        remedy = {"kind": "float32"}  # the fix is now the region's, not the op's line
    return dataclasses.replace(finding, location=location, remedy=remedy,
                               evidence=(*finding.evidence, evidence))  # fmt: skip


def _learning_rate_suspect(growth: str, facts: RunFacts) -> Finding:
    return Finding(
        stage="diagnosis",
        category="learning_rate",
        title="the run diverged before it produced NaN/Inf",
        confidence=0.7,
        evidence=(growth, f"the first NaN/Inf came only at step {facts.failed_step}"),
        fix="lower the learning rate (`nandoctor sweep-lr` finds a stable one) or add warmup",
        location=facts.optimizer_location,
        code="LR601",
    )


def _merged(group: list[Finding]) -> Finding:
    """One finding per category: the strongest, with the others' evidence beside it."""
    best = _at_the_first_nonfinite(group, _the_script_s_own_clip(group))
    evidence = list(best.evidence)
    for other in group[1:]:
        evidence += [f"[{other.stage}] {line}" for line in other.evidence if line not in evidence]
    verified = True if any(f.verified_fix for f in group) else best.verified_fix
    return dataclasses.replace(best, evidence=tuple(evidence), verified_fix=verified)


def _at_the_first_nonfinite(group: list[Finding], best: Finding) -> Finding:
    """Of findings that stand equal (two parameters left uninitialized, one per model), the one
    at the line the anomaly stage traced the first NaN/Inf to leads: fixing the other first
    leaves the failure as it was."""
    traced = next((f.location for f in group if f.stage == "anomaly" and f.location), None)
    if traced is None or best.location == traced:
        return best
    return next((f for f in group if f.location == traced and _order(f)[:3] == _order(best)[:3]),
                best)  # fmt: skip


def _the_script_s_own_clip(group: list[Finding]) -> Finding:
    """A clip the sweep found to train, and a clip the script already calls that never acted
    (EG603), are one cause: the fix is the script's own call, so that finding leads its
    category, with the strongest confidence of the group."""
    best = group[0]
    own = next((f for f in group if (f.remedy or {}).get("script_clip")), None)
    if own is None or own is best or (best.remedy or {}).get("kind") != "clip_gradients":
        return best
    return dataclasses.replace(own, confidence=max(own.confidence, best.confidence))


def _order(finding: Finding) -> tuple:
    return (
        0 if finding.verified_fix else 1,
        -finding.confidence,
        _SEVERITY_ORDER[finding.severity],
        finding.category,
        finding.title,
    )


def rank_causes(findings: list[Finding]) -> list[Cause]:
    """Errors and warnings become causes (hints never do), one per category; a verified fix
    outranks a guess, then confidence decides; ties break by category and title."""
    candidates = sorted((f for f in findings if f.severity in _SEVERITY_ORDER), key=_order)
    by_category: dict[str, list[Finding]] = {}
    for finding in candidates:
        by_category.setdefault(finding.category, []).append(finding)
    merged = sorted((_merged(group) for group in by_category.values()), key=_order)
    return [
        Cause(
            rank=rank,
            category=f.category,
            title=f.title,
            confidence=round(f.confidence, 2),
            evidence=f.evidence,
            fix=f.fix,
            location=f.location,
            verified_fix=f.verified_fix,
            stage=f.stage,
            code=f.code,
        )
        for rank, f in enumerate(merged, 1)
    ]


# The keywords that carry a learning rate in an optimizer's or a scheduler's constructor.
_LR_KEYWORDS = ("lr", "max_lr", "base_lr")


def at_the_written_value(
    findings: list[Finding],
    script_args=(),
    hand_updated_in: str | None = None,
    optimizer_at: Location | None = None,
) -> list[Finding]:
    """A learning-rate or optimizer-setting cause leads with the line where the offending value
    is written (`lr = 3.0`, an argparse default, a config entry), the constructor that uses it
    staying as evidence: that literal is what the user edits. `hand_updated_in`: the script,
    when it updates its parameters itself; its rate is written where that update's is.
    `optimizer_at`: where the run's one optimizer with a rate was built, for a rate cause
    located at the op that overflowed."""
    return [
        _relocated(_at_the_optimizer(f, optimizer_at), script_args, hand_updated_in)
        for f in findings
    ]


def _at_the_optimizer(finding: Finding, optimizer_at: Location | None) -> Finding:
    location = finding.location
    if (finding.category != "learning_rate" or optimizer_at is None or location is None
            or passes_a_keyword(location.file, location.line, _LR_KEYWORDS)):  # fmt: skip
        return finding
    note = f"the rate is the optimizer's, built at {optimizer_at.short()}; the overflow came at {location.short()}"
    return dataclasses.replace(finding, location=optimizer_at, evidence=(*finding.evidence, note))


def at_the_clip_setting(
    findings: list[Finding], script: str, script_args=(), backward_call: Location | None = None
) -> list[Finding]:
    """A clipping fix leads with the line where the script sets its gradient clipping (a config's
    `grad_clip=None`, an argparse `--clip` default, its own `clip_grad_norm_` call): that is what
    the user edits. Without such a setting, with the line where a clip goes: the Lightning
    `Trainer(...)` (its `gradient_clip_val=`), or the `backward()` call of the failing step, after
    which `clip_grad_norm_` is inserted (`backward_call`, the user's line of that call)."""
    return [_at_the_clip_setting(f, script, script_args, backward_call) for f in findings]


def at_the_precision_setting(
    findings: list[Finding], script: str, script_args, facts: RunFacts
) -> list[Finding]:
    """A reduced precision that a framework option chose (Lightning's `precision="16-true"`, an
    argparse `--precision` default, accelerate's `mixed_precision`, the HF Trainer's `fp16`) is
    changed at that option: it leads, the op's own line staying as evidence. An autocast region
    the script enters itself is its own line (apply_causal_rules), and an optimizer eps that
    rounds to zero is fixed at the eps, a formula the dtype breaks at the formula."""
    moves = [f.category == "precision" and f.code not in _FIXED_AT_THE_EPS for f in findings]
    if not any(moves) or facts.dtype_breaks_the_formula:
        return findings
    if _chosen_in_script(facts.autocast):
        return [_at_the_autocast_dtype(f, facts.autocast, script_args) if move else f
                for f, move in zip(findings, moves, strict=True)]  # fmt: skip
    setting = precision_setting(script, tuple(script_args))
    if setting is None:
        return findings
    return [_at_the_setting(f, script, setting, "the reduced precision is chosen",
                            "the op that failed in it is at") if move else f
            for f, move in zip(findings, moves, strict=True)]  # fmt: skip


_FIXED_AT_THE_EPS = ("PR102",)


def _at_the_autocast_dtype(finding: Finding, autocast: dict, script_args) -> Finding:
    """An autocast region the script enters with a dtype named elsewhere (`dtype=AMP_DTYPE`,
    `dtype=args.amp_dtype`, `dtype=cfg["dtype"]`) is changed where that name is written."""
    entered = Location.from_dict(autocast.get("location"))
    if entered is None or finding.location != entered or entered.line is None:
        return finding
    written = where_written(entered.file, entered.line, "dtype", script_args)
    if written is None or written.line == entered.line:
        return finding
    return _at_the_setting(finding, entered.file, written, "the autocast dtype is written",
                           "the autocast region is entered at")  # fmt: skip


def _chosen_in_script(autocast: dict | None) -> bool:
    return autocast is not None and bool(autocast.get("in_script"))


def _at_the_clip_setting(
    finding: Finding, script: str, script_args, backward_call: Location | None
) -> Finding:
    remedy = finding.remedy or {}
    if remedy.get("kind") != "clip_gradients" or remedy.get("script_clip"):
        return finding  # a clip the script has but that never acted is located where it fails
    files = dict.fromkeys([script, *([finding.location.file] if finding.location else [])])
    found = ((f, clip_setting(f, tuple(script_args))) for f in files)
    file, setting = next(((f, s) for f, s in found if s is not None), (None, None))
    if setting is None:
        return _where_a_clip_goes(finding, script, backward_call)
    what = ("the script's own clipping is skipped in this run by the condition"
            if setting.how == SKIPPED_CLIP else "gradient clipping is set")  # fmt: skip
    if setting.how == "the command line" and (call := clipping_call(file)) is not None:
        # The value is the command line's; the line of the script it acts in is the call.
        note = f"{what} on the command line ({setting.code}), used by the clipping call"
        return _at_the_setting(finding, file, call, note, "the optimizer is built at")
    return _at_the_setting(finding, file, setting, what, "the optimizer is built at")


def _where_a_clip_goes(finding: Finding, script: str, backward_call: Location | None) -> Finding:
    """A script that never sets gradient clipping: Lightning clips where its Trainer is built;
    a loop of the script's own, right after its `backward()`, before the optimizer's step."""
    trainer = lightning_trainer(script)
    if trainer is not None:
        return _at_the_setting(finding, script, trainer,
                               "Lightning clips gradients with `gradient_clip_val=` in its Trainer",
                               "the optimizer is built at")  # fmt: skip
    if backward_call is None or backward_call.line is None or backward_call == finding.location:
        return finding
    note = f"the clip goes right after the backward() at {backward_call.short()}, before the step"
    if finding.location is not None:
        note += f"; the optimizer is built at {finding.location.short()}"
    return dataclasses.replace(finding, location=backward_call, evidence=(*finding.evidence, note))


def _at_the_setting(finding: Finding, file: str, setting, what: str, was: str) -> Finding:
    """`finding` led by the line of `setting` (the script's own text for `what`), its former
    location (`was` ...) kept as evidence; a setting given on the command line is only said."""
    if setting.how == "the command line":
        note = f"{what} on the command line ({setting.code})"
        return dataclasses.replace(finding, evidence=(*finding.evidence, note))
    note = f"{what} at line {setting.line}: `{setting.code}`"
    if finding.location is not None:
        note += f"; {was} {finding.location.short()}"
    moved = Location(file, setting.line, None, setting.code)
    return dataclasses.replace(finding, location=moved, evidence=(*finding.evidence, note))


def at_the_producing_line(
    findings: list[Finding], numpy_errors: list[dict], failed_step
) -> list[Finding]:
    """Non-finite values that entered torch from numpy lead with the line where numpy made
    them (a 0/0 in a standardization, a log of 0), the line where they entered torch staying
    as evidence: that line is what the user edits."""
    made = [e for e in numpy_errors if e.get("location") and failed_step is not None
            and e.get("step", 0) <= failed_step]  # fmt: skip
    if not made:
        return findings
    return [_at_the_numpy_line(f, made) if f.code in _ENTERED_FROM_DATA else f for f in findings]


_ENTERED_FROM_DATA = ("DA101", "DA201")


def _at_the_numpy_line(finding: Finding, made: list[dict]) -> Finding:
    entered = finding.location
    same_file = [e for e in made if entered is None or e["location"]["file"] == entered.file]
    error = _first_of_the_last_step(same_file or made)
    produced = Location.from_dict(error["location"])
    if produced is None or produced == entered:
        return finding
    note = (f"numpy made non-finite values at {produced.short()} ({error['error']}: "
            f"`{(produced.code or '').strip()}`)")  # fmt: skip
    if entered is not None:
        note += f"; they entered torch at {entered.short()}"
    return dataclasses.replace(finding, location=produced, evidence=(note, *finding.evidence))


def _first_of_the_last_step(errors: list[dict]) -> dict:
    """Of numpy's errors (each line once, in the order first seen), the first one seen at the
    step of the latest: within one batch's preprocessing the first error is upstream of the
    rest (255 / 0 is inf, then 0 * inf is NaN on the next line), and the latest step is the
    one nearest the failure."""
    last_step = errors[-1].get("step", 0)
    return next(e for e in errors if e.get("step", 0) == last_step)


def _relocated(finding: Finding, script_args, hand_updated_in: str | None = None) -> Finding:
    location = finding.location
    if hand_updated_in is not None and finding.category == "learning_rate":
        return _at_the_hand_update_rate(finding, hand_updated_in, script_args)
    if location is None:
        return finding
    keywords = _setting_keywords(finding)
    for keyword in keywords:
        written = where_written(location.file, location.line, keyword, tuple(script_args))
        if written is None or written.line == location.line:
            continue
        if written.how == "the command line":
            note = f"{keyword} is given on the command line ({written.code})"
            return dataclasses.replace(finding, evidence=(*finding.evidence, note))
        note = f"{keyword} is written at line {written.line} ({written.how}) and used at {location.short()}"
        moved = Location(location.file, written.line, None, written.code)
        return dataclasses.replace(finding, location=moved, evidence=(*finding.evidence, note))
    if keywords and not passes_a_keyword(location.file, location.line, keywords):
        return _given_to_the_framework(finding, keywords[0], script_args)
    return finding


def _at_the_hand_update_rate(finding: Finding, script: str, script_args) -> Finding:
    """A script without an optimizer object: the rate is the one its own update step uses
    (`p.data.add_(p.grad, alpha=-lr)`), written where that update's rate is written."""
    files = dict.fromkeys([script, *([finding.location.file] if finding.location else [])])
    found = ((f, hand_update_rate(f, tuple(script_args))) for f in files)
    file, written = next(((f, w) for f, w in found if w is not None), (None, None))
    if written is None:
        return finding
    if written.how == "the command line":
        note = f"the script updates its parameters itself; its rate is given on the command line ({written.code})"
        return dataclasses.replace(finding, evidence=(*finding.evidence, note))
    note = f"the script updates its parameters itself; its rate is written at line {written.line} ({written.how})"
    if finding.location is not None:
        note += f"; the overflow came at {finding.location.short()}"
    moved = Location(file, written.line, None, written.code)
    return dataclasses.replace(finding, location=moved, evidence=(*finding.evidence, note))


def _given_to_the_framework(finding: Finding, keyword: str, script_args) -> Finding:
    """An optimizer the framework builds (the HF Trainer's, from its `TrainingArguments`): the
    setting is edited where the script gives it to the framework, under the framework's name."""
    location = finding.location
    found = framework_name(location.file, keyword, tuple(script_args))
    if found is None:
        return finding
    name, written = found
    if written.how == "the command line":
        note = f"the framework builds the optimizer: its {keyword} is `{name}` on the command line ({written.code})"
        return dataclasses.replace(finding, evidence=(*finding.evidence, note))
    note = (f"the framework builds the optimizer (at {location.short()}): its {keyword} is "
            f"`{name}`, written at line {written.line} ({written.how})")  # fmt: skip
    moved = Location(location.file, written.line, None, written.code)
    fix = (
        finding.fix
        and f"{finding.fix} (the framework builds it from `{name}`, at line {written.line})"
    )
    return dataclasses.replace(finding, location=moved, fix=fix, evidence=(*finding.evidence, note))


def _setting_keywords(finding: Finding) -> tuple[str, ...]:
    """The keywords of the setting the finding's fix edits, for a learning rate, an optimizer
    setting, or an eps that rounds to zero in the parameters' precision."""
    if finding.category == "learning_rate":
        return _LR_KEYWORDS
    if finding.code in _FIXED_AT_THE_EPS:
        return ("eps",)
    if finding.category != "optimizer_config":
        return ()
    remedy = finding.remedy or {}
    if remedy.get("kind") == "optimizer_settings":
        return tuple(remedy["settings"])
    if remedy.get("kind") == "optimizer_eps":
        return ("eps",)
    return ()
