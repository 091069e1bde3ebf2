"""Say *why* an op produced NaN/Inf, from the op's own inputs ("log of 3 zero inputs").

Each answer is a `Why`: a stable `kind` the diagnosis decides on, the dtype the op computed in,
and a sentence for people. Nothing downstream reads the sentence to decide anything."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from nandoctor.instrument.kinds import (
    CONSTANT_OVERFLOW,
    CONVERSION_OVERFLOW,
    DIVISION_BY_ZERO,
    DOMAIN,
    EMPTY_REDUCTION,
    INF_ARITHMETIC,
    MASKED_SOFTMAX,
    OVERFLOW,
    TOO_FEW_ELEMENTS,
    UNALIGNABLE,
    UNKNOWN,
)
from nandoctor.instrument.tensors import (
    dtype_max,
    finite_range,
    is_checked,
    iter_tensors,
    short_dtype,
)


@dataclass(frozen=True)
class Why:
    kind: str
    text: str
    dtype: str | None = None  # the dtype the op computed its result in ("float16")
    # Counts measured on the inputs, by name: {"zero": 3, "negative": 0} for a denominator.
    facts: tuple[tuple[str, int], ...] = ()


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _first_tensor(args) -> torch.Tensor | None:
    return next((t for t in iter_tensors(args) if is_checked(t)), None)


def _count(mask: torch.Tensor) -> int:
    return int(mask.sum())


def _domain(x: torch.Tensor, checks: list[tuple[str, Callable]], name: str) -> Why | None:
    x = x.detach()
    found = [f"{n} {label}" for label, test in checks if (n := _count(test(x)))]
    if not found:
        return None
    plural = "s" if x.numel() > 1 else ""
    return Why(DOMAIN, f"{name} of {' and '.join(found)} input{plural} (of {x.numel()})")


def _log(args, kwargs, out) -> Why | None:
    return _domain(
        _first_tensor(args), [("zero", lambda x: x == 0), ("negative", lambda x: x < 0)], "log"
    )


def _log1p(args, kwargs, out) -> Why | None:
    checks = [("-1", lambda x: x == -1), ("below -1", lambda x: x < -1)]
    return _domain(_first_tensor(args), checks, "log1p")


def _sqrt(args, kwargs, out) -> Why | None:
    return _domain(_first_tensor(args), [("negative", lambda x: x < 0)], "sqrt")


def _rsqrt(args, kwargs, out) -> Why | None:
    x = _first_tensor(args).detach()
    checks = [("zero", lambda x: x == 0), ("negative", lambda x: x < 0)]
    why = _domain(x, checks, "rsqrt")
    if why is None or _count(x < 0):
        return why
    # only zeros: 1 / sqrt(0), a division by zero (Adam-like updates with eps added after it)
    return replace(why, kind=DIVISION_BY_ZERO, facts=(("zero", _count(x == 0)), ("negative", 0)))


def _inverse_trig(args, kwargs, out) -> Why | None:
    return _domain(_first_tensor(args), [("out-of-[-1, 1]", lambda x: x.abs() > 1)], "acos/asin")


def _atanh(args, kwargs, out) -> Why | None:
    return _domain(_first_tensor(args), [("|x| >= 1", lambda x: x.abs() >= 1)], "atanh")


def _as_tensor(value, like: torch.Tensor) -> torch.Tensor:
    return (
        value.detach() if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=like.dtype)
    )


def _division(args, kwargs, out) -> Why | None:
    if len(args) < 2:
        return None
    numerator = args[0].detach() if isinstance(args[0], torch.Tensor) else None
    denominator = _as_tensor(args[1], numerator if numerator is not None else out)
    zero = denominator == 0
    n_zero = _count(zero)
    if n_zero == 0:
        return _near_zero_division(numerator, denominator, out) or _overflow(
            "division", args, out, hint="denominators close to zero"
        )
    text = f"division by zero: {n_zero} of {denominator.numel()} denominators are 0"
    if numerator is not None:
        numerator_zero, zero = torch.broadcast_tensors(numerator == 0, zero)
        if zero_over_zero := _count(numerator_zero & zero):
            text += f" ({zero_over_zero} results are 0/0)"
    facts = (("zero", n_zero), ("negative", _count(denominator < 0)))
    return Why(DIVISION_BY_ZERO, text, facts=facts)


def _near_zero_division(numerator, denominator, out) -> Why | None:
    """A float32/float64 quotient that overflowed because its denominator, not its numerator,
    is extreme: at each infinite result |a| * |b| < 1, so b is farther below 1 than a is above
    it (4e3 / 1e-38: a variance or a norm collapsed towards 0). That is the formula reaching its
    singularity, as an exact 0 would; a numerator that grew (1e39 / 2) is not. Reduced dtypes
    are left to their range: there a small denominator is a precision question."""
    if numerator is None or not isinstance(out, torch.Tensor) or out.dtype.itemsize < 4:
        return None
    a, b, q = torch.broadcast_tensors(numerator, denominator, out.detach())
    overflowed = torch.isinf(q) & torch.isfinite(a) & torch.isfinite(b)
    if not bool(overflowed.any()):
        return None
    a, b = a[overflowed].double().abs(), b[overflowed].double().abs()
    if not bool((a * b < 1).all()):
        return None
    n = int(overflowed.sum())
    text = (f"division by near-zero: {n} quotients overflow from numerators up to "
            f"{float(a.max()):.4g} over denominators down to {float(b.min()):.4g}")  # fmt: skip
    facts = (("zero", 0), ("near_zero", n), ("negative", _count(denominator < 0)))
    return Why(DIVISION_BY_ZERO, text, facts=facts)


def _addcdiv(args, kwargs, out) -> Why | None:
    """self + value * tensor1 / tensor2: Adam's update, where tensor2 is sqrt(v) + eps."""
    if len(args) < 3 or not isinstance(args[2], torch.Tensor):
        return None
    why = _division((args[1], args[2]), kwargs, out)
    return replace(why, text=f"inside addcdiv: {why.text}") if why else None


