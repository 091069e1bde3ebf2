"""The data scan's probe, inside the watched run: summarize every batch the script trains on.

Batches are seen twice over: as DataLoader returns them in the main process (so workers do not
hide them), and as tensors handed to a root module's forward (scripts that index tensors by
hand). A tensor seen both ways in one step is summarized once. Class targets are checked where
`F.cross_entropy` / `F.nll_loss` receive them, with C from the logits. Events:

- `data_batch`: step, source (loader | forward), the user line, one summary per tensor leaf;
- `data_origin`: the line in `Dataset.__getitem__` where a located bad sample turns non-finite;
- `data_targets`: the class targets of one loss call, against [0, C).
"""

from __future__ import annotations

import sys

import torch

from nandoctor.child.probes import safely
from nandoctor.instrument.batches import check_class_targets, iter_leaves, summarize
from nandoctor.instrument.frames import find_user_frame
from nandoctor.instrument.loaders import (
    LoadedBatch,
    dataset_index,
    is_map_style,
    watch_loader_batches,
)
from nandoctor.instrument.losses import LossCall, loss_watch
from nandoctor.instrument.origin import trace_nonfinite_origin
from nandoctor.instrument.tensors import is_checked, is_finite

_MAX_TARGET_EVENTS = 200  # loss calls reported when their targets are fine


def _key(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), t.numel(), t.dtype)


def _is_plain(t: torch.Tensor) -> bool:
    """A dense tensor with real storage (not meta, nested or a subclass)."""
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and not t.is_nested
        and (t.device.type != "meta")
    )


def _is_input(t: torch.Tensor) -> bool:
    """Data, not a model's output: no autograd history, not a parameter."""
    return _is_plain(t) and t.grad_fn is None and not t.requires_grad


