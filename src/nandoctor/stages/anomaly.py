"""Anomaly stage: the op where the NaN/Inf that mattered was born, and the cause it points at."""

from __future__ import annotations

import dataclasses

from nandoctor.codes import CODES
from nandoctor.compiled_only import compiled_only_finding, only_compiled
from nandoctor.fixes import (
    GUARDABLE_OPS,
    SAMPLE_STATISTICS,
    bound_remedy,
    finite_fill_remedy,
    guard_for,
    guard_remedy,
    population_statistics_remedy,
)
from nandoctor.instrument.kinds import (
    CONSTANT_OVERFLOW,
    CONVERSION_OVERFLOW,
    DIVISION_BY_ZERO,
    DOMAIN,
    EMPTY_REDUCTION,
    MASKED_SOFTMAX,
    NONFINITE_INPUT,
    NONFINITE_PARAMETER,
    OVERFLOW,
    OVERFLOW_KINDS,
    TOO_FEW_ELEMENTS,
    UNALIGNABLE,
    UNKNOWN,
)
from nandoctor.instrument.precision import REDUCED_DTYPES, overflowed_reduced_precision
from nandoctor.report.model import Finding, FirstNonfinite, Location, StageResult
from nandoctor.stages import StageContext, StageOutcome
from nandoctor.stages.init_check.findings import most_common_write

NAME = "anomaly"

_LOG_OPS = {"log", "log2", "log10"}


def run(context: StageContext) -> StageOutcome:
    event = context.watch.nonfinite
    if event is None:
        steps = len(context.watch.steps)
        summary = f"no NaN/Inf reached the loss, a gradient or a parameter in {steps} steps"
        return StageOutcome(StageResult("ran", summary, context.watch.duration_s))
    first = first_nonfinite_from(event)
    finding = finding_from(first, event, optimizer_of(context.watch, event))
    if event.get("birth") is None and (rerun := only_compiled(context.watch)) is not None:
        finding = _compiled_only(first, rerun)  # no op to guess at: the compiler is the lead
    if finding.code == "IN102":
        finding = _at_the_init_line(finding, context.watch, first.module)
    if finding.code == "IN101":
        finding = _where_the_parameter_was_set(finding, context.watch, first.facts.get("parameter"))
    where = f" at {first.location.short()}" if first.location else ""
    summary = f"{first.op} in {first.phase}{where}, step {first.step}: {first.explanation}"
    result = StageResult("ran", summary, context.watch.duration_s)
    return StageOutcome(result, [finding], first_nonfinite=first)


def _at_the_init_line(finding: Finding, watch, module: str | None) -> Finding:
    """Weights born outside an op's domain are fixed where they were set: the init check's
    record of that line for the failing module's weights leads, the op's line stays."""
    layers = [layer for event in watch.all("init_forward") for layer in event.get("layers") or []]
    # the failing op may run in a module of the layer's own (its parametrization)
    holding = [layer for layer in layers if module and _within(module, layer.get("module"))]
    layer = max(holding, key=lambda layer: len(layer["module"]), default=None)
    set_at = most_common_write(layer.get("weights") or []) if layer else None
    if set_at is None:
        return finding
    evidence = (
        *finding.evidence,
        f"these weights were last set at {set_at.short()}: {set_at.code}",
    )
    return dataclasses.replace(finding, location=set_at, evidence=evidence)


def _where_the_parameter_was_set(finding: Finding, watch, name: str | None) -> Finding:
    """A parameter no op made non-finite was wrong where it was set (`torch.empty` never
    filled, a checkpoint): that line leads, the line that read it stays as evidence."""
    written = [e.get("parameters_written") or {} for e in watch.all("init_forward")]
    set_at = next((Location.from_dict(w[name]) for w in written if name in w), None)
    if set_at is None:
        return finding
    evidence = (*finding.evidence, f"{name} was last set at {set_at.short()}: {set_at.code}")
    return dataclasses.replace(finding, location=set_at, evidence=evidence)


