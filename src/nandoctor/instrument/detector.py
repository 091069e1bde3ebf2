"""Per-op NaN/Inf detection: a dispatch mode that records where non-finite values are born.

Every op's outputs get the cheap finiteness check. A non-finite output whose inputs were
finite is a *birth*; one whose inputs were already non-finite carries their *taint* (the set
of births it came from). A birth only matters once its taint reaches a loss, a gradient or a
parameter, which the session checks; intermediate -inf masks that softmax absorbs never do.

Backward ops are mapped to the forward op, user line and module that created their autograd
node through autograd sequence numbers recorded at forward time.
"""

from __future__ import annotations

import itertools
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from nandoctor.instrument.explain import BACKWARD_HINTS, explain_birth, explain_nan_from_inf
from nandoctor.instrument.frames import SourceLine, find_user_frame
from nandoctor.instrument.kinds import NONFINITE_INPUT, NONFINITE_PARAMETER, RECEIVED, UNKNOWN
from nandoctor.instrument.tensors import (
    count_nonfinite,
    is_checked,
    is_finite,
    iter_tensors,
    process_group_initialized,
    scalar_of_a_wrapped_number,
)

_peek_sequence_nr = torch._C._autograd._get_sequence_nr
_current_node = torch._C._current_autograd_node

# Ops whose outputs are uninitialized memory or another tensor's storage: garbage, not births.
_UNCHECKED_OPS = {
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set", "resize",
    "resize_as", "lift_fresh", "lift_fresh_copy", "_local_scalar_dense",
    "isnan", "isinf", "isfinite", "isposinf", "isneginf", "equal", "allclose",
}  # fmt: skip
# Ops that alias their input (`.grad` arrives through `detach`): the output carries the input's
# taint, with no check needed.
_ALIAS_OPS = {"detach", "alias", "view", "_unsafe_view", "reshape", "expand", "t", "transpose",
              "permute", "squeeze", "unsqueeze", "select", "slice", "as_strided"}  # fmt: skip
# Creation and masking ops that write a non-finite *constant* on purpose (attention masks).
_MASK_OPS = {"masked_fill", "fill", "full", "full_like", "new_full", "where", "index_put",
             "index_fill", "masked_scatter", "scalar_tensor", "copy", "clamp", "triu", "tril"}  # fmt: skip

# A clamp's bound can sit exactly where the next op breaks: `acos(x.clamp(-1, 1))` has an
# infinite derivative at the bound, `sqrt(x.clamp(min=0))` too, `log(x.clamp(min=0))` is -inf
# there. Op -> (the position of the operand, its points).
_SINGULAR_POINTS = {
    "acos": (0, (-1.0, 1.0)), "asin": (0, (-1.0, 1.0)), "atanh": (0, (-1.0, 1.0)),
    "sqrt": (0, (0.0,)), "rsqrt": (0, (0.0,)), "reciprocal": (0, (0.0,)),
    "log": (0, (0.0,)), "log2": (0, (0.0,)), "log10": (0, (0.0,)), "log1p": (0, (-1.0,)),
    "div": (1, (0.0,)), "pow": (0, (0.0,)),
}  # fmt: skip
_BOUNDING_OPS = {"clamp", "clip", "clamp_min", "clamp_max"}

_MAX_BIRTHS = 20000
_MAX_SITES = 500000


def _computed_from_parameters(args, kwargs) -> bool:
    """An input of the op takes part in autograd: a parameter, or a value computed from one."""
    return any(t.requires_grad for t in iter_tensors((args, kwargs)))


def _reads_only_parameters(args, kwargs) -> bool:
    """Every floating input of the op is a parameter itself: what it computed is fixed by the
    weights alone (weight_norm's g and v, a learnable scale under log)."""
    inputs = [t for t in iter_tensors((args, kwargs)) if is_checked(t)]
    return bool(inputs) and all(isinstance(t, torch.nn.Parameter) for t in inputs)


def _received_from_another_rank(phase: str) -> bool:
    """Gradients and optimizer state of a multi-process run are what collectives write."""
    if phase not in ("backward", "optimizer"):
        return False
    return process_group_initialized() and torch.distributed.get_world_size() > 1


class StopRun(BaseException):
    """Ends the user's script. A BaseException, so the script's `except Exception` lets it pass."""


