"""The `device_compare:` section of a profile: reference, window, budgets, tolerances."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields

from nandoctor.errors import ConfigError

REFERENCES = ("auto", "cpu", "float64")


@dataclass(frozen=True)
class Tolerance:
    """An op's result agrees with its reference when, element by element,
    `|target - reference| <= atol + rtol * max(|reference|, near_zero * max |reference|)`."""

    atol: float
    rtol: float


@dataclass(frozen=True)
class Tolerances:
    """By the dtype of the op's result on the target. A few units in the last place: rounding
    and a different summation order stay inside, overflow and cancellation do not."""

    float16: Tolerance = field(default_factory=lambda: Tolerance(atol=1e-5, rtol=1e-2))
    bfloat16: Tolerance = field(default_factory=lambda: Tolerance(atol=1e-5, rtol=5e-2))
    # float32 matmuls and convolutions on Ampere+ GPUs while TF32 is allowed (10-bit mantissa)
    tf32: Tolerance = field(default_factory=lambda: Tolerance(atol=1e-5, rtol=1e-2))
    float32: Tolerance = field(default_factory=lambda: Tolerance(atol=1e-6, rtol=1e-4))
    float64: Tolerance = field(default_factory=lambda: Tolerance(atol=1e-12, rtol=1e-9))


@dataclass(frozen=True)
class Settings:
    """Settings of the device comparison (the `device_compare:` section of a profile)."""

    # Optimizer steps shadowed op by op: those ending at the step where the watched run first
    # went non-finite, or the first steps of a run that stayed finite.
    steps: int = 3
    # Also compare when the watched run stayed finite (`nandoctor compare-devices` does; in the
    # whole checklist a finite run leaves nothing for the comparison to explain).
    when_finite: bool = False
    # Also compare a run that computed in float32 on the CPU alone (`nandoctor compare-devices`
    # does). In the whole checklist such a run leaves neither question open: no accelerator
    # to blame, no reduced precision (float16, bfloat16, TF32) to blame, and a float64 re-run
    # that stays finite proves only that float64 has more range, not that the dtype is the bug.
    when_float32_cpu: bool = False
    # What the ops are compared against. auto: the CPU at the same dtype when CUDA or MPS is
    # present, else float64 on the CPU; cpu | float64 choose explicitly.
    reference: str = "auto"
    # Ops compared per step at most; beyond it every k-th op is (an op that turns finite inputs
    # into NaN/Inf is always compared).
    max_ops_per_step: int = 2000
    # Ops whose inputs hold more elements are not run again (too slow to redo on the CPU).
    max_op_elements: int = 50_000_000
    # Near-zero results are judged against this fraction of the tensor's largest |value|, so
    # the rounding noise of a cancellation is not a divergence.
    near_zero: float = 0.01
    # An op is not blamed for up to this many times the change in its float64 result that
    # moving its inputs by two units in the last place of its dtype makes (rounding inside the
    # op, e.g. a sum whose terms cancel, is not a divergence).
    rounding_factor: float = 10.0
    # Worst ops kept in the report.
    top_k: int = 10
    # With CUDA: steps run on the CPU (CUDA hidden) and on the GPU, same seed, losses compared.
    run_steps: int = 5
    # Per-step losses of those two runs agree within this relative difference.
    loss_rtol: float = 1e-3
    tolerances: Tolerances = field(default_factory=Tolerances)

    def __post_init__(self) -> None:
        if self.reference not in REFERENCES:
            raise ConfigError(
                f"device_compare.reference must be one of {', '.join(REFERENCES)}: "
                f"got {self.reference!r}"
            )
        for name in ("steps", "max_ops_per_step", "max_op_elements", "top_k", "run_steps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"device_compare.{name} must be an integer >= 1: got {value!r}")
        _check_number("device_compare.near_zero", self.near_zero)
        _check_number("device_compare.rounding_factor", self.rounding_factor)
        _check_number("device_compare.loss_rtol", self.loss_rtol)
        for dtype in fields(Tolerances):
            tolerance = getattr(self.tolerances, dtype.name)
            for part in ("atol", "rtol"):
                where = f"device_compare.tolerances.{dtype.name}.{part}"
                _check_number(where, getattr(tolerance, part))

    def shadow_options(self, start: int, stop: int) -> dict:
        """What the child's shadow needs, as plain values."""
        return {
            "reference": self.reference,
            "start": start,
            "stop": stop,
            "max_ops_per_step": self.max_ops_per_step,
            "max_op_elements": self.max_op_elements,
            "near_zero": self.near_zero,
            "rounding_factor": self.rounding_factor,
            "top_k": self.top_k,
            "tolerances": asdict(self.tolerances),
        }


def _check_number(where: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        hint = (
            " (YAML reads a number like 1e-5 as text: write 1.0e-5)"
            if isinstance(value, str)
            else ""
        )
        raise ConfigError(f"{where} must be a number >= 0: got {value!r}{hint}")