def _within(module: str, layer: str | None) -> bool:
    return bool(layer) and (module == layer or module.startswith(layer + "."))


def without_the_rate(context: StageContext, findings: list[Finding], reason: str) -> list[Finding]:
    """This stage's finding decided again once the learning-rate sweep ruled the rate out
    (`reason`, its summary): an overflow first blamed on growth is the formula's."""
    event, outcome = context.watch.nonfinite, context.earlier.get(NAME)
    if event is None or outcome is None or outcome.first_nonfinite is None:
        return findings
    first = outcome.first_nonfinite
    decided = finding_from(first, event, optimizer_of(context.watch, event), rate_ruled_out=True)
    if decided.category == "learning_rate":
        return findings
    decided = dataclasses.replace(
        decided, evidence=(*decided.evidence, f"learning-rate sweep: {reason}")
    )
    return [decided if f.stage == NAME and f.category == "learning_rate" else f for f in findings]


def _compiled_only(first: FirstNonfinite, rerun: dict) -> Finding:
    evidence = [
        f"a non-finite value reached {first.reached} at step {first.step} of the compiled run",
        "the op could not be localized: per-op checks need the eager ops, and the script run "
        f"eagerly (torch.compile disabled, same seed) stayed finite through step {first.step}",
    ]
    return compiled_only_finding(NAME, rerun, evidence, confidence=0.7)


def first_nonfinite_from(event: dict) -> FirstNonfinite:
    birth = event.get("birth")
    if birth is None:  # the value reached a checked tensor, but no op could be blamed
        return FirstNonfinite(
            step=event["step"],
            phase=event.get("phase", "forward"),
            op="unknown",
            module=None,
            location=Location.from_dict(event.get("backward_call")),
            explanation=f"a non-finite value reached {event['reached']}; its origin was not seen",
            reached=event["reached"],
            target=event.get("target", ""),
            nonfinite=event.get("counts", ""),
            rank=event.get("rank"),
            kind=UNKNOWN,
        )
    return FirstNonfinite(
        step=birth["step"],
        phase=birth["phase"],
        op=birth["op"],
        module=birth.get("module"),
        location=Location.from_dict(birth.get("location")),
        explanation=birth["explanation"],
        reached=event["reached"],
        target=event.get("target", ""),
        nonfinite=birth.get("nonfinite", ""),
        backward_node=birth.get("backward_node"),
        rank=event.get("rank"),
        kind=birth.get("kind") or (NONFINITE_INPUT if birth.get("inputs_nonfinite") else UNKNOWN),
        dtype=birth.get("dtype"),
        forward_op=birth.get("forward_op"),
        facts=birth.get("facts") or {},
    )


def op_base(op: str) -> str:
    """`aten.log.default` -> `log`; `aten.div_.Tensor` -> `div`."""
    parts = op.split(".")
    name = parts[1] if len(parts) > 1 and parts[0] == "aten" else parts[0]
    return name.rstrip("_") or name


def optimizer_of(watch, event: dict) -> dict | None:
    """The `optimizer` event (type, settings, construction line) of the optimizer in `event`."""
    built = watch.all("optimizer")
    index = event.get("optimizer")
    if index is None and len(built) == 1:
        index = 0
    found = next((o for o in built if o["index"] == index), None)
    if found is None or len(built) != 1:
        return found
    # A scheduler (a warm-up from 0, a decay) moves the rate after construction: the rate the
    # failing step ran at is the one the report can speak of.
    stepped = [e for e in watch.all("step") if e.get("lr") and e["step"] <= event.get("step", 0)]
    return {**found, "lr_at": (stepped[-1]["step"], stepped[-1]["lr"])} if stepped else found


