"""Memory the script's own lines leave uninitialized reads as NaN, from the first run on.

`torch.empty(n)` hands back whatever the allocator holds: zero pages in a small plain run,
the values of a freed tensor in a process that has computed for a while (as every run under
nandoctor has, before the script's first line). A parameter created with `torch.empty` and
never filled is then NaN in one run (`p / p.norm()` of zeros) and finite garbage in the next,
and a run called healthy may be sick on the user's machine. So, until the script's first
forward pass, backward pass or optimizer step, floating tensors that the script's own lines
create with `torch.empty`, `empty_like`, `empty_strided` or `new_empty` are filled with NaN,
as torch itself does in deterministic mode (`torch.utils.deterministic.
fill_uninitialized_memory`), and the line that created each is kept. Only a script that reads memory it never wrote computes anything different; libraries'
own calls (`nn.Linear` allocates with `torch.empty`, then initializes) are left as they are.
The factories are wrapped where the script finds them (`torch.empty`, `Tensor.new_empty`), not
seen through a function mode: a mode on the stack changes how Python scalars reach ops, and the
float64 shadow would compare other ops than a plain run makes. The legacy constructors
(`torch.Tensor(n, m)`, `torch.FloatTensor(n)`) are not wrapped and stay as the allocator left
them.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable

import torch

from nandoctor.instrument.frames import SourceLine, find_user_frame, user_file
from nandoctor.instrument.writes import storage_key

_FACTORIES = ((torch, "empty"), (torch, "empty_like"), (torch, "empty_strided"),
              (torch.Tensor, "new_empty"))  # fmt: skip
_MAX_KEPT = 100_000  # allocation lines kept; the oldest go first


class UninitializedMemory:
    """Fills what the script allocates uninitialized with NaN from `start()` until `stop()`;
    `created_at(tensor)` answers afterwards."""

    def __init__(self) -> None:
        self._created: dict = {}  # storage key -> the user line that allocated it
        self._pid = os.getpid()
        self._undo: list[Callable[[], None]] = []
        self.active = False

    def start(self) -> None:
        for owner, name in _FACTORIES:
            original = getattr(owner, name)
            setattr(owner, name, self._wrapped(original))
            self._undo.append(functools.partial(setattr, owner, name, original))
        self.active = True

    def stop(self) -> None:
        """Fill nothing more (the script is past its set-up); called again, does nothing."""
        self.active = False
        while self._undo:
            self._undo.pop()()

    def created_at(self, t: torch.Tensor) -> SourceLine | None:
        """The user line that allocated `t`'s storage uninitialized."""
        key = storage_key(t)
        return self._created.get(key) if key is not None else None

    def _wrapped(self, original: Callable) -> Callable:
        @functools.wraps(original)
        def allocate(*args, **kwargs):
            result = original(*args, **kwargs)
            # Forked DataLoader workers inherit the wrapper; their batches are not set-up.
            if self.active and os.getpid() == self._pid and _fillable(result):
                caller = sys._getframe(1)
                # The script's own line, not torch's code it called (`nn.Linear` allocates,
                # then initializes): the direct caller.
                if user_file(caller.f_code):
                    self._fill(result, caller)
            return result

        return allocate

    def _fill(self, t: torch.Tensor, caller) -> None:
        with torch.no_grad():
            t.fill_(math.nan)
        key = storage_key(t)
        if key is None:
            return
        if len(self._created) >= _MAX_KEPT:
            self._created.pop(next(iter(self._created)))
        self._created[key] = find_user_frame(caller)


def _fillable(t) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and (t.is_floating_point() or t.is_complex())
        and not t.is_meta
        and t.numel() > 0
    )