def _reciprocal(args, kwargs, out) -> Why | None:
    x = _first_tensor(args)
    n = _count(x.detach() == 0)
    if not n:
        return None
    text = f"reciprocal of {_plural(n, 'zero input')} (of {x.numel()})"
    return Why(DIVISION_BY_ZERO, text, facts=(("zero", n), ("negative", _count(x.detach() < 0))))


def _exp_like(name: str, log_base: float = 1.0) -> Callable:
    def explain(args, kwargs, out) -> Why | None:
        x = _first_tensor(args)
        if x is None:
            return None
        limit = math.log(dtype_max(out.dtype)) / log_base
        high = float(x.detach().max())
        if high <= limit:
            return None
        return Why(
            OVERFLOW,
            f"{name} of inputs up to {high:.4g} overflows {short_dtype(out.dtype)} "
            f"(max input {limit:.4g})",
        )

    return explain


def _pow(args, kwargs, out) -> Why | None:
    base, exponent = args[0], args[1] if len(args) > 1 else None
    if isinstance(base, torch.Tensor) and isinstance(exponent, (int, float)):
        base = base.detach()
        if exponent != int(exponent) and (n := _count(base < 0)):
            return Why(DOMAIN, f"fractional power ({exponent}) of {_plural(n, 'negative base')}")
        if exponent < 0 and (n := _count(base == 0)):
            return Why(DOMAIN, f"negative power ({exponent}) of {_plural(n, 'zero base')}")
    return _overflow("power", args, out)


def _overflow(what: str, args, out, hint: str | None = None) -> Why | None:
    """Finite inputs, infinite output: the result left the dtype's range."""
    if not isinstance(out, torch.Tensor) or bool(torch.isnan(out.detach()).any()):
        return None  # NaN from finite inputs is not an overflow
    largest = 0.0
    for t in iter_tensors(args):
        if is_checked(t) and (span := finite_range(t)) is not None:
            largest = max(largest, abs(span[0]), abs(span[1]))
    text = (
        f"{what} result exceeds the {short_dtype(out.dtype)} maximum "
        f"{dtype_max(out.dtype):.4g} (largest input magnitude {largest:.4g})"
    )
    return Why(OVERFLOW, f"{text}; {hint}" if hint else text)


def _conversion(args, kwargs, out) -> Why | None:
    source = _first_tensor(args)
    if source is None or source.dtype == out.dtype:
        return None
    span = finite_range(source)
    largest = max(abs(span[0]), abs(span[1])) if span else float("nan")
    return Why(
        CONVERSION_OVERFLOW,
        f"conversion {short_dtype(source.dtype)} -> {short_dtype(out.dtype)} overflows "
        f"(|x| up to {largest:.4g} > {dtype_max(out.dtype):.4g})",
    )