def describe_optimizer(optimizer: dict) -> str:
    settings = ", ".join(f"{k}={v}" for k, v in optimizer["settings"].items()
                         if k in ("lr", "eps", "betas", "momentum", "weight_decay"))  # fmt: skip
    text = f"{optimizer['type']}({settings})"
    step, lrs = optimizer.get("lr_at") or (None, None)
    rates = [lr for lr in lrs or () if isinstance(lr, (int, float))]
    # per param group, against the rates the groups were built with (a backbone group at a
    # tenth of the head's rate is the script's choice, not a scheduler's move)
    built = optimizer.get("lrs") or [optimizer["settings"].get("lr")] * len(rates)
    if rates and any(lr != was for lr, was in zip(rates, built, strict=False)):
        shown = ", ".join(f"{lr:.3g}" for lr in rates)
        text += f"; at step {step} its rate was {shown} (a scheduler moved it)"
    return text


def finding_from(
    first: FirstNonfinite, event: dict, optimizer: dict | None = None, rate_ruled_out: bool = False
) -> Finding:
    """The finding the first NaN/Inf points at. `rate_ruled_out`: the learning-rate sweep showed
    that a much smaller rate does not move the failure, so values that grew until an op
    overflowed are not the rate's doing."""
    birth = event.get("birth") or {}
    own_update = _in_its_own_update(first, optimizer or {})
    code, title, confidence = _categorize(
        first, birth, rate_ruled_out, _eps_of(optimizer), own_update
    )
    category = CODES[code].category
    evidence = [
        f"{first.op} in {first.phase} at step {first.step}"
        + (f", module {first.module}" if first.module else "")
        + (f", {first.location.short()}" if first.location else ""),
        f"why: {first.explanation}",
        f"it reached {first.reached}"
        + (f" ({event.get('counts')})" if event.get("counts") else ""),
    ]
    if first.location and first.location.code:
        evidence.append(f"code: {first.location.code}")
    remedy = propose_remedy(first, birth, category, optimizer, own_update)
    location, fix = first.location, suggest_fix(first, birth, category, remedy)
    if (mask := _mask_of_a_masked_row(first, birth)) is not None:
        # The softmax is right to give 0/0 on a row with nothing to attend to: the formula to
        # change is the mask's, whose -inf leaves no finite entry in that row.
        evidence.append(f"every entry of those rows was set to -inf at {mask.short()}"
                        + (f": {mask.code}" if mask.code else ""))  # fmt: skip
        location = mask
    if (remedy or {}).get("kind") == "move_bound":
        # The script guarded the op already; the guard's bound is the one value it cannot take
        location = Location.from_dict(birth["bounded_at"]["location"])
        evidence.append(_on_the_bound(first, birth["bounded_at"], location))
        fix = _bound_fix(first, birth["bounded_at"], remedy, location)
    if code == "OC103":
        fix = _update_overflow_fix(first, own_update)
    if optimizer is not None and (category == "learning_rate" or first.phase == "optimizer"):
        # The line to edit is where the optimizer was built with its learning rate or setting,
        # unless the update's own code is the script's: then its failing line is.
        evidence.append(f"optimizer: {describe_optimizer(optimizer)}")
        if own_update and category != "learning_rate":
            evidence.append(f"{optimizer['type']}.step() is the script's own code")
        else:
            location = Location.from_dict(optimizer.get("location")) or location
        advice = optimizer_fix(optimizer, category, _update_kind(first))
        if advice and (remedy or {}).get("kind") == "guard_op":
            fix = f"{fix}; or {advice}"  # the guard of its own line is what a re-run verifies
        else:
            fix = advice or fix
    return Finding(
        stage=NAME,
        category=category,
        title=title,
        confidence=confidence,
        evidence=tuple(evidence),
        fix=fix,
        location=location,
        remedy=remedy,
        code=code,
    )


