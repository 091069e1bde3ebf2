"""Global hooks into a script nandoctor did not write: optimizer steps, backward calls, batches."""

from __future__ import annotations

import contextlib
import inspect
import os
import types
from collections.abc import Callable

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

_COMPILE_SWITCH = "TORCHDYNAMO_DISABLE"


class HookSet:
    """Installs the hooks and removes every one of them again, whatever happened in between."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def optimizer_steps(self, before: Callable, after: Callable) -> None:
        """Call `before(opt)` / `after(opt)` around every `torch.optim.Optimizer.step`."""
        pre = register_optimizer_step_pre_hook(lambda opt, args, kwargs: before(opt))
        post = register_optimizer_step_post_hook(lambda opt, args, kwargs: after(opt))
        self._undo += [pre.remove, post.remove]

    def backward_calls(self, before: Callable, after: Callable) -> None:
        """Call `before(tensors)` / `after(tensors)` around every backward pass.

        `Tensor.backward` reaches the engine through the module attribute
        `torch.autograd.backward`, so replacing it there catches both spellings.
        `torch.autograd.grad` is a backward pass too: functional training loops (ports of JAX
        code, meta-learning) take their gradients from it and update the tensors by hand.
        """
        inside = []  # a pass under way: a torch-function mode re-enters `grad` through its API

        for name in ("backward", "grad"):
            original = getattr(torch.autograd, name)

            def backward(tensors, *args, _original=original, **kwargs):
                if inside:
                    return _original(tensors, *args, **kwargs)
                before(tensors)
                inside.append(True)
                try:
                    return _original(tensors, *args, **kwargs)
                finally:
                    inside.pop()
                    after(tensors)

            backward.__doc__ = original.__doc__
            setattr(torch.autograd, name, backward)
            self._undo.append(lambda n=name, f=original: setattr(torch.autograd, n, f))

    def batches(self, entered: Callable, produced: Callable) -> None:
        """Call `entered()` before and `produced(batch)` after every DataLoader batch."""
        iterator_class = torch.utils.data.dataloader._BaseDataLoaderIter
        original = iterator_class.__next__

        def next_batch(iterator):
            entered()
            try:
                batch = original(iterator)
            except BaseException:
                produced(None)
                raise
            produced(batch)
            return batch

        iterator_class.__next__ = next_batch
        self._undo.append(lambda: setattr(iterator_class, "__next__", original))

    def optimizers_created(self, created: Callable) -> None:
        """Call `created(optimizer)` after every `torch.optim.Optimizer` is constructed."""
        original = torch.optim.Optimizer.__init__

        def init(optimizer, *args, **kwargs):
            original(optimizer, *args, **kwargs)
            created(optimizer)

        torch.optim.Optimizer.__init__ = init
        self._undo.append(lambda: setattr(torch.optim.Optimizer, "__init__", original))

    def tensor_sources(self, produced: Callable) -> None:
        """Call `produced(name, result)` for tensors that enter torch from outside its ops
        (`torch.from_numpy` never reaches the dispatcher; `torch.load` restores storage)."""
        for name in ("from_numpy", "as_tensor", "asarray", "tensor", "load", "frombuffer"):
            original = getattr(torch, name, None)
            if original is None:
                continue
            self._wrap_source(name, original, produced)

    def _wrap_source(self, name: str, original: Callable, produced: Callable) -> None:
        def source(*args, **kwargs):
            result = original(*args, **kwargs)
            produced(f"torch.{name}", result)
            return result

        source.__wrapped__ = original
        source.__doc__ = original.__doc__
        setattr(torch, name, source)
        self._undo.append(lambda: setattr(torch, name, original))

    def compile_used(self, callback: Callable) -> None:
        """Call `callback()` whenever the script calls `torch.compile`: `torch.compile(model)`,
        `@torch.compile`, `@torch.compile(mode=...)` and `model.compile()` all go through it."""
        original = torch.compile

        def compile_(*args, **kwargs):
            callback()
            return original(*args, **kwargs)

        compile_.__wrapped__ = original
        compile_.__doc__ = original.__doc__
        torch.compile = compile_
        self._undo.append(lambda: setattr(torch, "compile", original))

    def compile_disabled(self) -> None:
        """Make every `torch.compile` of this run a no-op, so the model runs eagerly and each of
        its ops reaches the dispatcher (where per-op checks see it; compiled kernels bypass it).

        torch's own switch: `torch._dynamo.optimize`, behind every entry point of
        `torch.compile`, reads `TORCHDYNAMO_DISABLE` at each call and returns the function or
        module unchanged. The variable, unlike `torch._dynamo.config.disable`, needs no import
        of torch._dynamo (a second of start-up) in a run whose script never compiles.
        """
        previous = os.environ.get(_COMPILE_SWITCH)
        os.environ[_COMPILE_SWITCH] = "1"
        self._undo.append(lambda: _restore_environment(_COMPILE_SWITCH, previous))

    def autocast_entered(self, callback: Callable) -> None:
        """Call `callback(autocast)` each time an autocast region is entered, whichever
        spelling (`torch.autocast`, `torch.amp.autocast`, `torch.cpu.amp.autocast`) made it."""
        autocast_class = torch.amp.autocast_mode.autocast
        original = autocast_class.__enter__

        def enter(region):
            result = original(region)
            callback(region)
            return result

        autocast_class.__enter__ = enter
        self._undo.append(lambda: setattr(autocast_class, "__enter__", original))

    def grad_scaler_used(self, callback: Callable) -> None:
        """Call `callback(outputs)` when a GradScaler scales a loss (before scaling): its inf
        gradients are expected (the scaler skips those steps), so only gradients it lets
        through are checked, and the loss that counts is the unscaled one."""
        scaler_class = torch.amp.GradScaler
        original = scaler_class.scale

        def scale(scaler, outputs):
            callback(outputs)
            return original(scaler, outputs)

        scaler_class.scale = scale
        self._undo.append(lambda: setattr(scaler_class, "scale", original))

    def gradient_clips(self, clipped: Callable) -> None:
        """Call `clipped(kind, tensors, limit, from_an_iterator)` after every
        `clip_grad_norm_` / `clip_grad_value_`, with the tensors it was given. Frameworks call
        them through the module attribute at each step (accelerate's and Lightning's clipping,
        the HF Trainer's), and a script's `from torch.nn.utils import clip_grad_norm_` runs
        after the hook is in place, so both modules' attributes are replaced."""
        clip_grad = torch.nn.utils.clip_grad
        for kind in ("clip_grad_norm_", "clip_grad_value_"):
            original = getattr(clip_grad, kind)
            signature = inspect.signature(original)

            def clip(*args, _original=original, _kind=kind, _signature=signature, **kwargs):
                call = _signature.bind(*args, **kwargs)
                parameters = call.arguments["parameters"]
                # Given as an iterator (`model.parameters()`), the tensors can be read once:
                # listed here, the same list is what the clip itself gets.
                iterator = not isinstance(parameters, (torch.Tensor, list, tuple))
                tensors = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
                # torch warns about an empty generator: handed one still, as the script did
                is_generator = isinstance(parameters, types.GeneratorType)
                call.arguments["parameters"] = (t for t in tensors) if is_generator else tensors
                result = _original(*call.args, **call.kwargs)
                limit = call.arguments.get("max_norm", call.arguments.get("clip_value"))
                clipped(_kind, tensors, limit, iterator)
                return result

            clip.__wrapped__ = original
            clip.__doc__ = original.__doc__
            for owner in (clip_grad, torch.nn.utils):
                setattr(owner, kind, clip)
                self._undo.append(lambda o=owner, k=kind, f=original: setattr(o, k, f))

    def scalar_reads(self, read: Callable) -> None:
        """Call `read(tensor, value)` after every `tensor.item()`, `float(tensor)` and
        `tensor.numpy()`: the values a script prints, logs and checks (`if
        math.isnan(loss.item()): raise ...`), and the arrays a Trainer gathers its evaluation
        losses in."""
        for name in ("item", "__float__", "numpy"):
            self._wrap_method(torch.Tensor, name, read)

    def _wrap_method(self, owner: type, name: str, read: Callable) -> None:
        original = getattr(owner, name)
        own = name in owner.__dict__  # else inherited (from torch._C.TensorBase): delete to undo

        def wrapper(tensor, *args, **kwargs):
            value = original(tensor, *args, **kwargs)
            read(tensor, value)
            return value

        wrapper.__doc__ = original.__doc__
        setattr(owner, name, wrapper)
        self._undo.append(lambda: setattr(owner, name, original) if own else delattr(owner, name))

    def add_undo(self, undo: Callable[[], None]) -> None:
        """Run `undo()` when the hooks are removed (a probe's or a remedy's own patches)."""
        self._undo.append(undo)

    def remove_all(self) -> None:
        while self._undo:
            with contextlib.suppress(Exception):
                self._undo.pop()()


def _restore_environment(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
