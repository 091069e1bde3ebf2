"""Know which module is running: global forward hooks keep a stack of qualified module names."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable

import torch
from torch.nn.modules import module as module_globals
from torch.nn.utils.parametrize import ParametrizationList

from nandoctor.instrument.tensors import iter_tensors


class ModuleTracker:
    """Keeps `current` = the qualified name of the innermost module whose forward is running.

    Names are state_dict paths (`encoder.layers.1.fc`) relative to the outermost module that was
    called; that root itself is named by its class (`Net`). A module first seen outside any root
    (a loss module called on its own) becomes a root of its own. A `torch.compile`d module
    stands for the module it wraps, so names read the same compiled or not; the modules
    inside a compiled forward are not seen one by one (see `_enter`).
    """

    def __init__(self) -> None:
        self._names: dict[int, str] = {}
        self._stack: list[str] = []
        self.roots: list[torch.nn.Module] = []
        self._handles: list = []
        # Called with (module, args) when a root module starts its forward (data scan, init check).
        self.on_root_forward: list[Callable] = []
        self.on_module_output: list[Callable] = []
        # Called with (module, name, chain) once per module found recurrent (see `_note_chain`).
        self.on_recurrent: list[Callable] = []
        self._last_outputs: dict[int, list] = {}  # id(module) -> weak refs to its last outputs
        self._chains: dict[int, int] = {}  # id(module) -> calls in a row fed their own output
        self._recurrent: set[int] = set()
        self._parametrizing = 0  # parametrizations being computed outside any forward

    @property
    def current(self) -> str | None:
        return self._stack[-1] if self._stack else None

    @property
    def in_forward(self) -> bool:
        return bool(self._stack)

    def install(self) -> None:
        self._handles = [
            module_globals.register_module_forward_pre_hook(self._enter),
            # always_call: the stack must be popped even when the forward raises.
            module_globals.register_module_forward_hook(self._leave, always_call=True),
        ]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def name_of(self, module: torch.nn.Module) -> str | None:
        return self._names.get(id(module))

    def parameter_name(self, t: torch.Tensor) -> str | None:
        """The qualified name of a parameter of a watched model (`head.prototypes`), or None."""
        for root in self.roots:
            for name, param in root.named_parameters():
                if param is t:
                    return name
        return None

    def lookup_table_of(self, t: torch.Tensor) -> str | None:
        """The class name of the embedding whose weight `t` is (`Embedding`, `EmbeddingBag`),
        or None: a table whose rows are looked up by index, not a layer's weights."""
        # The table may belong to no watched root: a model that reads `emb.weight[idx]` in a
        # method other than forward is never called. Its module holds it in `_parameters`,
        # which the module's attribute dict holds.
        for parameters in _dicts_holding(t):
            for attributes in _dicts_holding(parameters):
                for owner in gc.get_referrers(attributes):
                    if isinstance(owner, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and (
                        owner.weight is t
                    ):
                        return type(owner).__name__
        return None

    def adopt(self, root: torch.nn.Module) -> None:
        """Name `root`'s modules and parameters before its first call."""
        root = uncompiled(root)
        if id(root) not in self._names:
            self._register_root(root)

    def _register_root(self, root: torch.nn.Module) -> None:
        self.roots.append(root)
        root_name = type(root).__name__
        for qualified, sub in root.named_modules():
            self._names.setdefault(id(sub), qualified or root_name)

    # Hooks must return None: a global forward hook that returns a value replaces the output.
    # Inside a compiled forward, torch.compile traces these hooks into its graph: they return at
    # once there, so the graph is the user's own, and nandoctor's bookkeeping (which dynamo
    # cannot always trace) runs only for the modules called eagerly.
    def _enter(self, module: torch.nn.Module, args) -> None:
        if torch.compiler.is_compiling():
            return
        module = uncompiled(module)
        if self._parametrizing or (not self._stack and is_parametrization(module)):
            # `weight_norm`/`register_parametrization` compute the weight once when they wrap a
            # layer, outside any forward: model construction, not a model's first call.
            self._parametrizing += is_parametrization(module)
            return
        name = self._names.get(id(module))
        if name is None:
            if self._stack:
                name = f"{self._stack[-1]}.{type(module).__name__}"
                self._names[id(module)] = name
            else:
                self._register_root(module)
                name = self._names[id(module)]
        if not self._stack:
            for callback in self.on_root_forward:
                callback(module, args)
        self._stack.append(name)
        if self.on_recurrent and id(module) not in self._recurrent:
            self._note_chain(module, name, args)

    def _leave(self, module: torch.nn.Module, args, output) -> None:
        if torch.compiler.is_compiling():
            return
        module = uncompiled(module)
        if self._parametrizing:
            self._parametrizing -= is_parametrization(module)
            return
        if self._stack:
            name = self._stack.pop()
            for callback in self.on_module_output:
                callback(module, name, args, output)
        if self.on_recurrent and id(module) not in self._recurrent:
            self._last_outputs[id(module)] = [weakref.ref(t) for t in iter_tensors(output)]

    def _note_chain(self, module: torch.nn.Module, name: str, args) -> None:
        """Recurrence: the same weights applied again and again to their own output (a hidden
        state, `output, hidden = rnn(x[t], hidden)`), or torch's RNN modules, which loop inside.
        Gradients through such a chain are products of as many Jacobians: they explode or
        vanish geometrically with its length."""
        if isinstance(module, torch.nn.RNNBase):
            chain = _sequence_length(module, args)
        else:
            outputs = self._last_outputs.get(id(module), [])
            fed_back = any(ref() is t for ref in outputs for t in iter_tensors(args))
            chain = self._chains.get(id(module), 1) + 1 if fed_back else 1
            self._chains[id(module)] = chain
        if chain >= RECURRENT_CHAIN and next(module.parameters(), None) is not None:
            self._recurrent.add(id(module))
            self._last_outputs.pop(id(module), None)
            for callback in self.on_recurrent:
                callback(module, name, chain)


# Calls in a row, each fed the previous one's output, that make a module recurrent.
RECURRENT_CHAIN = 8


def _sequence_length(module: torch.nn.RNNBase, args) -> int:
    """Time steps of one call of torch's RNN/LSTM/GRU (a packed sequence counts as long)."""
    first = args[0] if args else None
    if not isinstance(first, torch.Tensor):
        return RECURRENT_CHAIN
    if first.dim() < 3:  # unbatched: (length, features)
        return first.shape[0] if first.dim() == 2 else 1
    return first.shape[1] if module.batch_first else first.shape[0]


def uncompiled(module: torch.nn.Module) -> torch.nn.Module:
    """The module `torch.compile(module)` wrapped, or `module` itself."""
    # Looked up, not imported: importing torch._dynamo costs a second, and a script that never
    # compiled has no compiled module to unwrap.
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    wrapper = getattr(eval_frame, "OptimizedModule", None)
    if wrapper is not None and isinstance(module, wrapper):
        return module._orig_mod
    return module


def is_parametrization(module: torch.nn.Module) -> bool:
    return isinstance(module, ParametrizationList)


def _dicts_holding(value) -> list[dict]:
    return [holder for holder in gc.get_referrers(value) if isinstance(holder, dict)]
