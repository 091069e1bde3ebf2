"""Shadow execution: every op of the script runs again on a reference (the CPU at the same dtype,
or float64 on the CPU) with the same inputs, and the two results are compared.

A divergence is an op whose result differs from the reference's beyond the tolerance of its
dtype, or is non-finite on one side only. Both sides non-finite at the same places (an -inf
mask, a NaN that came in with the inputs) is agreement, not a divergence.

In float64 mode the reference also follows its own values through each step (the *chain*: an
op's chain inputs are the chain results of the ops that made them, restarted from the target's
values at every optimizer step). A NaN/Inf made from finite inputs that the same-input
reference reproduces but the chain does not was made by rounding earlier in the step
(cancellation in float16/bfloat16); the first op where the chain drifted beyond tolerance and
lost a tenth of its value to rounding is reported as where it started (a step of float16 layers
drifts a few times its tolerance on its own, which starts nothing).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
from collections import Counter
from dataclasses import asdict, dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from nandoctor.instrument.compare import (
    Comparison,
    Tolerance,
    compare_tensors,
    least_precise,
    max_abs,
    nudged,
    rounding_allowance,
)
from nandoctor.instrument.explain import explain_birth
from nandoctor.instrument.frames import SourceLine, find_user_frame
from nandoctor.instrument.op_plans import (
    ACCELERATOR_ATTENTION,
    CONV_OPS,
    CONVERSIONS,
    MATMUL_OPS,
    OpPlan,
    argument,
    attention_reference,
    is_exact_copy,
    is_floating,
    pair_up,
    plan_of,
    results_of,
    tensors_in,
    upcast,
)
from nandoctor.instrument.reference_chain import ReferenceChain
from nandoctor.instrument.tensors import (
    count_nonfinite,
    is_finite,
    scalar_of_a_wrapped_number,
    short_dtype,
)

_current_node = torch._C._current_autograd_node
_peek_sequence_nr = torch._C._autograd._get_sequence_nr

_CHAIN_BASIS = "float64 followed from the step's start"
# The relative error at which rounding has cost a value its leading digit: a cancellation, not
# the noise float16 (2**-11) or bfloat16 (2**-8) adds at every op.
_LOST_THE_VALUE = 0.1
_MAX_WORST_KEYS = 2000


@dataclass(frozen=True)
class ShadowSettings:
    """What the stage asks of the shadow; travels to the child as plain values."""

    reference: str  # auto | cpu | float64
    start: int  # first optimizer step compared
    stop: int  # steps from this one on are not compared
    max_ops_per_step: int  # beyond it, ops are sampled evenly
    max_op_elements: int  # ops with more input elements are not run again
    near_zero: float  # see compare_tensors
    rounding_factor: float  # see ShadowMode._judge_with_rounding
    top_k: int  # worst ops kept
    tolerances: dict[str, Tolerance]  # by dtype name: float16, bfloat16, float32, tf32, float64

    @classmethod
    def from_dict(cls, data: dict) -> ShadowSettings:
        tolerances = {name: Tolerance(**value) for name, value in data["tolerances"].items()}
        return cls(**{**data, "tolerances": tolerances})


@dataclass(frozen=True)
class _Site:
    """Where a forward op ran: its backward ops are reported at this line and module."""

    op: str
    location: SourceLine | None
    module: str | None


def accelerator() -> str | None:
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    return "mps" if mps is not None and mps.is_available() else None


class ShadowMode(TorchDispatchMode):
    """Runs each op of the compared steps again on the reference and records divergences.

    `context` is the watch session: `step`, `phase`, `module`, `backward_call`, `paused`,
    `stopping` and `events`.
    """

    def __init__(self, context, settings: ShadowSettings) -> None:
        super().__init__()
        self.context = context
        self.settings = settings
        self.accelerator = accelerator()
        asked = settings.reference
        self.reference = asked if asked != "auto" else ("cpu" if self.accelerator else "float64")
        # float64 reference for the op being run: always in float64 mode; in auto mode with an
        # accelerator, for the ops the script runs on the CPU
        self.float64 = self.reference == "float64"
        self.first: dict | None = None
        self.counts: Counter = Counter()  # compared, sampled out, skipped by reason
        self.targets: Counter = Counter()  # "cpu-float32", "cuda:0-float16": ops compared
        self.references: Counter = Counter()  # "cpu", "cpu-float64": ops compared
        self.failures: dict[str, str] = {}  # op -> why the reference could not run it
        self.steps_compared: list[int] = []
        self._step: int | None = None  # the step being compared
        self._worst: dict[tuple, dict] = {}
        self._plans: dict = {}
        self._chain = ReferenceChain()
        self._drift: dict | None = None  # first op of this step whose chain drifted
        self._sites: dict[int, _Site] = {}
        self._last_sequence_nr = _peek_sequence_nr()
        self._op_index = 0
        self._compared_this_step = 0
        self._stride = 1
        self._pid = os.getpid()
        self._cuda_major: int | None = None
        self._input_dtypes: set = set()  # floating dtypes of the op being shadowed
        self._written: list = []  # the tensors it writes

    def describe(self) -> dict:
        """The reference chosen and why, for the report."""
        asked = self.settings.reference
        if asked != "auto":
            reason = f"chosen with --reference {asked}"
        elif self.accelerator:
            reason = (
                f"{self.accelerator} present: the script's ops on it ran again on the CPU at "
                "the same dtype (ops it keeps on the CPU, in float64)"
            )
        else:
            reason = (
                "no accelerator (CUDA or MPS): the script's ops ran again on the CPU in "
                "float64, which answers the precision question"
            )
        return {"reference": self.reference, "asked": asked, "reason": reason,
                "accelerator": self.accelerator}  # fmt: skip

    @staticmethod
    def cuda_state() -> dict:
        """The GPU and its TF32 switches as the script left them. Read only once the script
        has started CUDA itself: starting it here could change what the script does."""
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {}
        return {
            "device_name": torch.cuda.get_device_name(),
            "tf32": {
                "matmul": bool(torch.backends.cuda.matmul.allow_tf32),
                "cudnn": bool(torch.backends.cudnn.allow_tf32),
                "capability": ".".join(map(str, torch.cuda.get_device_capability())),
            },
        }

    # ---- the mode ---------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if scalar_of_a_wrapped_number(func, args):
            return args[0]
        if not self._in_window():
            return func(*args, **kwargs)
        node = _current_node()
        if node is None:
            self._record_site(func)
        plan = self._plans.get(func)
        if plan is None:
            plan = self._plans[func] = plan_of(func)
        skip = plan.skip or self._skip_now(plan, args, kwargs)
        if skip is not None:
            self.counts[f"skipped: {skip}"] += 1
            out = func(*args, **kwargs)
            self._after_op(node)
            if self.float64 and skip in ("view", "exact copy", "not computed"):
                self._chain.carry(plan, func, args, kwargs, out, self._to_reference)
            return out
        sampled = self._take_sample()
        # An op that writes its inputs needs their copies before it runs; others leave them be.
        local = self._copy_inputs(args, kwargs) if plan.writes and sampled else None
        chained = self._chain_inputs(args, kwargs) if sampled else None
        out = func(*args, **kwargs)
        self._after_op(node)
        if not sampled:
            if plan.writes or not _is_birth(args, kwargs, out):
                self.counts["sampled out"] += 1
                return out
            chained = self._chain_inputs(args, kwargs)
        try:
            self._shadow(func, plan, (args, kwargs), out, local, chained, node)
        except Exception as error:  # the reference could not run it: counted, never fatal
            self.counts["skipped: reference failed"] += 1
            if len(self.failures) < 10:
                self.failures.setdefault(str(func), f"{type(error).__name__}: {error}"[:200])
        return out

    def _in_window(self) -> bool:
        context = self.context
        if context.paused or context.stopping or os.getpid() != self._pid:
            return False
        step = context.step
        if step != self._step:
            if self._step is not None:
                self._end_step()
            self._step = step
        return self.settings.start <= step < self.settings.stop

    def _after_op(self, node) -> None:
        if node is None:
            self._last_sequence_nr = _peek_sequence_nr()

    def _skip_now(self, plan: OpPlan, args, kwargs) -> str | None:
        """Reasons that depend on the arguments of this call."""
        if plan.dropout_arg is not None and argument(args, kwargs, *plan.dropout_arg, 0.0):
            return "random"
        tensors = tensors_in((args, kwargs))
        if any(t.layout != torch.strided or t.device.type == "meta" for t in tensors):
            return "unsupported tensor"
        if sum(t.numel() for t in tensors) > self.settings.max_op_elements:
            return "too large"
        if plan.name in CONVERSIONS and is_exact_copy(plan, args, kwargs):
            return "exact copy"
        if self.reference == "cpu":
            devices = {t.device.type for t in tensors}
            if not tensors and isinstance(kwargs.get("device"), torch.device):
                devices = {kwargs["device"].type}
            on_cpu = devices <= {"cpu"}
            if on_cpu and self.settings.reference == "cpu":
                return "already on the cpu"
            # auto: an op the script keeps on the CPU is compared against float64 instead
            self.float64 = on_cpu
        return None

    def _take_sample(self) -> bool:
        """Compare every `stride`-th op, at most `max_ops_per_step` per step; every op of the
        window's last step (the failing one, when the run failed): an op left out breaks the
        float64 chain, and an eps that rounds to 0 a few ops before the NaN is seen only
        through an unbroken chain."""
        index = self._op_index
        self._op_index += 1
        if self._step == self.settings.stop - 1:
            return True
        return (
            index % self._stride == 0 and self._compared_this_step < self.settings.max_ops_per_step
        )

    # ---- running the reference --------------------------------------------------------------
    def _to_reference(self, value, float64: bool | None = None):
        """A CPU copy of a tensor argument (float64 for floating ones in float64 mode); device
        and floating dtype arguments rewritten the same way; everything else as it is."""
        promote = self.float64 if float64 is None else float64
        if isinstance(value, torch.Tensor):
            dtype = upcast(value.dtype) if promote else value.dtype
            return value.detach().to(device="cpu", dtype=dtype, copy=True)
        if isinstance(value, torch.device):
            return torch.device("cpu")
        if isinstance(value, torch.dtype) and promote:
            return upcast(value)
        return value

    def _copy_inputs(self, args, kwargs, float64: bool | None = None):
        copied_args, copied_kwargs = tree_map(
            lambda value: self._to_reference(value, float64), (args, kwargs)
        )
        if copied_kwargs.get("pin_memory"):
            copied_kwargs["pin_memory"] = False
        return copied_args, copied_kwargs

    def _run(self, func, plan: OpPlan, inputs) -> list:
        """Run the op on reference inputs; its results in the order of `results_of`."""
        args, kwargs = inputs
        with torch.no_grad():
            if plan.name in ACCELERATOR_ATTENTION:
                out = attention_reference(plan, args, kwargs)
            else:
                out = func(*args, **kwargs)
        return results_of(plan, out, args, kwargs)

    def _shadow(self, func, plan: OpPlan, inputs, out, local, chained, node) -> None:
        self._input_dtypes = {t.dtype for t in tensors_in(inputs) if is_floating(t)}
        self._written = tensors_in([argument(*inputs, *w) for w in plan.writes])
        targets = results_of(plan, out, *inputs)
        local = local or self._copy_inputs(*inputs)
        # an op that writes its inputs gets copies: `local` may be needed again, untouched
        references = self._run(func, plan, _clone(local) if plan.writes else local)
        pairs = pair_up(targets, references)
        if not pairs:
            self.counts["skipped: no float output"] += 1
            return
        self.counts["compared"] += 1
        self._compared_this_step += 1
        target, comparison = self._worst_pair(pairs, plan)
        if comparison.ratio > 1.0 and not comparison.nonfinite_only_on:
            target, comparison = self._judge_with_rounding(func, plan, local, pairs, target)
        self.targets[_label(target)] += 1
        self.references["cpu-float64" if self.float64 else "cpu"] += 1
        basis, drift_from = "same inputs", None
        seen = local if plan.writes else inputs  # the inputs as the op saw them, for evidence
        if self.float64:
            followed = self._follow(func, plan, seen, targets, references, chained, local,
                                    comparison, node)  # fmt: skip
            if followed is not None:
                (target, comparison), basis, drift_from = followed, _CHAIN_BASIS, self._drift
        elif _overflows_on_both(comparison, target, local):
            escalated = self._float64_check(func, plan, local, targets, target)
            if escalated is not None:
                comparison, basis = escalated, "float64 (the CPU at the same dtype overflows too)"
        if node is not None and comparison.only_target and self._loss_is_scaled():
            self.counts["scaled backward overflow"] += 1  # GradScaler skips that step itself
            return
        self._record(func, plan, seen, target, comparison, node, basis, drift_from)

    def _loss_is_scaled(self) -> bool:
        """A GradScaler scales the loss up until gradients overflow, on purpose."""
        return bool(getattr(self.context, "uses_grad_scaler", False))

    def _worst_pair(self, pairs, plan: OpPlan, allowances=None) -> tuple[torch.Tensor, Comparison]:
        allowances = allowances or [None] * len(pairs)
        compared = [
            (t, self._compare(t, r, plan, allowance))
            for (t, r), allowance in zip(pairs, allowances, strict=True)
        ]
        return max(compared, key=lambda pair: pair[1].score)

    def _judge_with_rounding(self, func, plan: OpPlan, local, pairs, target):
        """Beyond tolerance: is it more than rounding at the op's own precision explains?

        The reference runs once more on inputs moved by two units in the last place of that
        precision (random signs, from a private generator: the script's random stream is not
        touched). How far its result moves is what rounding inside the op can do, e.g. in a sum
        of large terms that cancel; `rounding_factor` times that is not held against the op.
        """
        precision, _ = self._tolerance(target, plan)
        moved = pair_up([t for t, _ in pairs], self._run(func, plan, nudged(local, precision)))
        if len(moved) != len(pairs):
            return self._worst_pair(pairs, plan)
        factor = self.settings.rounding_factor
        allowances = [
            rounding_allowance(m, r, factor) for (_, r), (_, m) in zip(pairs, moved, strict=True)
        ]
        return self._worst_pair(pairs, plan, allowances)

    def _tolerance(self, target: torch.Tensor, plan: OpPlan) -> tuple[str, Tolerance]:
        """The tolerance of the least precise dtype among the op's result and its floating
        inputs: an op fed bfloat16 computes at bfloat16's precision whatever it returns."""
        name = least_precise({target.dtype, *self._input_dtypes})
        if name == "float32" and target.device.type == "cuda" and self._uses_tf32(plan):
            name = "tf32"
        return name, self.settings.tolerances.get(name, self.settings.tolerances["float32"])

    def _uses_tf32(self, plan: OpPlan) -> bool:
        if plan.name in MATMUL_OPS:
            enabled = torch.backends.cuda.matmul.allow_tf32
        elif plan.name in CONV_OPS:
            enabled = torch.backends.cudnn.allow_tf32
        else:
            return False
        if self._cuda_major is None:
            self._cuda_major = torch.cuda.get_device_capability()[0]
        return bool(enabled) and self._cuda_major >= 8

    def _compare(self, target, reference, plan: OpPlan, allowance=None) -> Comparison:
        _, tolerance = self._tolerance(target, plan)
        return compare_tensors(target, reference, tolerance, self.settings.near_zero, allowance)

    def _float64_check(self, func, plan: OpPlan, local, targets, target) -> Comparison | None:
        """The op overflows on the accelerator and on the CPU alike: is float64 finite?"""
        results = self._run(func, plan, self._copy_inputs(*local, float64=True))
        for t, reference in pair_up(targets, results):
            if t is target:
                comparison = self._compare(target, reference, plan)
                return comparison if comparison.nonfinite_only_on == "target" else None
        return None

    # ---- the chain (float64 mode) -----------------------------------------------------------
    def _chain_inputs(self, args, kwargs):
        return self._chain.inputs(args, kwargs, self._to_reference) if self.float64 else None

    def _follow(self, func, plan, inputs, targets, references, chained, local, same_inputs, node):
        """Carry the chain through this op. Returns the (target, comparison) to report instead
        of the same-input one when the chain stays finite where the target made NaN/Inf from
        finite inputs that the same-input reference turned non-finite too."""
        if chained is None:  # no input has a chain value: the same-input result starts one
            self._chain.store(targets, references, self._written)
            return None
        results = self._run(func, plan, chained)
        self._chain.store(targets, results, self._written)
        pairs = pair_up(targets, results)
        if not pairs or same_inputs.diverges:
            return None
        target, comparison = self._worst_pair(pairs, plan)
        if comparison.nonfinite_only_on == "target":
            return (target, comparison) if _inputs_finite(local) else None
        lost = comparison.ratio > 1.0 and (comparison.max_rel_err or 0.0) >= _LOST_THE_VALUE
        if lost and self._drift is None:
            self._drift = self._describe(func, plan, inputs, target, comparison, node,
                                         _CHAIN_BASIS)  # fmt: skip
        return None

    # ---- records ----------------------------------------------------------------------------
    def _record(self, func, plan, inputs, target, comparison, node, basis, drift_from) -> None:
        """Keep the op among the worst if it is one; emit the first divergence at once."""
        first = comparison.diverges and self.first is None
        location = self._where(node)[1]
        key = (str(func), node is not None, (location.file, location.line) if location else ())
        known = self._worst.get(key)
        if not first and known is not None and comparison.score <= tuple(known["score"]):
            return
        record = self._describe(func, plan, inputs, target, comparison, node, basis)
        if drift_from is not None:
            record["drift_from"] = drift_from
        self._worst[key] = record
        if len(self._worst) > _MAX_WORST_KEYS:
            del self._worst[min(self._worst, key=lambda k: tuple(self._worst[k]["score"]))]
        if first:
            self.first = record
            self.context.events.emit("shadow_divergence", **record)

    def _describe(self, func, plan, inputs, target, comparison, node, basis) -> dict:
        tolerance_name, tolerance = self._tolerance(target, plan)
        phase, location, module, backward_node = self._where(node)
        float64 = self.float64 or basis != "same inputs"
        record = {
            "step": self.context.step,
            "phase": phase,
            "op": str(func),
            "module": module,
            "location": location.as_dict() if location else None,
            "backward_node": backward_node,
            "target": _label(target),
            "reference": f"cpu-{'float64' if float64 else short_dtype(target.dtype)}",
            "basis": basis,
            "tolerance": {"dtype": tolerance_name, **asdict(tolerance)},
            **asdict(comparison),
            "nonfinite_only_on": comparison.nonfinite_only_on,
            "beyond_tolerance": comparison.diverges,
            "score": list(comparison.score),
            "shape": list(target.shape),
        }
        if comparison.diverges:
            record["input_max"] = max_abs(tensors_in(inputs))
        if comparison.only_target:
            record["target_nonfinite"] = count_nonfinite(target).describe()
            why = explain_birth(plan.name, *inputs, target)
            record["explanation"], record["birth_kind"] = why.text, why.kind
        return record

    def _where(self, node) -> tuple[str, SourceLine | None, str | None, str | None]:
        """Phase, user line, module and autograd node of the op being run."""
        if node is None:
            return self.context.phase, find_user_frame(), self.context.module, None
        site = self._sites.get(node._sequence_nr())
        if site is None:
            return "backward", getattr(self.context, "backward_call", None), None, node.name()
        return "backward", site.location, site.module, node.name()

    def _record_site(self, func) -> None:
        """Autograd nodes are made before the op reaches the mode: the sequence numbers handed
        out since the last op belong to this one (its backward ops map back to its line)."""
        current = _peek_sequence_nr()
        if current == self._last_sequence_nr:
            return
        site = _Site(str(func), find_user_frame(), self.context.module)
        for sequence_nr in range(self._last_sequence_nr, current):
            self._sites[sequence_nr] = site
        self._last_sequence_nr = current

    # ---- step boundaries and summaries ------------------------------------------------------
    def _end_step(self) -> None:
        """The first op of a new step closes the last one: sampling for the next, a fresh
        chain, and a summary event (so a run killed later still leaves one)."""
        if self.settings.start <= self._step < self.settings.stop:
            self.steps_compared.append(self._step)
            self.emit_summary()
        if self._op_index > self.settings.max_ops_per_step:
            self._stride = math.ceil(self._op_index / self.settings.max_ops_per_step)
        self._op_index = 0
        self._compared_this_step = 0
        self._chain.reset()
        self._drift = None
        self._sites.clear()

    def summary(self) -> dict:
        worst = sorted(self._worst.values(), key=lambda r: tuple(r["score"]), reverse=True)
        steps = list(self.steps_compared)
        current = self._step
        if current is not None and current not in steps and self._op_index:
            steps.append(current)  # the step the run stopped in
        return {
            "ops_compared": self.counts["compared"],
            "counts": dict(self.counts),
            "targets": dict(self.targets),
            "references": dict(self.references),
            "reference_failures": dict(self.failures),
            "steps_compared": steps,
            "stride": self._stride,
            "worst": worst[: self.settings.top_k],
            **self.cuda_state(),
        }

    def emit_summary(self) -> None:
        self.context.events.emit("shadow_summary", **self.summary())


