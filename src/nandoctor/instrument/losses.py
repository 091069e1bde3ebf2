"""See every classification loss the script computes: `F.cross_entropy` and `F.nll_loss`.

`nn.CrossEntropyLoss` / `nn.NLLLoss` call these through the module attribute
`torch.nn.functional.<name>`, and a script's `from torch.nn.functional import cross_entropy`
runs after nandoctor is installed, so replacing the attributes catches every spelling.
Listeners get the call before it runs (its targets can make it raise) and its result after.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F

_NAMES = ("cross_entropy", "nll_loss")


@dataclass
class LossCall:
    """One call of a classification loss, its arguments bound to their names."""

    name: str  # cross_entropy | nll_loss
    input: object
    target: object
    ignore_index: int
    reduction: str
    result: object = None  # set once the call returned


class LossWatch:
    """Keeps the listeners; the functional API is patched while at least one is installed."""

    def __init__(self) -> None:
        self.before: list[Callable[[LossCall], None]] = []
        self.after: list[Callable[[LossCall], None]] = []
        self._originals: dict[str, Callable] = {}

    def install(self) -> None:
        if self._originals:
            return
        for name in _NAMES:
            original = getattr(F, name)
            self._originals[name] = original
            setattr(F, name, self._wrap(name, original))

    def remove(self) -> None:
        for name, original in self._originals.items():
            setattr(F, name, original)
        self._originals = {}

    def _wrap(self, name: str, original: Callable) -> Callable:
        signature = inspect.signature(original)

        @functools.wraps(original)
        def loss(*args, **kwargs):
            if not (self.before or self.after):
                return original(*args, **kwargs)
            call = _bind(name, signature, args, kwargs)
            if call is not None:
                for listener in self.before:
                    listener(call)
            result = original(*args, **kwargs)
            if call is not None:
                call.result = result
                for listener in self.after:
                    listener(call)
            return result

        return loss


def _bind(name: str, signature: inspect.Signature, args, kwargs) -> LossCall | None:
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:  # the real call will raise the user's error
        return None
    bound.apply_defaults()
    values = bound.arguments
    return LossCall(
        name,
        values["input"],
        values["target"],
        values.get("ignore_index", -100),
        values.get("reduction", "mean"),
    )


_watch = LossWatch()


def loss_watch() -> LossWatch:
    """The one watch of this process (both the data scan and the init check listen to it)."""
    _watch.install()
    return _watch