def _empty_reduction(args, kwargs, out) -> Why | None:
    # an empty tensor holds no NaN/Inf, so the checked-tensor helper would skip it
    x = next((t for t in iter_tensors(args) if t.is_floating_point()), None)
    if x is not None and x.numel() == 0:
        return Why(EMPTY_REDUCTION, "reduction over an empty tensor")
    return None


def _variance(args, kwargs, out) -> Why | None:
    return Why(
        TOO_FEW_ELEMENTS,
        "variance/std over too few elements for the correction (e.g. std of a single value)",
    )


def _weight_norm(args, kwargs, out) -> Why | None:
    """w = g * v / ||v||, the norm taken over every dim but `dim`: a direction v that is all
    zero (a layer zero-initialised, then weight-normalised) gives 0/0."""
    if len(args) < 2 or not isinstance(args[0], torch.Tensor):
        return None
    v = args[0].detach()
    dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
    rows = v.reshape(1, -1) if dim == -1 or v.dim() == 0 else v.movedim(dim, 0).flatten(1)
    n_zero = _count(rows.norm(dim=1) == 0)
    if not n_zero:
        return None
    text = (
        f"weight norm of a zero direction: {n_zero} of {rows.shape[0]} slices of v are all 0, "
        "so g * v / ||v|| is 0/0"
    )
    return Why(DIVISION_BY_ZERO, text, facts=(("zero", n_zero), ("negative", 0)))


def _lengths(value) -> list[int]:
    return [int(v) for v in (value.tolist() if isinstance(value, torch.Tensor) else value)]


def _ctc(args, kwargs, out) -> Why | None:
    """CTC is inf for a sample no alignment exists for: its target needs one frame per label,
    plus one blank between each pair of repeated labels, and its input has fewer frames."""
    if len(args) < 4:
        return None
    targets, input_lengths, target_lengths = args[1], _lengths(args[2]), _lengths(args[3])
    short, example = 0, ""
    offset = 0
    for sample, (frames, length) in enumerate(zip(input_lengths, target_lengths, strict=False)):
        if targets.dim() == 2:
            labels = targets[sample, :length].tolist()
        else:  # the targets of the batch concatenated
            labels, offset = targets[offset : offset + length].tolist(), offset + length
        needed = length + sum(1 for a, b in zip(labels, labels[1:], strict=False) if a == b)
        if frames < needed:
            short += 1
            example = (
                example or f"sample {sample}: {frames} frames for a target that needs {needed}"
            )
    if not short:
        return None
    return Why(
        UNALIGNABLE,
        f"{_plural(short, 'sample')} of {len(input_lengths)} cannot be aligned: fewer input frames "
        f"than the target needs ({example}), so the CTC loss is inf",
        facts=(("unalignable", short), ("samples", len(input_lengths))),
    )


_RULES: dict[str, Callable] = {
    "_ctc_loss": _ctc,
    "ctc_loss": _ctc,
    "log": _log,
    "log2": _log,
    "log10": _log,
    "xlogy": _log,
    "log1p": _log1p,
    "sqrt": _sqrt,
    "rsqrt": _rsqrt,
    "acos": _inverse_trig,
    "asin": _inverse_trig,
    "atanh": _atanh,
    "div": _division,
    "true_divide": _division,
    "floor_divide": _division,
    "remainder": _division,
    "fmod": _division,
    "reciprocal": _reciprocal,
    "_weight_norm_interface": _weight_norm,
    "_weight_norm": _weight_norm,
    "addcdiv": _addcdiv,
    "exp": _exp_like("exp"),
    "expm1": _exp_like("expm1"),
    "exp2": _exp_like("exp2", math.log(2)),
    "sinh": _exp_like("sinh"),
    "cosh": _exp_like("cosh"),
    "pow": _pow,
    "float_power": _pow,
    "_to_copy": _conversion,
    "copy": _conversion,
    "to": _conversion,
    "mean": _empty_reduction,
    "var": _variance,
    "std": _variance,
    "var_mean": _variance,
    "std_mean": _variance,
}