def propose_remedy(
    first: FirstNonfinite, birth: dict, category: str, optimizer, own_update: bool
) -> dict | None:
    """The fix a re-run can apply by itself to verify this finding, if there is one.
    `own_update`: it was born in an optimizer step the script wrote itself."""
    eps = _eps_of(optimizer)
    if (mask := _mask_of_a_masked_row(first, birth)) is not None:
        return finite_fill_remedy(mask.file, mask.line, mask.code)
    if category == "optimizer_config" and eps is not None and eps <= 0:
        return {"kind": "optimizer_eps", "eps": 1e-8}
    if category == "initialization":
        return None  # weights written non-finite after construction: no re-init reaches them
    if first.facts.get("frozen_table"):
        return None  # the batches are fine: the table's rows, given before training, are not
    if birth.get("inputs_nonfinite") or made_the_tensor(first):
        return {"kind": "sanitize_inputs"}
    if (moved := _bound_at_a_singular_point(first, birth, category)) is not None:
        return moved
    if (
        first.kind == TOO_FEW_ELEMENTS
        and op_base(first.op) in SAMPLE_STATISTICS
        and first.location is not None
    ):
        where = first.location
        return population_statistics_remedy(where.file, where.line, where.code)
    if category == "precision" and first.dtype in REDUCED_DTYPES:
        return {"kind": "float32"}
    if category == "exploding_gradients":
        return {"kind": "clip_gradients", "max_norm": 1.0}
    op = _op_to_fix(first)
    # A guard fixes a domain error (log of 0, 0/0) or an exp that overflows from the start; an
    # overflow after values grew is a symptom, and clamping it would only hide the divergence.
    # So does a domain error in an update the script wrote itself (its own optimizer class).
    guardable = category in ("invalid_operation", "data") or (
        _update_kind(first) in (DIVISION_BY_ZERO, DOMAIN)
        and category == "optimizer_config"
        and own_update
    )
    if guardable and op in GUARDABLE_OPS and first.location is not None:
        where = first.location
        return guard_remedy(op, _guard_of(first, op), where.file, where.line, where.code)
    return None


def _breaks(first: FirstNonfinite, op: str) -> str:
    """What `op` does at its singular point, in the phase the NaN/Inf was born in."""
    return (
        f"the derivative of {op} is infinite"
        if first.phase == "backward"
        else f"{op} is not finite"
    )


def _on_the_bound(first: FirstNonfinite, bounded: dict, clamp: Location) -> str:
    op = bounded["op"]
    bounds = " and ".join(f"{b['side']} {b['bound']:g}" for b in bounded["bounds"])
    return (f"the input of {op} comes from the clamp at {clamp.short()} ({bounds}): "
            f"{bounded['on_bound']} of its {bounded['of']} values sat on the bound, where "
            f"{_breaks(first, op)}")  # fmt: skip


def _bound_fix(first: FirstNonfinite, bounded: dict, remedy: dict, clamp: Location) -> str:
    op = bounded["op"]
    moved = ", ".join(f"{b['side']} {b['to']}" for b in remedy["bounds"])
    general = (f"the clamp keeps the input of {op} on a bound where {_breaks(first, op)}: "
               f"clamp strictly inside the domain ({moved})")  # fmt: skip
    return _with_rewrite(remedy.get("shown"), general)


def _bound_at_a_singular_point(first: FirstNonfinite, birth: dict, category: str) -> dict | None:
    """The `move_bound` remedy when the op's input came from a clamp whose bound is the op's
    singular point (`acos(x.clamp(-1, 1))`, `sqrt(x.clamp(min=0))`) and values sat on it."""
    bounded = birth.get("bounded_at")
    if not bounded or category not in ("invalid_operation", "data"):
        return None
    where = Location.from_dict(bounded.get("location"))
    if where is None:
        return None
    return bound_remedy(where.file, where.line, where.code, bounded["bounds"], first.dtype)


def _mask_of_a_masked_row(first: FirstNonfinite, birth: dict) -> Location | None:
    """Where a mask wrote the -inf that filled a softmax row entirely, or None."""
    if first.kind != MASKED_SOFTMAX:
        return None
    return Location.from_dict(birth.get("constant_at"))


def _guard_of(first: FirstNonfinite, op: str) -> str:
    """A denominator that held negative values keeps its sign; a norm or a count is clamped."""
    return guard_for(op, first.dtype, signed=first.facts.get("negative", 0) > 0)


