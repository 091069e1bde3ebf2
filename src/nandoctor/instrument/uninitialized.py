"""Memory the script's own lines leave uninitialized reads as NaN, from the first run on.

`torch.empty(n)` hands back whatever the allocator holds: zero pages in a small plain run,
the values of a freed tensor in a process that has computed for a while (as every run under
nandoctor has, before the script's first line). A parameter created with `torch.empty` and
never filled is then NaN in one run (`p / p.norm()` of zeros) and finite garbage in the next,
and a run called healthy may be sick on the user's machine. So, until the script's first
forward pass, backward pass or optimizer step, floating tensors that the script's own lines
create with `torch.empty`, `empty_like`, `empty_strided` or `new_empty` are filled with NaN,
as torch itself does in deterministic mode (`torch.utils.deterministic.
fill_uninitialized_memory`), and the line that created each is kept until something writes
it. Only a script that reads memory it never wrote computes anything different; libraries'
own calls (`nn.Linear` allocates with `torch.empty`, then initializes) are left as they are.
The legacy constructors (`torch.Tensor(n, m)`, `torch.FloatTensor(n)`) do not pass through a
function mode and stay as the allocator left them.
"""

from __future__ import annotations

import math
import os
import sys

import torch
from torch.overrides import TorchFunctionMode

from nandoctor.instrument.frames import SourceLine, called_from_user_code, find_user_frame
from nandoctor.instrument.writes import leave_function_mode_stack, storage_key, written_tensor

_FACTORIES = {torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty}
_MAX_KEPT = 100_000  # creation lines kept; the oldest go first


class UninitializedMemory(TorchFunctionMode):
    """Fills what the script allocates uninitialized with NaN from `start()` until `stop()`;
    `created_at(tensor)` answers afterwards for storages nothing wrote since."""

    def __init__(self) -> None:
        super().__init__()
        self._created: dict = {}  # storage key -> the user line that allocated it
        self._pid = os.getpid()
        self.active = False

    def start(self) -> None:
        self.__enter__()
        self.active = True
        # Forked DataLoader workers inherit the mode stack; their batches are not the script's
        # allocations to fill.
        os.register_at_fork(after_in_child=self.stop)

    def stop(self) -> None:
        """Fill nothing more (the script is past its set-up); called again, does nothing."""
        if self.active:
            self.active = False
            leave_function_mode_stack(self)

    def created_at(self, t: torch.Tensor) -> SourceLine | None:
        """The user line that allocated `t`'s storage uninitialized, while nothing wrote it."""
        key = storage_key(t)
        return self._created.get(key) if key is not None else None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.active or os.getpid() != self._pid:
            return func(*args, **kwargs)
        written = written_tensor(func, args, kwargs)
        if written is not None and self._created:
            self._created.pop(storage_key(written), None)
        result = func(*args, **kwargs)
        if func in _FACTORIES and _fillable(result) and called_from_user_code(sys._getframe(1)):
            self._fill(result)
        return result

    def _fill(self, t: torch.Tensor) -> None:
        with torch.no_grad():
            t.fill_(math.nan)  # inside this mode's handler: the mode does not see its own fill
        key = storage_key(t)
        if key is None:
            return
        if len(self._created) >= _MAX_KEPT:
            self._created.pop(next(iter(self._created)))
        self._created[key] = find_user_frame(sys._getframe(2))


def _fillable(t) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and (t.is_floating_point() or t.is_complex())
        and not t.is_meta
        and t.numel() > 0
    )
