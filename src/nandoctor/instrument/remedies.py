"""Remedies applied to a re-run of the script, to verify a proposed fix by treatment.

Each remedy is described by a plain dict (it travels in the child's options):
- {"kind": "guard_op", "op": "log", "file": F, "line": L}: keep the input of that op, at that
  user line, inside its domain (clamp), above autograd, so gradients see the guard too;
- {"kind": "clip_gradients", "max_norm": C}: clip gradients before every optimizer step;
- {"kind": "sanitize_inputs"}: replace NaN/Inf in batches and in tensors made from outside data;
- {"kind": "standardize_inputs", "tensors": {path: [mean, std]}}: each of those batch tensors
  (`batch[0]`, or `input[0]` of a model called on tensors without a DataLoader) becomes
  (x - mean) / std as it is consumed;
- {"kind": "reinitialize", "modules": [...]}: default re-initialization of those modules;
- {"kind": "float32"}: keep the model in float32 (no .half()/.bfloat16(), autocast disabled);
- {"kind": "float32_at", "file": F, "line": L}: compute that user line in float32: its
  float16/bfloat16 inputs upcast, its casts to them kept float32, autocast off there, and
  what it made from half inputs cast back where another line combines it with half tensors;
- {"kind": "finite_fill", "file": F, "line": L}: the infinite constants that line's fills
  (masked_fill, where, full...) write become their dtype's most extreme finite values;
- {"kind": "move_bound", "file": F, "line": L, "bounds": [{"side", "bound", "to"}]}: the
  clamps at that user line whose min or max is `bound` clamp at `to` instead (a bound just
  inside the next op's domain);
- {"kind": "population_statistics", "file": F, "line": L}: the std/var calls at that user
  line computed without the n - 1 correction (`correction=0`), finite for a single value;
- {"kind": "optimizer_eps", "eps": E}: optimizers built with eps <= 0 get eps = E;
- {"kind": "optimizer_settings", "index": I, "settings": {...}}: the I-th optimizer the script
  builds gets these settings in every param group.
"""

from __future__ import annotations

import math
import os

import torch
from torch.overrides import TorchFunctionMode
from torch.utils.weak import WeakIdKeyDictionary

from nandoctor.fixes import CALLS, CLAMPS, FILLS, GUARDS, SAMPLE_STATISTICS, guard_for
from nandoctor.instrument.batches import iter_leaves
from nandoctor.instrument.frames import find_user_frame
from nandoctor.instrument.tensors import iter_tensors, params_of

_EPS = 1e-12


def _compiled_guards() -> dict:
    """Each guard of fixes.GUARDS as a function, from the very source the report shows."""
    return {
        name: eval(f"lambda x: {source.format(x='x')}", {"torch": torch})  # noqa: S307
        for name, source in GUARDS.items()
    }


_GUARD_FUNCTIONS = _compiled_guards()


def _at_user_line(file: str, line: int) -> bool:
    """The op being called was called from the user's `file`:`line`."""
    frame = find_user_frame()
    return frame is not None and frame.line == line and frame.file == file


class OpGuard(TorchFunctionMode):
    """Guards one op at one user line; everything else runs untouched."""

    def __init__(self, op: str, file: str, line: int, guard: str | None = None) -> None:
        super().__init__()
        self.names, self.position = CALLS[op]
        self.guard = _GUARD_FUNCTIONS[guard or guard_for(op)]
        self.file, self.line = os.path.abspath(file), line
        self.applied = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in self.names and self._at_the_line():
            args = self._guarded(args)
        return func(*args, **kwargs)

    def _at_the_line(self) -> bool:
        return _at_user_line(self.file, self.line)

    def _guarded(self, args: tuple) -> tuple:
        args = list(args)
        if len(args) > self.position:
            value = args[self.position]
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                args[self.position] = self.guard(value)
                self.applied += 1
            elif isinstance(value, (int, float)) and self.position == 1 and value == 0:
                args[self.position] = _EPS
                self.applied += 1
        return tuple(args)


_HALF = (torch.float16, torch.bfloat16)