def _update_kind(first: FirstNonfinite) -> str | None:
    """The birth's kind as the optimizer's update is judged: a quotient that overflowed by its
    denominator's smallness is the overflow it is there (the update's moments, eps and rate
    decide it, as a bias correction written `beta ** t` shows), not a division by 0."""
    return OVERFLOW if first.facts.get("near_zero") else first.kind


def _eps_of(optimizer: dict | None) -> float | None:
    """The eps the optimizer was built with, when it has one."""
    return (optimizer or {}).get("settings", {}).get("eps")


_DIVISIONS = frozenset({"div", "reciprocal", "true_divide"})


def _in_its_own_update(first: FirstNonfinite, optimizer: dict) -> bool:
    """Born inside an optimizer.step() whose code is the script's own, at a line of it."""
    return (
        first.phase == "optimizer"
        and bool(optimizer.get("own_step"))
        and first.location is not None
    )


def optimizer_fix(optimizer: dict, category: str, kind: str | None = None) -> str | None:
    eps = _eps_of(optimizer)
    if category != "optimizer_config" or eps is None:
        return None
    if eps <= 0:
        return (
            f"give {optimizer['type']} a positive eps: `eps=1e-8` (1e-4 or more in pure float16); "
            "with eps=0, a parameter whose gradient is exactly 0 divides 0 by 0"
        )
    if kind == DIVISION_BY_ZERO:
        return (
            f"the update divides by zero although eps={eps:g}: add eps before dividing or "
            "inverting, `1 / (exp_avg_sq.sqrt() + eps)` rather than `exp_avg_sq.rsqrt() + eps`, "
            "so a parameter whose gradient was exactly 0 gets a finite step"
        )
    return None


def made_the_tensor(first: FirstNonfinite) -> bool:
    """Born where a tensor was made already non-finite: `torch.from_numpy`, `torch.tensor`,
    `torch.load` (recorded by name), or a dtype conversion that overflowed."""
    return first.op.startswith("torch.") or first.kind == CONVERSION_OVERFLOW