def install_shadow(session, settings: dict) -> ShadowMode:
    """Enter the shadow mode for the rest of the run; its summary is emitted at every step
    boundary and once more when the process exits."""
    mode = ShadowMode(session, ShadowSettings.from_dict(settings))
    session.events.emit("shadow_start", **mode.describe(), window=[mode.settings.start,
                        mode.settings.stop])  # fmt: skip
    mode.__enter__()

    def finish() -> None:
        mode.emit_summary()
        with contextlib.suppress(Exception):  # the interpreter is exiting: nothing to restore
            mode.__exit__(None, None, None)

    atexit.register(finish)
    return mode


def _clone(inputs):
    return tree_map(lambda v: v.clone() if isinstance(v, torch.Tensor) else v, inputs)


def _label(t: torch.Tensor) -> str:
    device = f"cuda:{t.device.index or 0}" if t.device.type == "cuda" else str(t.device)
    return f"{device}-{short_dtype(t.dtype)}"


def _inputs_finite(inputs) -> bool:
    return all(is_finite(t) for t in tensors_in(inputs) if is_floating(t))


def _is_birth(args, kwargs, out) -> bool:
    """Finite inputs, a non-finite output: the op that overflows must be compared even when
    sampling passes it by."""
    outputs = [t for t in tensors_in(out) if is_floating(t)]
    return not all(is_finite(t) for t in outputs) and _inputs_finite((args, kwargs))


def _overflows_on_both(comparison: Comparison, target: torch.Tensor, local) -> bool:
    """The same-dtype reference and the target agree on NaN/Inf made from finite inputs."""
    return not comparison.diverges and not is_finite(target) and _inputs_finite(local)