class Float32AtTheLine(TorchFunctionMode):
    """Computes one user line in float32; everything else runs untouched. What the line made
    from half inputs stays float32 downstream, as after a user's `f(x.float())`, except where
    another line combines it with half tensors (a half layer's weights): there it goes back to
    their dtype, as the user's `.to(x.dtype)` would, instead of failing on mixed dtypes."""

    def __init__(self, file: str, line: int) -> None:
        super().__init__()
        self.file, self.line = os.path.abspath(file), line
        self.made_from_half = WeakIdKeyDictionary()  # float32 result -> the half dtype it had

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _at_user_line(self.file, self.line):
            if self.made_from_half and self._half_dtype((args, kwargs), made=False) is not None:
                args, kwargs = self._back_to_half((args, kwargs))
            return func(*args, **kwargs)
        half = None
        if not getattr(func, "__name__", "").endswith("_"):  # an in-place op keeps its tensor
            half = self._half_dtype((args, kwargs))
            args, kwargs = _in_float32(args), _in_float32(kwargs)
        with _autocast_off(args, kwargs):
            result = func(*args, **kwargs)
        if half is not None:
            for tensor in iter_tensors(result):
                if tensor.dtype == torch.float32:
                    self.made_from_half[tensor] = half
        return result

    def _half_dtype(self, value, made: bool = True) -> torch.dtype | None:
        """The half dtype of the first half tensor in `value` (an op's arguments), or with
        `made`, of the first the line made from half inputs; None when there is none."""
        tensors = list(iter_tensors(value))
        half = next((t.dtype for t in tensors if t.dtype in _HALF), None)
        if half is None and made:
            half = next((self.made_from_half[t] for t in tensors if t in self.made_from_half),
                        None)  # fmt: skip
        return half

    def _back_to_half(self, value):
        def back(leaf):
            half = self.made_from_half.get(leaf) if isinstance(leaf, torch.Tensor) else None
            return leaf.to(half) if half is not None else leaf

        return _map_leaves(value, back)


class FiniteFillAtTheLine(TorchFunctionMode):
    """At one user line, a fill's infinite constant (a mask's -inf) is written as the dtype's
    most extreme finite value, `torch.finfo(dtype).min`, as the fix shown rewrites it."""

    def __init__(self, file: str, line: int) -> None:
        super().__init__()
        self.file, self.line = os.path.abspath(file), line
        self.applied = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in FILLS and self._at_the_line():
            dtype = _dtype_filled(args, kwargs)
            args = tuple(self._finite(a, dtype) for a in args)
            kwargs = {k: self._finite(v, dtype) for k, v in kwargs.items()}
        return func(*args, **kwargs)

    def _at_the_line(self) -> bool:
        return _at_user_line(self.file, self.line)

    def _finite(self, value, dtype: torch.dtype):
        if isinstance(value, float) and math.isinf(value):
            self.applied += 1
            return torch.finfo(dtype).min if value < 0 else torch.finfo(dtype).max
        return value


class BoundAtTheLine(TorchFunctionMode):
    """At one user line, a clamp's bound that the next op cannot take (acos at 1, sqrt at 0)
    becomes the bound just inside its domain, as the fix shown rewrites it."""

    def __init__(self, file: str, line: int, bounds: list[dict]) -> None:
        super().__init__()
        self.file, self.line = os.path.abspath(file), line
        # the same source the fix shows, evaluated: "1 - 1e-7"
        self.moved = {(b["side"], float(b["bound"])): float(eval(b["to"], {}))  # noqa: S307
                      for b in bounds}  # fmt: skip
        self.applied = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", None)
        if name in CLAMPS and _at_user_line(self.file, self.line):
            args, kwargs = self._moved(name.rstrip("_"), list(args), kwargs)
        return func(*args, **kwargs)

    def _moved(self, name: str, args: list, kwargs: dict) -> tuple[tuple, dict]:
        if name in ("clamp_min", "clamp_max"):
            positions = {name.removeprefix("clamp_"): 1}
        else:
            positions = {"min": 1, "max": 2}
        for side, position in positions.items():
            if side in kwargs:
                kwargs[side] = self._inside(side, kwargs[side])
            elif len(args) > position:
                args[position] = self._inside(side, args[position])
        return tuple(args), kwargs

    def _inside(self, side: str, bound):
        if isinstance(bound, (int, float)) and (side, float(bound)) in self.moved:
            self.applied += 1
            return self.moved[(side, float(bound))]
        return bound


