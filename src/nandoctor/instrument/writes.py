"""Where each parameter's values were last set before the first forward: the user's line of the
last `nn.init.*` call, `reset_parameters`, in-place op, `.data` assignment or `nn.Parameter`
registration that wrote its storage.

A TorchFunctionMode sees `nn.init.uniform_(p)`, `p.data.normal_()`, `p.mul_()`, `p[0] = ...`,
`p.copy_()` (also inside `load_state_dict`) and `p.data = w`. Writes go through aliases
(`p.data` is another tensor on the same storage), so they are keyed by storage address.
Function modes live on their own stack, apart from the detector's dispatch mode, so this one
can be taken off at the first forward (or optimizer step) wherever it sits: afterwards it costs
nothing.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.nn.modules import module as module_globals
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.overrides import (
    TorchFunctionMode,
    _get_current_function_mode_stack,
    _pop_mode,
    _push_mode,
)

from nandoctor.instrument.frames import TORCH_DIR, SourceLine, find_user_frame

_MAX_STORAGES = 200_000
# In-place methods that change flags or placement, not values.
_NOT_WRITES = {"requires_grad_", "share_memory_", "detach_", "retain_grad", "record_stream"}
_MODULE_FILE = os.path.abspath(module_globals.__file__)


def storage_key(t: torch.Tensor):
    """The storage address; a meta tensor (no storage yet, as `init_empty_weights` and
    `torch.device("meta")` make them) by its own identity until `to_empty` gives it one."""
    try:
        address = t.untyped_storage().data_ptr()
    except Exception:  # tensor subclasses without a storage
        address = 0
    if address:
        return address
    return ("meta", id(t)) if getattr(t, "is_meta", False) else None


def _first_tensor(args, kwargs) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def _written_tensor(func, args, kwargs) -> torch.Tensor | None:
    name = getattr(func, "__name__", "")
    if name == "__set__":  # a property setter: only `.data = ...` replaces values
        descriptor = getattr(func, "__self__", None)
        if getattr(descriptor, "__name__", "") == "data" and args:
            return args[0]
        return None
    if name == "__setitem__" or (
        name.endswith("_") and not name.startswith("__") and name not in _NOT_WRITES
    ):
        return _first_tensor(args, kwargs)
    out = kwargs.get("out")
    return out if isinstance(out, torch.Tensor) else None


def _moved_by_module_apply() -> bool:
    """`.to()`, `.cuda()`, `.half()` reassign `.data` from `Module._apply`: the values move,
    the line that set them stays the same."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return False
        if frame.f_code.co_name == "_apply" and frame.f_code.co_filename == _MODULE_FILE:
            return True
        frame = frame.f_back
    return False


def _registered_by_torch() -> bool:
    """The parameter being registered is registered by torch's own code (a `torch.nn.utils`
    wrapper re-registering a module's existing weight), not by the user's `nn.Parameter(...)`.
    The frames above the registration hook: this module's, then `Module`'s own, then the
    caller that asked for it."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename == _MODULE_FILE:
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(TORCH_DIR)


class ParameterWrites(TorchFunctionMode):
    """Records writes from `start()` until `stop()`; `line_of(tensor)` answers afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self._lines: dict[int, SourceLine | None] = {}
        self._pid = os.getpid()
        self._handles: list = []
        self.active = False

    def start(self) -> None:
        self._handles = [
            module_globals.register_module_parameter_registration_hook(self._registered),
            # A script that steps an optimizer before any module forward (bare tensors) is
            # past its init as well.
            register_optimizer_step_pre_hook(lambda *args: self._switch_off()),
        ]
        self.__enter__()
        self.active = True
        # Forked DataLoader workers inherit the mode stack; they need no record.
        os.register_at_fork(after_in_child=self._leave_stack)

    def stop(self) -> None:
        """Stop recording and remove the hooks (not from inside an optimizer hook: torch is
        iterating over those)."""
        self._switch_off()
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _switch_off(self) -> None:
        if self.active:
            self.active = False
            self._leave_stack()

    def line_of(self, t: torch.Tensor) -> SourceLine | None:
        key = storage_key(t)
        return self._lines.get(key) if key is not None else None

    def _leave_stack(self) -> None:
        """Take this mode off the function-mode stack, keeping any mode pushed above it."""
        stack = _get_current_function_mode_stack()
        if self not in stack:
            return
        above = []
        while (top := _pop_mode()) is not self:
            above.append(top)
        for mode in reversed(above):
            _push_mode(mode)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self.active or os.getpid() != self._pid:
            return func(*args, **kwargs)
        target = _written_tensor(func, args, kwargs)
        moved_from = None
        setter = target is not None and getattr(func, "__name__", "") == "__set__"
        if setter and _moved_by_module_apply():
            moved_from = storage_key(target)
        result = func(*args, **kwargs)
        if target is not None:
            line = self._lines.get(moved_from) if moved_from is not None else find_user_frame()
            self._remember(target, line)
        elif isinstance(result, torch.Tensor):
            self._follow_a_move(args, result)
        return result

    def _follow_a_move(self, args, result: torch.Tensor) -> None:
        """`to_empty()` and a move between devices whose tensors cannot share a type (meta to
        CPU) make a new parameter from `empty_like(p)` / `p.to(...)` in `Module._apply`: it
        was set where `p` was."""
        source = args[0] if args and isinstance(args[0], torch.Tensor) else None
        key = storage_key(source) if source is not None else None
        if key in self._lines and storage_key(result) != key and _moved_by_module_apply():
            self._remember(result, self._lines[key])

    def _registered(self, module, name, param) -> None:
        if param is None or not self.active or os.getpid() != self._pid:
            return
        if storage_key(param) in self._lines and _registered_by_torch():
            return  # `weight_norm` re-registers the weight's values as `weight_v`: none moved
        self._remember(param, find_user_frame())

    def _remember(self, t: torch.Tensor, line: SourceLine | None) -> None:
        key = storage_key(t)
        if key is None:
            return
        if len(self._lines) >= _MAX_STORAGES:
            self._lines.pop(next(iter(self._lines)))
        self._lines.pop(key, None)  # re-insert: the dict stays ordered by last write
        self._lines[key] = line