def _categorize(
    first: FirstNonfinite,
    birth: dict,
    rate_ruled_out: bool,
    eps: float | None = None,
    own_update: bool = False,
) -> tuple[str, str, float]:
    """(code, title, confidence) of the claim the first NaN/Inf supports (codes.py). `eps`:
    the failing optimizer's configured eps, when it has one; `own_update`: it was born in an
    optimizer step the script wrote itself."""
    op = op_base(first.op)
    if first.kind == NONFINITE_PARAMETER and first.facts.get("frozen_table"):
        # A table of values looked up by index and never trained (pretrained vectors, a
        # descriptor matrix in `Embedding.from_pretrained`) is data the model reads.
        return "DA101", "non-finite values come from the data: a frozen lookup table", 0.85
    if first.kind == NONFINITE_PARAMETER:
        # Below the init check's finding of the same weights, which knows the line that wrote
        # them; this one stands when the init check did not run.
        return "IN101", "parameters hold NaN/Inf that no op of the run made", 0.75
    made_by_the_dtype = overflowed_reduced_precision(first.kind, first.dtype)
    if birth.get("inputs_nonfinite") or (first.phase == "data" and not made_by_the_dtype):
        # The line that made a tensor already holding NaN/Inf is exact: above a data scan's
        # trace, which can only reach the line that fetched the row.
        return (
            "DA101",
            "non-finite values come from the data",
            0.97 if made_the_tensor(first) else 0.85,
        )
    if _weights_born_outside_the_domain(first):
        # Nothing but the weights went in, and no update had changed them yet: they were
        # born where the op is undefined, and the fix is how they are initialized.
        return "IN102", f"{op} of the weights as initialized is outside its domain", 0.9
    if first.kind == UNALIGNABLE:
        # The samples carry targets their inputs are too short to spell (after the model's
        # subsampling): what to fix is which samples reach the loss, not its formula.
        return "DA102", "samples whose CTC target is longer than their input can align", 0.9
    if first.phase == "optimizer":
        reduced, kind = first.dtype in REDUCED_DTYPES, _update_kind(first)
        if kind == DIVISION_BY_ZERO and reduced and (eps or 0) > 0:
            # a sane eps (1e-8) that the parameters' dtype cannot hold: it rounds to 0
            return "PR102", f"the optimizer's eps={eps:g} rounds to 0 in {first.dtype}", 0.85
        if kind == DIVISION_BY_ZERO:
            return "OC101", "the optimizer update divides by zero", 0.8
        if kind == DOMAIN and own_update:
            # From finite gradients and state: the update's own formula left the op's domain
            # (a variance estimate n - g*g rounded below 0 under a sqrt).
            return "OC102", f"the script's own optimizer update takes {op} outside its domain", 0.8
        if kind == OVERFLOW and rate_ruled_out and not reduced:
            return "OC103", f"the optimizer update overflows ({op}) whatever the learning rate", 0.7
        if kind == OVERFLOW and own_update and op in _DIVISIONS and not reduced:
            # A quotient of the script's own update outgrew float32: a denominator decaying to
            # 0 (a bias correction written beta**t for 1 - beta**t). A too-large rate overflows
            # a product or a sum of the update first, not a ratio of its own moments.
            return "OC103", "the script's own optimizer update divides by values near zero", 0.7
        return "LR101", f"the optimizer update overflowed ({op})", 0.6
    if first.kind in OVERFLOW_KINDS:
        if first.dtype in REDUCED_DTYPES:
            return "PR101", f"{op} overflows its low-precision dtype", 0.8
        if first.phase == "backward":  # the forward pass was finite: the gradients exploded
            forward = first.forward_op or op
            return "EG101", f"gradients overflow in the backward of {forward}", 0.75
        if first.phase == "forward" and first.target == "gradient":
            # The overflowing forward value never reached the loss (torch.where, masked_fill
            # or indexing discarded it) but its gradient did: inf x 0 = NaN in backward. The
            # formula is the bug at any learning rate.
            return (
                "IO101",
                f"{op} overflows in a branch the forward discards, and its gradient does not",
                0.8,
            )
        if first.step == 0:
            # float32 is not a reduced precision: an overflow before any update is a formula
            # (or an input scale) whose result float32 cannot hold, fixed by a stable formula
            return "IO102", f"{op} overflows float32 before any update", 0.6
        if rate_ruled_out:
            # Growth the learning rate does not drive: a schedule, a temperature or the inputs'
            # scale takes the formula past what float32 holds (an annealed softmax scale).
            return (
                "IO103",
                f"{op} overflows float32 at step {first.step}, whatever the learning rate",
                0.7,
            )
        return "LR102", f"values grew until {op} overflowed at step {first.step}", 0.55
    if first.phase == "backward":
        forward = first.forward_op or op
        return "IO104", f"the gradient of {forward} is not finite at its input", 0.85
    if first.kind == MASKED_SOFTMAX:
        return "IO105", "softmax over rows whose every entry is masked to -inf", 0.85
    return (
        "IO105",
        _DOMAIN_TITLES.get(op, f"{op} received inputs outside its domain"),
        0.85,
    )


def _weights_born_outside_the_domain(first: FirstNonfinite) -> bool:
    return (
        first.step == 0
        and first.phase == "forward"
        and first.kind in (DOMAIN, DIVISION_BY_ZERO)
        and bool(first.facts.get("parameters_only"))
    )


_DOMAIN_TITLES = {
    "log": "log of zero or negative values",
    "log2": "log of zero or negative values",
    "log10": "log of zero or negative values",
    "log1p": "log1p of values at or below -1",
    "sqrt": "sqrt of negative values",
    "rsqrt": "rsqrt of zero or negative values",
    "div": "division by zero",
    "true_divide": "division by zero",
    "reciprocal": "reciprocal of zero",
    "pow": "power outside its domain",
    "acos": "acos of values outside [-1, 1]",
    "asin": "asin of values outside [-1, 1]",
}