class PopulationStatisticsAtTheLine(TorchFunctionMode):
    """At one user line, std and var are computed without the n - 1 correction, as the fix
    shown rewrites them (`x.std(correction=0)`): a single value's spread is 0, not 0/0."""

    def __init__(self, file: str, line: int) -> None:
        super().__init__()
        self.file, self.line = os.path.abspath(file), line
        self.applied = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if getattr(func, "__name__", None) in SAMPLE_STATISTICS and _at_user_line(
            self.file, self.line
        ):
            kwargs.pop("unbiased", None)
            kwargs["correction"] = 0
            self.applied += 1
        return func(*args, **kwargs)


def _dtype_filled(args, kwargs) -> torch.dtype:
    """The floating dtype the fill writes in: its `dtype=`, else its first floating tensor's."""
    dtype = kwargs.get("dtype")
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    tensors = [t for t in iter_tensors((args, kwargs)) if t.is_floating_point()]
    return tensors[0].dtype if tensors else torch.get_default_dtype()


def _in_float32(value):
    """`value` with its half tensors upcast and its half dtypes (a `.to(x.dtype)`) float32."""

    def upcast(leaf):
        if isinstance(leaf, torch.Tensor):
            return leaf.float() if leaf.dtype in _HALF else leaf
        if isinstance(leaf, torch.dtype):
            return torch.float32 if leaf in _HALF else leaf
        return leaf

    return _map_leaves(value, upcast)


def _map_leaves(value, change):
    """`value` (an op's arguments: nested tuples, lists and dicts) with `change` applied to
    each leaf."""
    if isinstance(value, (list, tuple)):
        return type(value)(_map_leaves(v, change) for v in value)
    if isinstance(value, dict):
        return {k: _map_leaves(v, change) for k, v in value.items()}
    return change(value)


def _autocast_off(args, kwargs):
    devices = {t.device.type for t in iter_tensors((args, kwargs))}
    device = next(iter(devices - {"cpu"}), "cpu")
    return torch.autocast(device_type=device, enabled=False)


def _optimizer_eps(remedy: dict, session) -> None:
    """Every optimizer built with eps <= `below` gets eps = `eps`."""
    eps, below = float(remedy["eps"]), float(remedy.get("below", 0.0))

    def fix(optimizer) -> None:
        for group in optimizer.param_groups:
            if isinstance(group.get("eps"), float) and group["eps"] <= below:
                group["eps"] = eps

    session.hooks.optimizers_created(fix)


def _optimizer_settings(remedy: dict, session) -> None:
    """The `index`-th optimizer built (in construction order) gets `settings` in each group."""
    settings, index = remedy["settings"], remedy.get("index")
    built = [0]

    def fix(optimizer) -> None:
        position, built[0] = built[0], built[0] + 1
        if index is not None and position != index:
            return
        for group in optimizer.param_groups:
            for name, value in settings.items():
                if name in group:
                    group[name] = tuple(value) if isinstance(value, list) else value

    session.hooks.optimizers_created(fix)


def _clip_gradients(remedy: dict, session) -> None:
    max_norm = float(remedy["max_norm"])

    def clip(params) -> None:
        session.clip_gradients(params, max_norm)

    def after_backward(tensors) -> None:
        # A script that updates its parameters by hand does so right after backward(); a
        # closure's backward inside optimizer.step(closure) comes after the step's pre-hook
        if session.updates_by_hand:
            clip(session.all_params())
        elif (optimizer := session.stepping_optimizer) is not None:
            clip(params_of(optimizer))

    session.hooks.optimizer_steps(
        lambda optimizer: clip(params_of(optimizer)), lambda optimizer: None
    )
    session.hooks.backward_calls(lambda tensors: None, after_backward)


def _sanitized(batch):
    with torch.no_grad():
        for t in iter_tensors(batch):
            if t.is_floating_point():
                torch.nan_to_num_(t, nan=0.0, posinf=0.0, neginf=0.0)
    return batch


def _sanitize_inputs(remedy: dict, session) -> None:
    session.on_batch.append(lambda batch, step: _sanitized(batch))
    session.modules.on_root_forward.append(lambda module, args: _sanitized(args))
    session.hooks.tensor_sources(lambda name, result: _sanitized(result))


