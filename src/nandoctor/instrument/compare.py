"""Compare a tensor with its reference: errors over finite elements, NaN/Inf on one side only."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_map

# From least to most precise. tf32: float32 matmuls on Ampere+ GPUs (a 10-bit mantissa).
_PRECISIONS = ("bfloat16", "float16", "tf32", "float32", "float64")
# Unit roundoff of each precision: half the distance from 1 to the next number.
UNIT_ROUNDOFF = {"bfloat16": 2**-8, "float16": 2**-11, "tf32": 2**-11, "float32": 2**-24,
                 "float64": 2**-53}  # fmt: skip
_PRECISION_OF_DTYPE = {
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.complex64: "float32",
    torch.float64: "float64",
    torch.complex128: "float64",
}


@dataclass(frozen=True)
class Tolerance:
    """`|target - reference| <= atol + rtol * max(|reference|, near_zero * max |reference|)`."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class Comparison:
    """How one target tensor differs from its reference (plain values only)."""

    elements: int
    max_abs_err: float | None  # over elements finite on both sides; None when there are none
    max_rel_err: float | None  # error / max(|reference|, near_zero * max |reference|)
    ratio: float  # worst error / its bound: above 1 is beyond tolerance
    beyond: int  # elements beyond tolerance
    only_target: int  # elements non-finite in the target, finite in the reference
    only_reference: int  # elements finite in the target, non-finite in the reference
    reference_max: float | None  # largest finite |reference|
    target_max: float | None  # largest finite |target|

    @property
    def nonfinite_only_on(self) -> str | None:
        if self.only_target:
            return "target"
        return "reference" if self.only_reference else None

    @property
    def diverges(self) -> bool:
        return bool(self.only_target or self.only_reference or self.ratio > 1.0)

    @property
    def score(self) -> tuple[int, float]:
        """Sort key of the worst ops: one-sided non-finite values first, then the ratio."""
        return (1 if self.nonfinite_only_on else 0, self.ratio)


def as_float64(t: torch.Tensor) -> torch.Tensor:
    """A float64 CPU copy of `t` (complex as pairs of reals)."""
    t = t.detach()
    if t.is_complex():
        t = torch.view_as_real(t)
    return t.to(device="cpu", dtype=torch.float64)


def compare_tensors(
    target: torch.Tensor,
    reference: torch.Tensor,
    tolerance: Tolerance,
    near_zero: float,
    allowance: torch.Tensor | None = None,
) -> Comparison:
    """Compare `target` with `reference` element by element, in float64 on the CPU.

    Elements non-finite on both sides agree whatever their kind (NaN, +inf, -inf): the target
    and its reference saw the same non-finite inputs or wrote the same mask. Near-zero reference
    elements are judged against `near_zero` times the tensor's largest |reference|, so the
    rounding noise of a cancellation (a sum of large terms that comes out near 0) is not a
    divergence. `allowance`, when given, is an extra error per element that is not held
    against the target (see `rounding_allowance`).
    """
    t, r = as_float64(target), as_float64(reference)
    finite_t, finite_r = torch.isfinite(t), torch.isfinite(r)
    only_target = int((~finite_t & finite_r).sum())
    only_reference = int((finite_t & ~finite_r).sum())
    both = finite_t & finite_r
    reference_max = _largest(r, finite_r)
    target_max = _largest(t, finite_t)
    if not bool(both.any()):
        return Comparison(t.numel(), None, None, 0.0, 0, only_target, only_reference,
                          reference_max, target_max)  # fmt: skip
    error = (t[both] - r[both]).abs()
    magnitude = r[both].abs()
    scale = magnitude.clamp(min=near_zero * float(magnitude.max()))
    bound = tolerance.atol + tolerance.rtol * scale
    if allowance is not None:
        bound = bound + as_float64(allowance)[both]
    relative = error / scale.clamp(min=torch.finfo(torch.float64).tiny)
    return Comparison(
        elements=t.numel(),
        max_abs_err=float(error.max()),
        max_rel_err=float(relative.max()),
        ratio=float((error / bound).max()),
        beyond=int((error > bound).sum()),
        only_target=only_target,
        only_reference=only_reference,
        reference_max=reference_max,
        target_max=target_max,
    )


def _largest(t: torch.Tensor, finite: torch.Tensor) -> float | None:
    return float(t[finite].abs().max()) if bool(finite.any()) else None


def max_abs(tensors) -> float | None:
    """Largest finite |x| over floating tensors; None when none holds a finite value."""
    values = []
    for t in tensors:
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()):
            t = as_float64(t)
            if (largest := _largest(t, torch.isfinite(t))) is not None:
                values.append(largest)
    return max(values) if values else None


def least_precise(dtypes) -> str:
    """The precision name of the least precise floating dtype among `dtypes`."""
    return min((_PRECISION_OF_DTYPE.get(d, "float32") for d in dtypes), key=_PRECISIONS.index)


def nudged(inputs, precision: str, seed: int = 0):
    """A copy of `inputs` with every floating tensor moved by two units in the last place of
    `precision`, with random signs from a private generator (the script's random stream is
    not touched)."""
    step = 2.0 * UNIT_ROUNDOFF[precision]
    generator = torch.Generator().manual_seed(seed)

    def nudge(value):
        if not (isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel()):
            return value
        signs = torch.randint(0, 2, value.shape, generator=generator) * 2 - 1
        return (value.to(torch.float64) * (1.0 + step * signs)).to(value.dtype)

    return tree_map(nudge, inputs)


def rounding_allowance(moved: torch.Tensor, reference: torch.Tensor, factor: float) -> torch.Tensor:
    """`factor` times how far each element of `reference` moved when the inputs were nudged,
    and at least the tensor's mean move: one random nudge can leave an element in place by
    chance where rounding would not. Elements that went non-finite get no bound at all."""
    shift = torch.nan_to_num((as_float64(moved) - as_float64(reference)).abs(), nan=math.inf)
    finite = shift[torch.isfinite(shift)]
    floor = float(finite.mean()) if finite.numel() else 0.0
    return shift.clamp(min=floor) * factor
