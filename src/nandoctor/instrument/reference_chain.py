"""The reference chain of a shadowed step: float64 values that follow the script's tensors.

Each op's chain result is computed from the chain values of its inputs, so the chain is the
step as float64 would have computed it from the step's start. A chain value belongs to one
version of its tensor: once the script writes the tensor some other way, the value is stale
and the chain restarts there from the tensor itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map
from torch.utils.weak import WeakIdKeyDictionary

from nandoctor.instrument.op_plans import (
    RESHAPES,
    SHAPE_VIEWS,
    OpPlan,
    is_floating,
    pair_up,
    tensors_in,
)


class ReferenceChain:
    """Chain values of the script's tensors, for one optimizer step at a time."""

    def __init__(self) -> None:
        self._values = WeakIdKeyDictionary()  # target tensor -> (its version, chain value)

    def reset(self) -> None:
        """A new step starts from the script's own values (parameters included)."""
        self._values = WeakIdKeyDictionary()

    def value(self, t: torch.Tensor) -> torch.Tensor | None:
        entry = self._values.get(t)
        if entry is not None and entry[0] == t._version:  # a write since makes it stale
            return entry[1]
        return None

    def inputs(self, args, kwargs, to_reference: Callable):
        """An op's chain inputs, taken before it runs (it may write them); None when no input
        has a chain value: then the chain's result is the same-input reference's."""
        found = False

        def convert(value):
            nonlocal found
            if is_floating(value) and (chained := self.value(value)) is not None:
                found = True
                return chained.clone()
            return to_reference(value)

        converted = tree_map(convert, (args, kwargs))
        return converted if found else None

    def store(self, targets: list, references: list, written=()) -> None:
        # An op bumps the version counters of the tensors it wrote only after it returns
        # (autograd's ADInplaceOrView runs above a dispatch mode): those are stored one ahead.
        written_ids = {id(t) for t in written}
        for t, r in pair_up(targets, references):
            self._values[t] = (t._version + (id(t) in written_ids), r)

    def carry(self, plan: OpPlan, func, args, kwargs, out, to_reference: Callable) -> None:
        """A view or an exact copy, not compared, carries its input's chain value along."""
        if not args:
            return
        source = args[1] if plan.name == "copy" else args[0]
        if not is_floating(source) or (chained := self.value(source)) is None:
            return
        if plan.name in SHAPE_VIEWS:
            try:
                with torch.no_grad():
                    if plan.name in RESHAPES:  # a copy's strides may not allow a view
                        result = chained.reshape(args[1])
                    else:
                        rest, options = tree_map(to_reference, (args[1:], kwargs))
                        result = func(chained, *rest, **options)
            except Exception:  # a view the chain value cannot take: the chain restarts after it
                return
            self.store(tensors_in(out), tensors_in(result))
        elif plan.name in ("_to_copy", "clone"):
            self.store([out], [chained])
        elif plan.name == "copy":
            self.store([args[0]], [chained], written=[args[0]])