def _standardize_inputs(remedy: dict, session) -> None:
    scales = remedy["tensors"]
    # Each tensor once: a full-batch script feeds the same tensor every step, and a slice of a
    # dataset tensor is standardized through that tensor, so every epoch sees it scaled once.
    done = WeakIdKeyDictionary()

    def standardize(value, prefix: str) -> None:
        with torch.no_grad():
            for path, t in iter_leaves(value, prefix):
                if path not in scales or not t.is_floating_point():
                    continue
                whole = t if t._base is None else t._base
                if whole in done:
                    continue
                done[whole] = True
                mean, std = scales[path]
                whole.sub_(mean).div_(std)

    session.on_batch.append(lambda batch, step: standardize(batch, "batch"))
    session.modules.on_root_forward.insert(0, lambda module, args: standardize(args, "input"))


def _reinitialize(remedy: dict, session) -> None:
    wanted = set(remedy["modules"])
    done: set[int] = set()

    def reset(root, args) -> None:
        if id(root) in done:
            return
        done.add(id(root))
        for name, module in root.named_modules():
            reset_parameters = _torch_reset_parameters(module)
            if name in wanted and reset_parameters is not None:
                with torch.no_grad():
                    reset_parameters(module)

    session.modules.on_root_forward.insert(0, reset)


def _torch_reset_parameters(module):
    """torch's own `reset_parameters` of the module's class: a user's override may be the very
    init that was flagged."""
    for cls in type(module).__mro__:
        if cls.__module__.startswith("torch.nn") and "reset_parameters" in vars(cls):
            return vars(cls)["reset_parameters"]
    return None


def _keep_float32(remedy: dict, session) -> None:
    low = (torch.float16, torch.bfloat16)
    for owner in (torch.nn.Module, torch.Tensor):
        for name in ("half", "bfloat16"):
            original = getattr(owner, name)
            setattr(owner, name, _identity_cast(original, owner is torch.nn.Module))
            session.hooks.add_undo(lambda o=owner, n=name, f=original: setattr(o, n, f))
    original_init = torch.autocast.__init__

    def autocast_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        original_init(self, device_type, dtype=dtype, enabled=False, cache_enabled=cache_enabled)

    torch.autocast.__init__ = autocast_init
    session.hooks.add_undo(lambda: setattr(torch.autocast, "__init__", original_init))
    original_to = torch.Tensor.to

    def to(tensor, *args, **kwargs):
        args = tuple(torch.float32 if a in low else a for a in args)
        if kwargs.get("dtype") in low:
            kwargs["dtype"] = torch.float32
        return original_to(tensor, *args, **kwargs)

    torch.Tensor.to = to
    session.hooks.add_undo(lambda: setattr(torch.Tensor, "to", original_to))


def _identity_cast(original, is_module: bool):
    def keep(self, *args, **kwargs):
        return self if is_module else self.float()

    keep.__wrapped__ = original
    return keep


# Remedies that change what one user line computes (a guard_op also names its op).
_AT_A_LINE = {
    "float32_at": Float32AtTheLine,
    "finite_fill": FiniteFillAtTheLine,
    "population_statistics": PopulationStatisticsAtTheLine,
}


def apply_remedy(remedy: dict, session) -> None:
    """Install `remedy` for this run (called before the script starts)."""
    kind = remedy["kind"]
    if kind in ("guard_op", "move_bound") or kind in _AT_A_LINE:
        where = (remedy["file"], int(remedy["line"]))
        if kind == "guard_op":
            mode = OpGuard(remedy["op"], *where, remedy.get("guard"))
        elif kind == "move_bound":
            mode = BoundAtTheLine(*where, remedy["bounds"])
        else:
            mode = _AT_A_LINE[kind](*where)
        mode.__enter__()
        session.remedy_guard = mode
        return
    installers = {
        "optimizer_eps": _optimizer_eps,
        "optimizer_settings": _optimizer_settings,
        "clip_gradients": _clip_gradients,
        "sanitize_inputs": _sanitize_inputs,
        "standardize_inputs": _standardize_inputs,
        "reinitialize": _reinitialize,
        "float32": _keep_float32,
    }
    installers[kind](remedy, session)
