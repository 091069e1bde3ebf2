"""The init check's probe, inside the watched run: the model as it is at its first forward.

Until the first forward, a function mode records where each parameter was last written. At the
first forward of each root module with parameters (before the first optimizer step) it
summarizes every layer's weights, then follows that forward module by module: activation RMS
per module output in execution order. The first classification loss gives the starting loss.
Events: `init_forward` (layers, activations) and `init_loss`.
"""

from __future__ import annotations

import math

import torch
from torch.nn.parameter import is_lazy

from nandoctor.child.probes import safely
from nandoctor.instrument.batches import class_dim_size
from nandoctor.instrument.losses import LossCall, loss_watch
from nandoctor.instrument.modules import is_parametrization
from nandoctor.instrument.tensors import count_nonfinite, is_checked, is_finite
from nandoctor.instrument.weights import activation_record, describe_layer, first_tensor, layer_kind
from nandoctor.instrument.writes import ParameterWrites


def _first_floating(value) -> torch.Tensor | None:
    t = first_tensor(value)
    return t if t is not None and (t.is_floating_point() or t.is_complex()) else None


_MAX_PARAMETERS_NAMED = 4096  # parameters whose write line the `init_forward` event carries


class InitProbe:
    label = "init check"

    def stop_looking(self) -> None:
        self._tracing = None
        self.writes.stop()

    def __init__(self, session, settings) -> None:
        self.session = session
        self.settings = settings
        self.writes = ParameterWrites()
        self._roots: set[int] = set()
        self._tracing = None  # the root whose first forward is being followed
        self._layers: list[dict] = []
        self._nonfinite: list[dict] = []
        self._written: dict[str, dict] = {}
        self._input: dict | None = None
        self._activations: list[dict] = []
        self._loss_seen = False
        self.broken = False

    def install(self) -> None:
        session = self.session
        self.writes.start()
        session.modules.on_root_forward.append(self._root_forward)
        session.modules.on_module_output.append(self._module_output)
        watch = loss_watch()
        watch.after.append(self._loss_result)
        session.hooks.add_undo(self.writes.stop)
        session.hooks.add_undo(watch.remove)

    @safely
    def _root_forward(self, module, args) -> None:
        self.writes.stop()  # the first forward of anything ends the record of writes
        if (
            self._tracing is not None
            or self.session.step > 0
            or id(module) in self._roots
            or len(self._roots) >= self.settings.max_roots
            or next(module.parameters(), None) is None
        ):
            return
        self._roots.add(id(module))
        with self.session.quiet():
            self._layers = self._describe_layers(module)
            self._written, self._nonfinite = self._parameter_records(module)
            self._input = activation_record(_first_floating(args))
        self._activations = []
        self._tracing = module

    def _describe_layers(self, root) -> list[dict]:
        layers = []
        for name, sub in root.named_modules():
            kind = layer_kind(sub)
            if any(is_lazy(p) for p in sub.parameters(recurse=False)):
                continue  # lazy modules get their weights during this very forward
            if kind is not None and not any(w.requires_grad for w in _weights_of(sub, kind)):
                # Frozen weights were set on purpose (a pretrained backbone, a fixed bilinear
                # upsampling kernel): no initialization for kappa to judge; growth through them
                # is still measured.
                kind = None
            if kind is None:
                if other := self._other_layer(name or type(root).__name__, name, sub):
                    layers.append(other)
                continue
            layer = describe_layer(name or type(root).__name__, sub, kind)
            layer["module"] = name  # as `root.named_modules()` names it ("" for the root)
            for weight, param in zip(
                layer.get("weights", []), _weights_of(sub, kind), strict=False
            ):
                line = self.writes.line_of(param) or self._line_of_source(sub, param)
                weight["written"] = line.as_dict() if line else None
            layers.append(layer)
        return layers

    def _parameter_records(self, root) -> tuple[dict[str, dict], list[dict]]:
        """In one pass over the parameters: {name: the line that last set it} (read by the
        anomaly stage for a parameter found non-finite later without any op making it), and
        every parameter that already holds NaN/Inf, with that line: bare `nn.Parameter`s of
        the user's own modules (a CRF's transitions, a prototype matrix) included, whatever
        their shape."""
        written, nonfinite = {}, []
        for index, (name, param) in enumerate(root.named_parameters()):
            healthy = is_lazy(param) or not is_checked(param) or is_finite(param)
            # Memory allocated uninitialized that is still NaN: the allocation is its origin.
            created = None if healthy else self.session.uninitialized.created_at(param)
            line = created or self.writes.line_of(param)
            if line and index < _MAX_PARAMETERS_NAMED:
                written[name] = line.as_dict()
            if healthy:
                continue
            nonfinite.append({
                "param": name,
                "shape": list(param.shape),
                "finite": False,
                "nonfinite": count_nonfinite(param).describe(),
                "written": line.as_dict() if line else None,
                "uninitialized": created is not None,
            })  # fmt: skip
        return written, nonfinite

    def _line_of_source(self, module, weight: torch.Tensor):
        """A weight the module computes from parameters of its own (weight_norm's `weight_g`
        and `weight_v`, a parametrization's `original`) was set where its largest source was:
        the direction, not the per-channel scale."""
        if isinstance(weight, torch.nn.Parameter):
            return None
        sources = [p for n, p in module.named_parameters()
                   if n.startswith(("weight_", "parametrizations.weight."))]  # fmt: skip
        for source in sorted(sources, key=lambda p: p.numel(), reverse=True):
            if line := self.writes.line_of(source):
                return line
        return None

    def _other_layer(self, label: str, name: str, module) -> dict | None:
        """A module of the user's own (a hand-written Dense): no kappa check, whose meaning is
        unknown, but where its weights were set, so growth through it can be located."""
        if is_parametrization(module):
            return None  # the sources of a layer's weight, judged with that layer
        weights = []
        for pname, param in module.named_parameters(recurse=False):
            if param.dim() >= 2 and (line := self.writes.line_of(param)):
                weights.append({"param": f"{label}.{pname}", "written": line.as_dict()})
        if not weights:
            return None
        return {"name": label, "type": type(module).__name__, "kind": "other", "module": name,
                "weights": weights}  # fmt: skip

    @safely
    def _module_output(self, module, name, args, output) -> None:
        if self._tracing is None:
            return
        if len(self._activations) < self.settings.max_modules:
            with self.session.quiet():
                self._activations.append(
                    {
                        "name": name,
                        "type": type(module).__name__,
                        "kind": layer_kind(module),
                        "leaf": next(module.children(), None) is None,
                        "input": activation_record(_first_floating(args)),
                        "output": activation_record(_first_floating(output)),
                    }
                )
        if module is self._tracing:
            self._tracing = None
            self.session.events.emit(
                "init_forward",
                step=self.session.step,
                root=name,
                layers=self._layers,
                nonfinite_params=self._nonfinite,
                parameters_written=self._written,
                input=self._input,
                activations=self._activations,
            )

    @safely
    def _loss_result(self, call: LossCall) -> None:
        """The first classification loss of the run, before any update: compare with ln C."""
        if self._loss_seen or self.session.step > 0 or call.reduction != "mean":
            return
        if not isinstance(call.result, torch.Tensor) or call.result.numel() != 1:
            return
        self._loss_seen = True
        with self.session.quiet():
            value = float(call.result.detach())
            classes = class_dim_size(call.input)
            logits = activation_record(call.input) if isinstance(call.input, torch.Tensor) else None
        self.session.events.emit(
            "init_loss",
            step=self.session.step,
            loss=call.name,
            value=value,
            classes=classes,
            expected=math.log(classes) if classes > 1 else None,
            input=logits,
        )


def _weights_of(module, kind: str) -> list[torch.Tensor]:
    """The parameters `describe_layer` summarized, in the same order."""
    if kind in ("linear", "conv", "embedding"):
        return [module.weight]
    if kind == "attention":
        names = ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")
        return [w for n in names if isinstance(w := getattr(module, n, None), torch.Tensor)]
    if kind == "rnn":
        return [p for n, p in module.named_parameters() if n.startswith("weight_")]
    return []