@dataclass
class Birth:
    """Where a non-finite value first appeared. Plain values only: no tensors are kept."""

    id: int
    step: int
    phase: str
    op: str
    module: str | None
    location: SourceLine | None
    explanation: str
    nonfinite: str  # "nan=3, +inf=1 of 64"
    has_nan: bool
    kind: str = UNKNOWN  # what happened, one of explain.py's kinds (the diagnosis decides on it)
    dtype: str | None = None  # the dtype the op computed in
    forward_op: str | None = None  # for a backward op: the forward op whose gradient it is
    facts: dict = field(default_factory=dict)  # counts measured on the op's inputs (explain.py)
    constant: bool = False  # an Inf written on purpose (mask constant), not computed
    parent: int | None = None  # for NaN made from Inf: the birth of that Inf
    backward_node: str | None = None
    backward_call: SourceLine | None = None
    inputs_nonfinite: bool = False  # entered torch already non-finite (data, numpy, files)
    received: bool = False  # written by a collective: another rank of the launch made it
    notes: list[str] = field(default_factory=list)
    # the clamp whose bound is the op's singular point, and what its output held there
    bounded_at: dict | None = None


@dataclass(frozen=True)
class ForwardSite:
    op: str
    location: SourceLine | None
    module: str | None


def _op_base(func) -> str:
    return func.overloadpacket.__name__.rstrip("_") or func.overloadpacket.__name__


def _reader(func) -> str:
    return func.overloadpacket.__name__ if func is not None else "torch"


# Ops that update arguments their schema does not mark as written: batch norm in training mode
# writes its running mean and variance (positions 3 and 4). A variance that overflows there is
# born in this op, not "already non-finite" when the next step reads it.
_UNDECLARED_WRITES = {"native_batch_norm": (3, 4), "cudnn_batch_norm": (3, 4),
                      "miopen_batch_norm": (3, 4)}  # fmt: skip


def _writes(func) -> tuple[int, ...]:
    """Positions of the arguments an op mutates (in-place and out= ops)."""
    positions = getattr(func, "_nandoctor_writes", None)
    if positions is None:
        declared = {
            i
            for i, arg in enumerate(func._schema.arguments)
            if arg.alias_info is not None and arg.alias_info.is_write
        }
        undeclared = _UNDECLARED_WRITES.get(func.overloadpacket.__name__, ())
        positions = tuple(sorted(declared.union(undeclared)))
        func._nandoctor_writes = positions
    return positions


def _nonfinite_scalar_argument(args) -> bool:
    return any(isinstance(a, float) and not math.isfinite(a) for a in args)