class DataScanProbe:
    label = "data scan"

    def __init__(self, session, settings) -> None:
        self.session = session
        self.settings = settings
        self._loaded: LoadedBatch | None = None
        self._step = -1
        self._seen: dict[tuple, tuple[str, LoadedBatch | None]] = {}
        self._root_outputs: set[int] = set()
        self._forward_calls = 0
        self._batches = 0
        self._refetches = 0
        self._target_events = 0
        self._searched = False
        self.broken = False

    def install(self) -> None:
        session = self.session
        session.on_batch.append(self._loader_batch)
        session.modules.on_root_forward.append(self._root_forward)
        session.modules.on_module_output.append(self._module_output)
        watch = loss_watch()
        watch.before.append(self._loss_call)
        undo_loader = watch_loader_batches(self._remember_loaded)
        # The session's HookSet undoes its own patches and these when the run ends.
        session.hooks.add_undo(undo_loader)
        session.hooks.add_undo(watch.remove)

    # ---- hooks ------------------------------------------------------------------------------
    @safely
    def _remember_loaded(self, loaded: LoadedBatch) -> None:
        self._loaded = loaded

    @safely
    def _loader_batch(self, batch, step: int) -> None:
        self._new_step(step)
        loaded = self._loaded if self._loaded and self._loaded.batch_id == id(batch) else None
        leaves = [
            (path, t)
            for path, t in iter_leaves(batch, "batch", self.settings.max_leaves)
            if _is_plain(t)
        ]
        self._scan(leaves, "loader", loaded, step)

    @safely
    def _root_forward(self, module, args) -> None:
        with self.session.quiet():
            self._new_step(self.session.step)
            if self._forward_calls >= self.settings.forward_calls_per_step:
                return
            self._forward_calls += 1
            leaves = [
                (path, t)
                for path, t in iter_leaves(args, "input", self.settings.max_leaves)
                if _is_input(t)
                and _key(t) not in self._seen
                and t.data_ptr() not in self._root_outputs
            ]
            if leaves:
                self._scan(leaves, "forward", None, self.session.step, type(module).__name__)

    @safely
    def _module_output(self, module, name, args, output) -> None:
        """Outputs of root modules, so that a model's output fed to another model (a GAN's
        detached sample, a teacher's logits) is not taken for data."""
        if self.session.modules.in_forward:
            return
        for _, t in iter_leaves(output, "output", 8):
            if _is_plain(t) and t.is_floating_point():
                self._root_outputs.add(t.data_ptr())

    def _new_step(self, step: int) -> None:
        if step != self._step:
            self._step = step
            self._seen.clear()
            self._root_outputs.clear()
            self._forward_calls = 0

    # ---- summaries --------------------------------------------------------------------------
    def _scan(self, leaves, source: str, loaded, step: int, module: str | None = None) -> None:
        settings = self.settings
        summaries = []
        for path, t in leaves:
            summary = summarize(t, settings.magnitude_threshold, settings.max_positions)
            summary["path"] = path
            self._seen[_key(t)] = (path, loaded)
            if "bad_at" in summary:
                self._locate(summary, t, loaded, step)
            summaries.append(summary)
        if not summaries:
            return
        where = find_user_frame()
        self.session.events.emit(
            "data_batch",
            step=step,
            batch=self._batches,
            source=source,
            module=module,
            location=where.as_dict() if where else None,
            leaves=summaries,
            indices_known=loaded is not None and loaded.indices is not None,
        )
        self._batches += 1

    def _locate(self, summary: dict, t: torch.Tensor, loaded, step: int) -> None:
        """Dataset indices of the bad samples; the line that made the first one non-finite;
        the script's tensor that holds the bad rows (once: it scans the script's globals)."""
        if loaded is not None:
            found = [dataset_index(loaded, sample) for sample in summary["bad_at"]]
            summary["dataset_at"] = found
            if found and found[0] is not None:
                self._find_origin(loaded, found[0], summary["path"], step)
        if self.settings.search_script_globals and not self._searched:
            self._searched = True
            source = _script_tensor_with_bad_rows(t, self.settings.max_positions)
            if source is not None:
                summary["script_tensor"] = source

    def _find_origin(self, loaded: LoadedBatch, index: int, path: str, step: int) -> None:
        if self._refetches >= self.settings.origin_refetches or not is_map_style(loaded.dataset):
            return
        self._refetches += 1
        origin, reproduced = trace_nonfinite_origin(lambda: loaded.dataset[index])
        self.session.events.emit(
            "data_origin",
            step=step,
            dataset_index=index,
            path=path,
            reproduced=reproduced,
            location=origin.location.as_dict() if origin else None,
            variable=origin.variable if origin else None,
            counts=origin.counts if origin else None,
            value_kind=origin.kind if origin else None,
            container=origin.container if origin else None,
            dataset=type(loaded.dataset).__name__,
        )

    # ---- class targets ----------------------------------------------------------------------
    @safely
    def _loss_call(self, call: LossCall) -> None:
        if not isinstance(call.input, torch.Tensor) or not isinstance(call.target, torch.Tensor):
            return
        with self.session.quiet():
            checked = check_class_targets(
                call.input, call.target, call.ignore_index, self.settings.max_positions
            )
        if checked is None:
            return
        all_ignored = checked["ignored"] == checked["targets"]
        problem = checked["out_of_range"] > 0 or (all_ignored and call.reduction == "mean")
        if not problem and self._target_events >= _MAX_TARGET_EVENTS:
            return
        self._target_events += 1
        seen = self._seen.get(_key(call.target))
        if seen is not None and "bad_at" in checked:
            checked["dataset_at"] = [dataset_index(seen[1], i) for i in checked["bad_at"]]
        where = find_user_frame()
        self.session.events.emit(
            "data_targets",
            step=self.session.step,
            loss=call.name,
            reduction=call.reduction,
            all_ignored=all_ignored,
            path=seen[0] if seen else None,
            location=where.as_dict() if where else None,
            **checked,
        )


def _script_tensor_with_bad_rows(t: torch.Tensor, limit: int) -> dict | None:
    """A tensor of the script's globals shaped like the batch (same trailing dims, at least as
    many rows; the batch itself when the script trains on one tensor) that holds NaN/Inf: where
    hand-indexed batches most likely come from."""
    main = sys.modules.get("__main__")
    if main is None or t.dim() == 0:
        return None
    for name, value in list(vars(main).items()):
        if (
            isinstance(value, torch.Tensor)
            and is_checked(value)
            and value.dim() == t.dim()
            and value.shape[1:] == t.shape[1:]
            and value.shape[0] >= t.shape[0]
            and not is_finite(value)
        ):
            bad = ~torch.isfinite(value.detach()).reshape(value.shape[0], -1).all(dim=1)
            return {
                "name": name,
                "shape": list(value.shape),
                "bad_rows": int(bad.sum()),
                "rows": bad.nonzero().flatten()[:limit].tolist(),
            }
    return None