def explain_birth(op_name: str, args, kwargs, out: torch.Tensor) -> Why:
    """Why `op_name` turned finite inputs into NaN/Inf in `out`."""
    if op_name.startswith("_foreach_"):  # list ops of optimizers: explain the failing element
        op_name, args = op_name.removeprefix("_foreach_"), _element_args(args, out)
    rule = _RULES.get(op_name)
    why = (
        _constant_beyond_range(op_name, args, kwargs or {}, out)
        or (rule(args, kwargs or {}, out) if rule else None)
        or _overflow(op_name, args, out)
        or Why(UNKNOWN, f"{op_name} produced non-finite values")
    )
    return replace(why, dtype=_dtype_of(out))


def _constant_beyond_range(op_name: str, args, kwargs, out) -> Why | None:
    """A number written in the formula that the result's dtype cannot hold: -1e9 is -inf in
    float16 (`scores + mask * -1e9`, `torch.where(mask, x, -1e9)`), whatever the tensors hold.
    The formula's constant, not values that grew, is what the dtype breaks."""
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
        return None
    limit = dtype_max(out.dtype)
    numbers = [v for v in (*args, *kwargs.values())
               if isinstance(v, (int, float)) and not isinstance(v, bool)]  # fmt: skip
    value = next((v for v in numbers if math.isfinite(v) and abs(v) > limit), None)
    if value is None:
        return None
    return Why(
        CONSTANT_OVERFLOW,
        f"the constant {value:g} in {op_name} is beyond the {short_dtype(out.dtype)} range "
        f"(max {limit:.4g}): it is {'-' if value < 0 else '+'}inf there",
    )


def _dtype_of(out) -> str | None:
    return short_dtype(out.dtype) if isinstance(out, torch.Tensor) else None


def _element_args(args, out: torch.Tensor):
    lists = [a for a in args if isinstance(a, (list, tuple))]
    index = next((i for i, t in enumerate(lists[0]) if t is out), 0) if lists else 0
    return tuple(a[index] if isinstance(a, (list, tuple)) and len(a) > index else a for a in args)


def explain_nan_from_inf(op_name: str, args, out: torch.Tensor) -> Why:
    """Why an op turned infinite (but not NaN) inputs into NaN."""
    if op_name in ("_softmax", "softmax", "_log_softmax", "log_softmax"):
        x = _first_tensor(args)
        dim = args[1] if len(args) > 1 and isinstance(args[1], int) else -1
        rows = _count(torch.isneginf(x.detach()).all(dim=dim))
        if rows:
            verb = "is" if rows == 1 else "are"
            text = f"softmax over {_plural(rows, 'row')} that {verb} entirely -inf (fully masked)"
            return Why(MASKED_SOFTMAX, text, _dtype_of(out))
    known = {
        "add": "inf + (-inf)",
        "sub": "inf - inf",
        "mul": "0 x inf",
        "div": "inf / inf",
        "mm": "0 x inf inside a matrix product",
        "addmm": "0 x inf inside a matrix product",
        "bmm": "0 x inf inside a matrix product",
    }
    text = known.get(op_name, f"{op_name} turned infinite inputs into NaN")
    return Why(INF_ARITHMETIC, text, _dtype_of(out))


# What makes the derivative of a forward op infinite: said when a backward op of it blows up.
BACKWARD_HINTS = {
    "sqrt": "the derivative of sqrt(x) is infinite at x = 0",
    "rsqrt": "the derivative of rsqrt(x) is infinite at x = 0",
    "log": "the derivative of log(x) is infinite at x = 0",
    "log2": "the derivative of log(x) is infinite at x = 0",
    "log10": "the derivative of log(x) is infinite at x = 0",
    "pow": "the derivative of x**p (p < 1) is infinite at x = 0",
    "div": "the derivative of a/b is infinite where b = 0",
    "reciprocal": "the derivative of 1/x is infinite at x = 0",
    "acos": "the derivative of acos(x) is infinite at |x| = 1",
    "asin": "the derivative of asin(x) is infinite at |x| = 1",
    "atan2": "the derivative of atan2(y, x) is undefined at (0, 0)",
    "linalg_vector_norm": "the derivative of a norm is undefined for an all-zero vector",
    "norm": "the derivative of a norm is undefined for an all-zero vector",
    "cdist": "the derivative of a distance is undefined where two points coincide",
}