def suggest_fix(first: FirstNonfinite, birth: dict, category: str, remedy: dict | None) -> str:
    """The fix to show. When a re-run can guard the op, the line rewritten with that very guard
    leads (`remedy["shown"]`): what is verified is what the user pastes."""
    op = op_base(first.op)
    forward_op = _op_to_fix(first)
    rewritten = (remedy or {}).get("shown")
    if first.kind == MASKED_SOFTMAX:
        example = (
            "" if rewritten else " (`scores.masked_fill(mask, torch.finfo(scores.dtype).min)`)"
        )
        return _with_rewrite(
            rewritten,
            f"mask with the dtype's most negative finite value, not -inf{example}: a row with "
            "every entry masked then gets equal weights instead of 0/0; or keep such rows out "
            "(give each at least one unmasked entry, or zero their output)",
        )
    if first.kind == EMPTY_REDUCTION:
        return (
            f"{op} over no elements is 0/0: skip the term when its selection is empty "
            "(`if x.numel(): losses.append(x.mean())`), or divide the sum by at least one "
            "(`x.sum() / max(x.numel(), 1)`)"
        )
    if (remedy or {}).get("kind") == "population_statistics":
        return _with_rewrite(
            rewritten,
            f"{op} with the n - 1 correction divides by 0 for a single value: compute it "
            "without the correction (`correction=0`), or skip batches with fewer than two values",
        )
    if "masked_forward" in birth.get("notes", []):
        return _with_rewrite(
            rewritten,
            "the value is masked (torch.where / masked_fill) after it is computed, but its "
            "gradient is not: keep the input inside the op's domain before it, e.g. "
            "`torch.where(x > 0, torch.log(torch.where(x > 0, x, 1.0)), 0.0)` (the double-where trick)",
        )
    if first.kind == CONVERSION_OVERFLOW:
        return (
            "values beyond the target dtype's range: rescale them, clamp them before the "
            "conversion (`x.clamp(-1e30, 1e30).float()`), or treat sentinel values as missing"
        )
    if first.kind == NONFINITE_PARAMETER and first.facts.get("frozen_table"):
        return (
            f"repair the table's rows where it is built, before `{first.facts['frozen_table']}"
            ".from_pretrained`: the values it was given hold NaN/Inf (fill or drop them, e.g. "
            "`torch.nan_to_num`, or leave those items out); training never changes a frozen "
            "table, so every batch that looks up such a row fails"
        )
    if first.kind == NONFINITE_PARAMETER:
        return (
            "find what wrote NaN/Inf into the weights before training: a checkpoint (check it "
            "with `torch.isfinite`), `torch.empty` never filled (initialize it, e.g. "
            "`nn.init.kaiming_uniform_`), or an in-place write under `torch.no_grad()`"
        )
    if _weights_born_outside_the_domain(first):
        if forward_op.startswith("_weight_norm"):
            return (
                "give a weight-normalised layer a nonzero direction: to start it at zero, zero "
                "its scale g (`weight_g`, or `parametrizations.weight.original0`) instead of "
                "the weight, or leave the zero-initialised layer out of weight_norm"
            )
        return (
            f"initialize the weights {forward_op} reads inside its domain (a positive scale "
            "under log or a division), or compute it from an unconstrained parameter "
            "(`exp(log_scale)`, `softplus(raw)`)"
        )
    if first.kind == UNALIGNABLE:
        return (
            "drop the samples whose input is shorter than its target needs (after the model's "
            "subsampling: a label per frame, and a blank between repeated labels) when the "
            "dataset is built, or pass `zero_infinity=True` to `F.ctc_loss` / `nn.CTCLoss` so "
            "their loss and gradient are zeroed"
        )
    if birth.get("inputs_nonfinite"):
        return (
            "drop or repair the non-finite samples before training (filter rows with "
            "`torch.isfinite(x).all(dim=1)`, or `torch.nan_to_num`), and check how they were "
            "loaded or computed"
        )
    if forward_op in _LOG_OPS:
        return _with_rewrite(
            rewritten,
            "keep the argument of log positive: `torch.log(p.clamp_min(1e-12))`, or compute the "
            "loss from logits (`F.log_softmax`, `F.cross_entropy`, `F.binary_cross_entropy_with_logits`)",
        )
    if forward_op in {"sqrt", "rsqrt"}:
        return _with_rewrite(
            rewritten,
            "keep the argument of sqrt strictly positive so its gradient stays finite: "
            "`torch.sqrt(x.clamp_min(1e-12))` (or `torch.sqrt(x + 1e-12)`)",
        )
    if forward_op in _DIVISIONS:
        return _with_rewrite(
            rewritten,
            "guard the denominator: `a / b.clamp_min(1e-12)` for a norm or a count, "
            "`torch.where(b.abs() < 1e-12, 1e-12, b)` for one that may be negative "
            "(or `F.normalize` for norms)",
        )
    if forward_op in {"exp", "expm1", "sinh", "cosh", "exp2"}:
        return _with_rewrite(
            rewritten,
            "keep the exponent in range: work in log space (`torch.logsumexp`, `F.softplus`, "
            "`F.log_softmax`) or clamp the input (`x.clamp(max=80.0)`)",
        )
    if rewritten:
        return _with_rewrite(rewritten, f"keep the input of {forward_op} inside its domain")
    if category == "precision" and first.phase == "optimizer":
        return (
            "keep the parameters and the optimizer's state in float32 and compute in reduced "
            "precision with `torch.autocast` (plus `torch.amp.GradScaler` for float16), or give "
            "the optimizer an eps the dtype can hold (`eps=1e-4` in float16)"
        )
    if category == "precision" and first.kind == CONSTANT_OVERFLOW:
        return (
            "write a constant the dtype can hold: `torch.finfo(x.dtype).min` rather than -1e9 "
            "for a mask (`scores.masked_fill(~mask, torch.finfo(scores.dtype).min)`), or compute "
            "this line in float32"
        )
    if category == "precision":
        return "run this op in float32 (outside autocast / `.float()` on its inputs) or rescale its inputs"
    if category == "learning_rate":
        return "lower the learning rate (run `nandoctor sweep-lr` for a safe value) or add gradient clipping"
    if category == "exploding_gradients":
        return "clip gradients: `torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)` before `optimizer.step()`"
    if category == "optimizer_config":
        return "check the optimizer's settings (eps > 0, e.g. Adam eps=1e-8; weight decay; betas)"
    return f"guard the inputs of {op} so they stay inside its domain"


def _update_overflow_fix(first: FirstNonfinite, own_update: bool) -> str:
    """OC103's advice: the script's own formula to check, or the built-in's other settings."""
    if own_update and op_base(first.op) not in _DIVISIONS:
        return (
            f"the update's own values grew past float32 at line {first.location.line} whatever "
            "the learning rate: check the update rule the script wrote against the optimizer's "
            "definition (what each running average accumulates, how the step is scaled)"
        )
    if own_update:
        return (
            f"the quotient at line {first.location.line} outgrew float32 because its denominator "
            "decays towards 0: check that line against the optimizer's definition (a bias "
            "correction divides by `1 - beta ** step`, not `beta ** step`; eps belongs in the "
            "denominator)"
        )
    return (
        "the learning rate does not move the failure: check the optimizer's other settings "
        "(momentum below 1, weight decay, betas) and what makes its state grow"
    )


def _with_rewrite(rewritten: str | None, general: str) -> str:
    return f"`{rewritten}` - {general}" if rewritten else general


def _op_to_fix(first: FirstNonfinite) -> str:
    """The op whose formula a fix edits: for a backward op, the forward op it differentiates."""
    if first.phase == "backward":
        return first.forward_op or ""
    return op_base(first.op)