class NonfiniteDetector(TorchDispatchMode):
    """Sees every aten op of forward, backward and optimizer; records births and taint."""

    def __init__(self, context) -> None:
        super().__init__()
        self.context = context  # what the session knows: step, phase, module, pause/stop flags
        self.births: OrderedDict[int, Birth] = OrderedDict()
        self._taint: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._sites: dict[int, ForwardSite] = {}
        self._forward_births: set[int] = set()  # sequence numbers whose forward op gave non-finite
        # clamp outputs -> (min, max, where): a bound the next op cannot take is a fix's line
        self._bounds: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._bounded_at: dict[int, dict] = {}  # sequence number -> a clamp at a singular point
        self._bounded_now: dict | None = None  # the same, for the forward op being dispatched
        self._last_sequence_nr = _peek_sequence_nr()
        self._op_sequence_nrs = range(0)  # autograd nodes created by the op being dispatched
        self._ids = itertools.count(1)
        self._pid = os.getpid()

    # ---- the mode ---------------------------------------------------------------------------
    def activate(self) -> None:
        """Enter the mode now (also in the middle of a run: a replay that starts at step K)."""
        self._last_sequence_nr = _peek_sequence_nr()
        self.__enter__()

    def deactivate(self) -> None:
        self.__exit__(None, None, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if scalar_of_a_wrapped_number(func, args):
            return args[0]
        context = self.context
        if context.paused or os.getpid() != self._pid:
            return func(*args, **kwargs)
        if context.stopping:
            raise StopRun("nandoctor has what it needs")
        node = _current_node()
        self._record_forward_site(func)
        name = _op_base(func)
        if name in _UNCHECKED_OPS:
            return func(*args, **kwargs)
        if name in _ALIAS_OPS:
            out = func(*args, **kwargs)
            self._pass_taint(args, out)
            self._pass_bounds(args, out)
            return out
        written = [args[i] for i in _writes(func) if i < len(args)]
        bad_before = self._bad_before_write(written, context.phase)
        self._bounded_now = self._bounded_at_a_singular_point(name, args) if node is None else None
        out = func(*args, **kwargs)
        self._last_sequence_nr = _peek_sequence_nr()
        if name in _BOUNDING_OPS and node is None:
            self._record_bounds(name, args, kwargs, out)
        self._check(func, name, args, kwargs, out, written, bad_before, node)
        return out

    def _record_forward_site(self, func) -> None:
        """Autograd nodes are created before the op reaches this mode, so the sequence numbers
        handed out since the last op belong to this op."""
        current = _peek_sequence_nr()
        self._op_sequence_nrs = range(self._last_sequence_nr, current)
        if current == self._last_sequence_nr:
            return
        if len(self._sites) > _MAX_SITES:
            self._sites.clear()
            self._forward_births.clear()
            self._bounded_at.clear()
        site = ForwardSite(str(func), find_user_frame(), self.context.module)
        for sequence_nr in range(self._last_sequence_nr, current):
            self._sites[sequence_nr] = site
        self._last_sequence_nr = current

    # ---- clamps whose bound the next op cannot take -----------------------------------------
    def _record_bounds(self, name: str, args, kwargs, out) -> None:
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return
        given = list(args[1:]) + [None, None]
        if name == "clamp_min":
            low, high = given[0], None
        elif name == "clamp_max":
            low, high = None, given[0]
        else:
            low, high = kwargs.get("min", given[0]), kwargs.get("max", given[1])
        numbers = [b if isinstance(b, (int, float)) and not isinstance(b, bool) else None
                   for b in (low, high)]  # fmt: skip
        if numbers != [None, None]:
            self._bounds[out] = (*numbers, find_user_frame())

    def _pass_bounds(self, args, out) -> None:
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if source is not None and isinstance(out, torch.Tensor) and source in self._bounds:
            self._bounds[out] = self._bounds[source]

    def _bounded_at_a_singular_point(self, name: str, args) -> dict | None:
        """The clamp that made this op's operand, when one of its bounds is a point where the
        op (or its derivative) is infinite and the operand holds values on that bound."""
        spec = _SINGULAR_POINTS.get(name)
        if spec is None or not self._bounds:
            return None
        position, points = spec
        operand = args[position] if len(args) > position else None
        if not isinstance(operand, torch.Tensor) or operand not in self._bounds:
            return None
        if name == "pow" and not (
            isinstance(args[1], (int, float)) and args[1] < 1 and args[1] != 0
        ):
            return None  # x ** 2 is fine at 0; x ** 0.5 and x ** -1 are not
        low, high, where = self._bounds[operand]
        singular = [{"side": side, "bound": float(bound)}
                    for side, bound in (("min", low), ("max", high))
                    if bound is not None and float(bound) in points]  # fmt: skip
        if not singular or where is None:
            return None
        detached = operand.detach()
        on_bound = sum(int((detached == b["bound"]).sum()) for b in singular)
        if not on_bound:
            return None
        bounded = {"op": name, "bounds": singular, "on_bound": on_bound,
                   "of": operand.numel(), "location": where.as_dict()}  # fmt: skip
        for sequence_nr in self._op_sequence_nrs:
            self._bounded_at[sequence_nr] = bounded
        return bounded

    def _bad_before_write(self, written: list, phase: str) -> set[int]:
        if not written:
            return set()
        if phase == "optimizer":
            # The optimizer writes parameters, gradients and state, checked around every step,
            # so its many in-place ops skip the reduction; a temporary it writes in place
            # (`exp_avg_sq.rsqrt().add_(eps)`) was non-finite before only if already tracked.
            return {id(t) for t in iter_tensors(written) if t in self._taint}
        return {id(t) for t in iter_tensors(written) if is_checked(t) and not is_finite(t)}

    # ---- classification ---------------------------------------------------------------------
    def _check(self, func, name, args, kwargs, out, written, bad_before, node) -> None:
        outputs = {id(t): t for t in iter_tensors((out, written)) if is_checked(t)}
        bad_outputs = [t for t in outputs.values() if not is_finite(t)]
        if not bad_outputs:
            for t in outputs.values():
                self._taint.pop(t, None)  # an in-place fix (nan_to_num_, clamp_) clears taint
            return
        written_ids = {id(t) for t in iter_tensors(written)}
        bad_inputs = [
            t
            for t in iter_tensors((args, kwargs))
            if is_checked(t) and (id(t) in bad_before if id(t) in written_ids else not is_finite(t))
        ]
        sources = self._sources_of(bad_inputs, func)
        inputs_have_nan = any(bool(torch.isnan(t.detach()).any()) for t in bad_inputs)
        for t in bad_outputs:
            out_has_nan = bool(torch.isnan(t.detach()).any())
            if not bad_inputs:
                constant = name in _MASK_OPS and _nonfinite_scalar_argument(args)
                birth = self._new_birth(func, name, args, kwargs, t, node, constant=constant)
            elif out_has_nan and not inputs_have_nan:
                birth = self._new_birth(func, name, args, kwargs, t, node, parents=sources)
            else:
                self._taint[t] = sources
                if node is not None:
                    # a gradient copied into a slice of zeros (an FFT's backward) reaches the
                    # next op as the whole tensor, not as the slice written
                    self._mark_view_base(t, sources)
                continue
            self._taint[t] = frozenset({birth.id})
            self._mark_view_base(t, frozenset({birth.id}))

    def _pass_taint(self, args, out) -> None:
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if source is None or not isinstance(out, torch.Tensor):
            return
        taint = self._taint.get(source)
        if taint is not None:
            self._taint[out] = taint
        elif is_checked(source) and not is_finite(source):
            self._sources_of([source], None)  # untracked non-finite data: now it is tracked
            self._taint[out] = self._taint[source]

    def _mark_view_base(self, t: torch.Tensor, taint: frozenset[int]) -> None:
        base = t._base
        if base is not None and base not in self._taint:
            self._taint[base] = taint

    def _sources_of(self, bad_inputs: list, func) -> frozenset[int]:
        """Births behind non-finite inputs; an untracked one entered torch already non-finite."""
        sources: set[int] = set()
        for t in bad_inputs:
            known = self._taint.get(t)
            if known is None:
                birth = self._entered_birth(t, func)
                known = self._taint[t] = frozenset({birth.id})
            sources |= known
        return frozenset(sources)

    def tensor_entered(self, source: str, result) -> None:
        """A tensor made outside torch's ops (numpy, a Python list, a file): if it already holds
        NaN/Inf, that is a birth at the user's line that created it. The caller keeps these
        checks out of the detector's sight (`session.quiet()`)."""
        if os.getpid() != self._pid:
            return
        for t in iter_tensors(result):
            if is_checked(t) and t not in self._taint and not is_finite(t):
                birth = self._entered_birth(t, None, source=source)
                self._taint[t] = frozenset({birth.id})

    def adopt_entered(self, t: torch.Tensor, source: str, location, step: int) -> None:
        """A tensor that entered torch non-finite before this detector existed (a run resumed
        from a rewind point): the birth the detector would have recorded then."""
        if t not in self._taint:
            birth = self._entered_birth(t, None, source=source, location=location, step=step)
            self._taint[t] = frozenset({birth.id})

    def _entered_birth(
        self,
        t: torch.Tensor,
        func,
        source: str | None = None,
        location=None,
        step: int | None = None,
    ) -> Birth:
        counts = count_nonfinite(t)
        if source is None and _received_from_another_rank(self.context.phase):
            return self._received_birth(t, counts)
        # A one-element -inf tensor is a mask constant (`torch.tensor(float("-inf"))`), not data.
        constant = t.numel() == 1 and counts.nan == 0
        # A parameter no watched op made non-finite: written before training, not data.
        parameter = source is None and isinstance(t, torch.nn.Parameter)
        facts = self._parameter_named(t) if parameter else {}
        if "frozen_table" in facts:
            explanation = (
                f"a frozen lookup table ({facts['frozen_table']}, requires_grad=False) already "
                f"non-finite when it reached {_reader(func)} ({counts.describe()}): its rows are "
                "values it was given (`from_pretrained`), never trained"
            )
        elif parameter:
            explanation = (
                f"a parameter already non-finite when it reached {_reader(func)} "
                f"({counts.describe()}): no watched op made it (a checkpoint, `torch.empty` "
                "never filled, a write under no_grad)"
            )
        elif source is not None:
            explanation = f"{source} produced a tensor that already holds {counts.describe()}"
        else:
            explanation = (
                f"input already non-finite when it reached {_reader(func)} "
                f"({counts.describe()}): it was created outside torch's ops (numpy, a file, "
                f"a Python list, a DataLoader batch)"
            )
        birth = self._store(
            op="parameter" if parameter else source or (str(func) if func is not None else "input"),
            module=self.context.module,
            location=location or find_user_frame(),
            phase="data" if not (constant or parameter) else self.context.phase,
            explanation=explanation,
            nonfinite=counts.describe(),
            has_nan=counts.nan > 0,
            kind=NONFINITE_PARAMETER if parameter else NONFINITE_INPUT,
            facts=facts,
            constant=constant and not parameter,
            inputs_nonfinite=True,
            **({} if step is None else {"step": step}),
        )
        return birth

    def _parameter_named(self, t: torch.Tensor) -> dict:
        """{"parameter": its name in the model}: the init check knows where that name was set.
        A frozen lookup table (an embedding built from the data's values with
        `from_pretrained`, never trained) says so: {"frozen_table": "Embedding"}."""
        modules = getattr(self.context, "modules", None)
        name = modules.parameter_name(t) if modules is not None else None
        facts = {"parameter": name} if name else {}
        frozen = modules is not None and not t.requires_grad and t.dim() == 2
        if frozen and (table := modules.lookup_table_of(t)):
            facts["frozen_table"] = table
        return facts

    def _received_birth(self, t: torch.Tensor, counts) -> Birth:
        """NaN/Inf that appeared in a tensor during backward or the optimizer step of a
        multi-process run without any op of this process making it: a collective wrote it
        (DDP's gradient all-reduce runs inside the communication library, unseen by torch's
        dispatcher), so another rank produced it."""
        return self._store(
            op="collective",
            module=self.context.module,
            location=find_user_frame(),
            phase=self.context.phase,
            explanation=(
                f"received from another rank ({counts.describe()}): a collective such as "
                "DDP's gradient all-reduce wrote it, no op of this process made it"
            ),
            nonfinite=counts.describe(),
            has_nan=counts.nan > 0,
            kind=RECEIVED,
            received=True,
        )

    def _new_birth(self, func, name, args, kwargs, out, node, constant=False, parents=None):
        counts = count_nonfinite(out)
        location, module, backward_node, backward_call = (
            find_user_frame(),
            self.context.module,
            None,
            None,
        )
        op = str(func)
        if parents is not None:
            why = explain_nan_from_inf(name, args, out)
        else:
            why = explain_birth(name, args, kwargs, out)
        explanation, forward_op = why.text, None
        notes = []
        bounded_at = self._bounded_now
        if node is not None:
            backward_node = node.name()
            bounded_at = self._bounded_at.get(node._sequence_nr())
            site = self._sites.get(node._sequence_nr())
            backward_call = self.context.backward_call
            if site is not None:
                forward_name = site.op.split(".")[1] if "." in site.op else site.op
                forward_op = forward_name.rstrip("_") or forward_name
                hint = BACKWARD_HINTS.get(forward_op)
                prefix = f"in the backward of {site.op} ({backward_node})"
                explanation = f"{prefix}: {hint + '; ' if hint else ''}{explanation}"
                if node._sequence_nr() in self._forward_births:
                    notes.append("masked_forward")
                # A custom autograd.Function's backward is user code: its own line is the birth.
                if location is None or location == backward_call:
                    location = site.location
                module = site.module
            else:
                explanation = f"in backward ({backward_node}): {explanation}"
        else:
            self._forward_births.update(self._op_sequence_nrs)
        parent = min(parents) if parents else None
        phase = "backward" if node else self.context.phase
        if phase == "data" and _computed_from_parameters(args, kwargs):
            phase = "forward"  # a model written with bare tensors (x @ W + b): no module call
        facts = dict(why.facts)
        if node is None and _reads_only_parameters(args, kwargs):
            facts["parameters_only"] = 1
        return self._store(
            op=op, module=module, location=location, phase=phase,
            explanation=explanation, nonfinite=counts.describe(), has_nan=counts.nan > 0,
            kind=why.kind, dtype=why.dtype, forward_op=forward_op, facts=facts,
            constant=constant, parent=parent, backward_node=backward_node,
            backward_call=backward_call, notes=notes, bounded_at=bounded_at,
        )  # fmt: skip

    def _store(self, **fields) -> Birth:
        fields.setdefault("step", self.context.step)
        birth = Birth(id=next(self._ids), **fields)
        self.births[birth.id] = birth
        if len(self.births) > _MAX_BIRTHS:
            self.births.popitem(last=False)
        return birth

    # ---- queries from the session -----------------------------------------------------------
    def taint_of(self, t: torch.Tensor) -> frozenset[int]:
        return self._taint.get(t, frozenset())

    def constant_parent(self, birth: Birth) -> Birth | None:
        """The deliberate constant (a mask's -inf) `birth` was made from, when `root_birth`
        stopped there: a softmax over a row the mask filled entirely."""
        parent = self.births.get(birth.parent) if birth.parent is not None else None
        return parent if parent is not None and parent.constant else None

    def root_birth(self, birth_ids) -> Birth | None:
        """The birth to blame for a taint set: the earliest, followed back through NaN-from-Inf
        births to the Inf that caused them, unless that Inf was a deliberate constant (mask)."""
        known = [self.births[i] for i in sorted(birth_ids) if i in self.births]
        if not known:
            return None
        birth = known[0]
        while birth.parent is not None and birth.parent in self.births:
            parent = self.births[birth.parent]
            if parent.constant:
                break
            birth = parent
        return birth
