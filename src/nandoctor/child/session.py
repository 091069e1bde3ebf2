"""One watched run: the step clock, the current phase, and the checks of loss, grads and params."""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import sys
import time
import weakref
from collections.abc import Callable

import torch

from nandoctor.child.events import EventWriter
from nandoctor.child.options import ChildOptions
from nandoctor.instrument.detector import Birth, NonfiniteDetector, StopRun
from nandoctor.instrument.frames import (
    SourceLine,
    called_from_user_code,
    find_construction_frame,
    find_user_frame,
    is_library_file,
)
from nandoctor.instrument.graph import leaves_reached_by
from nandoctor.instrument.hooks import HookSet
from nandoctor.instrument.modules import ModuleTracker
from nandoctor.instrument.numpy_errors import watch_numpy_errors
from nandoctor.instrument.precision import floating_param_dtypes, precision_in_use
from nandoctor.instrument.tensors import (
    constant_factor,
    count_nonfinite,
    is_checked,
    is_finite,
    iter_tensors,
    params_of,
    process_group_initialized,
)
from nandoctor.instrument.uninitialized import UninitializedMemory


def _total_norm(tensors: list[torch.Tensor]) -> float:
    """L2 norm over many tensors in a few fused kernels; NaN/Inf anywhere makes it non-finite
    (and so can finite values whose norm exceeds float32: confirm with `_first_nonfinite`)."""
    if not tensors:
        return 0.0
    norms = torch._foreach_norm([t.detach() for t in tensors])
    # one float64 reduction: squares of large float32 norms would overflow float32
    return float(torch.linalg.vector_norm(torch.stack(norms).double()))


def _first_nonfinite(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    return next((t for t in tensors if not is_finite(t)), None)


class WatchSession:
    """Everything the instrumentation shares while the user's script runs."""

    def __init__(
        self,
        options: ChildOptions,
        events: EventWriter,
        on_nonfinite: Callable | None = None,
        steps_by_backward: bool = True,
    ) -> None:
        self.started = time.monotonic()
        self._nonfinite_read: tuple | None = None  # (tensor, SourceLine | None): see _scalar_read
        # The nonfinite events of a loss, and of gradients after backward, no step took yet
        self._pending_loss: dict | None = None
        self._pending_grad: dict | None = None
        self._numpy_lines: set = set()  # user lines where numpy made NaN/Inf (_numpy_error)
        self.options = options
        self.events = events
        self.step = 0
        self.paused = False
        self.stopping = False
        self.backward_call: SourceLine | None = None
        self.modules = ModuleTracker()
        self.detector = NonfiniteDetector(self) if options.detect else None
        self.hooks = HookSet()
        # What the script allocates uninitialized reads as NaN until it starts to train.
        self.uninitialized = UninitializedMemory()
        self.backward_calls = 0
        self.found_nonfinite = False
        # What happens when a NaN/Inf reaches something: a child run stops; the in-process
        # API (nandoctor.guard) raises NonFiniteError instead.
        self.on_nonfinite: Callable[[dict], None] = on_nonfinite or self._stop_run
        # Count backward passes as steps while no optimizer exists (a child run sees every
        # optimizer built; the in-process API may watch one built before it started).
        self.steps_by_backward = steps_by_backward
        self.uses_grad_scaler = False
        self._detecting = False
        self._compile_noted = False
        self._loss_scale_noted = False
        self._in_optimizer = False
        # A closure passed to optimizer.step(closure) (LBFGS, Lightning) is running its forward
        # and backward: those ops are the model's, not the optimizer's update.
        self._closure_running = False
        self._in_dataloader = False
        self._in_backward = False
        self._forward_this_step = False
        self._clock: weakref.ref | None = None  # the optimizer whose steps count as steps
        self._optimizers: list[weakref.ref] = []
        self._constructed: list[weakref.ref] = []
        self._stepping = None  # the optimizer whose step() is running
        self._losses: list[float] = []
        self._grad_norm: float | None = None
        self._norm_before_clip: float | None = None  # set by `clip_gradients` until recorded
        self._backward_since_step = False  # gradients computed that no step has consumed yet
        self._param_names: dict[int, str] = {}
        # Leaves the running backward pass writes gradients into, modules' or not.
        self._backward_leaves: list[torch.Tensor] = []
        # Optimizers that stepped since the last backward pass, and which ways the script's
        # gradient clipping failed to act have been said (_gradients_clipped).
        self._stepped_since_backward: list = []
        self._clip_problems_said: set = set()
        self._param_dtypes: dict[tuple, tuple[str, ...]] = {}
        self._precisions_seen: set[tuple] = set()
        self._autocast_lines: set[tuple | None] = set()
        self.on_batch: list = []  # probes of stages that look at every batch
        self.rewind = None  # the watched run's RewindKeeper (child/rewind.py)
        # Tensors that entered torch already non-finite while no detector ran, with where and
        # when: a detector switched on in a run resumed from a rewind point adopts them.
        self._entered_nonfinite: list[tuple] = []

    # ---- what the detector asks -------------------------------------------------------------
    @property
    def module(self) -> str | None:
        return self.modules.current

    @property
    def phase(self) -> str:
        if self._in_optimizer and not self._closure_running and not self._in_backward:
            return "optimizer"
        if self._in_dataloader:
            return "data"
        if self._in_backward:
            return "backward"
        if self.modules.in_forward or self._forward_this_step:
            return "forward"
        return "data"  # before the model's first call in this step: preparing the batch

    @property
    def runs_eagerly(self) -> bool:
        """torch.compile is a no-op in this run: per-op checks see only the ops of an eager run,
        and a remedy acts through hooks that compiled code bypasses."""
        return self.detector is not None or bool(self.options.remedy)

    @contextlib.contextmanager
    def quiet(self):
        """nandoctor's own tensor work, invisible to the detector."""
        previous, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = previous

    # ---- install / remove -------------------------------------------------------------------
    def install(self) -> None:
        self.uninitialized.start()
        self.hooks.add_undo(self.uninitialized.stop)
        self.modules.on_root_forward.append(self._root_forward)
        self.modules.on_recurrent.append(self._recurrent_module)
        self.modules.install()
        self.hooks.optimizer_steps(self._before_step, self._after_step)
        self.hooks.backward_calls(self._before_backward, self._after_backward)
        self.hooks.batches(self._batch_requested, self._batch_produced)
        self.hooks.grad_scaler_used(self._grad_scaler_used)
        self.hooks.autocast_entered(self._autocast_entered)
        self.hooks.optimizers_created(self._optimizer_created)
        self.hooks.compile_used(self._compile_used)
        self.hooks.scalar_reads(self._scalar_read)
        self.hooks.gradient_clips(self._gradients_clipped)
        watch_numpy_errors(self._numpy_error)
        if self.runs_eagerly:
            self.hooks.compile_disabled()
        if self.detector is not None or self.options.rewind:
            self.hooks.tensor_sources(self._tensor_entered)
        if self.options.rewind:  # asked for single-process runs only (diagnose._rewinds)
            from nandoctor.child.rewind import RewindKeeper

            self.rewind = RewindKeeper(self, self.options.rewind)
        self._activate_detector_at(self.step)

    def resume_as(self, options: ChildOptions) -> None:
        """In a run resumed from a rewind point: the instrumentation of `options` from now on
        (per-op checks, the re-run's probes and remedy) instead of the watched run's."""
        self.options = options
        self.started = time.monotonic()  # the re-run's own time, not the watched run's
        self.rewind = None
        self.on_batch = []  # the watched run's probes saw the steps before the point
        if options.detect and self.detector is None:
            self.detector = NonfiniteDetector(self)
            with self.quiet():
                for ref, source, location, step in self._entered_nonfinite:
                    if (tensor := ref()) is not None:
                        self.detector.adopt_entered(tensor, source, location, step)
        from nandoctor.child.bootstrap import install_probes_and_remedy

        install_probes_and_remedy(self, options)
        self._activate_detector_at(self.step)

    @property
    def compiled(self) -> bool:
        """The script called torch.compile."""
        return self._compile_noted

    def _activate_detector_at(self, step: int) -> None:
        """Per-op localization runs from `detect_from_step` on: a replay of a failure at step K
        runs the steps before K at full speed."""
        if (
            self.detector is not None
            and not self._detecting
            and step >= self.options.detect_from_step
        ):
            self.detector.activate()
            self._detecting = True

    def remove(self) -> None:
        if self._detecting:
            with contextlib.suppress(Exception):
                self.detector.deactivate()
        self.hooks.remove_all()
        self.modules.remove()

    # ---- hooks ------------------------------------------------------------------------------
    def _root_forward(self, module, args) -> None:
        self.uninitialized.stop()  # the script is past its set-up
        self._forward_this_step = True
        if self._in_optimizer:
            self._closure_running = True
        self._note_precision(module)

    def _recurrent_module(self, module, name: str, chain: int) -> None:
        """Said once per module: weights applied `chain` times in a row to their own output,
        the positive evidence an `exploding_gradients` cause needs besides gradient spikes."""
        self.events.emit("recurrent", module=name, type=type(module).__name__, chain=int(chain),
                         step=self.step)  # fmt: skip

    def _note_precision(self, module) -> None:
        """Each distinct precision a model computes in, said once: the positive evidence a
        `precision` cause needs (float16/bfloat16 weights, autocast, TF32)."""
        first = next(module.parameters(), None)
        key = (id(module), first.dtype if first is not None else None)
        if key not in self._param_dtypes:  # listing a large model's parameters costs
            self._param_dtypes[key] = floating_param_dtypes(module)
        device = first.device.type if first is not None else None
        state = precision_in_use(device, self._param_dtypes[key])
        seen = (tuple(state["param_dtypes"]), tuple(state["autocast"]), state["tf32"])
        if seen not in self._precisions_seen:
            self._precisions_seen.add(seen)
            self.events.emit("precision", module=type(module).__name__, step=self.step, **state)

    def _batch_requested(self) -> None:
        self._in_dataloader = True

    def _batch_produced(self, batch) -> None:
        self._in_dataloader = False
        if batch is not None:
            with self.quiet():
                for probe in self.on_batch:
                    probe(batch, self.step)

    def _before_backward(self, tensors) -> None:
        self._stop_if_asked()
        self.uninitialized.stop()
        self._nonfinite_read = None  # the script trains on: what it uses is checked from here
        self.backward_call = find_user_frame()
        self.backward_calls += 1
        self._backward_since_step = True
        self._backward_leaves = leaves_reached_by(list(iter_tensors(tensors)))
        self._pending_loss = None  # a non-finite loss of an earlier backward no step took
        if not self.uses_grad_scaler:  # with a scaler, the loss was checked before scaling
            self._note_loss_scale(tensors)
            self._check_loss(tensors, defer=self._steps_come_later)
        self._in_backward = True

    def _note_loss_scale(self, tensors) -> None:
        """A loss multiplied by a large constant right before backward() (a static loss scale)
        scales every gradient by it unless they are divided back: said once."""
        if self._loss_scale_noted or not isinstance(tensors, torch.Tensor):
            return
        with self.quiet():  # reading the constant is nandoctor's op, not the script's
            factor = constant_factor(tensors)
        if factor is not None and abs(factor) >= _LARGE_LOSS_SCALE:
            self._loss_scale_noted = True
            self.events.emit("loss_scaled", factor=factor, step=self.step,
                             location=self.backward_call.as_dict() if self.backward_call else None)  # fmt: skip

    def _check_loss(self, tensors, defer: bool = False) -> None:
        """`defer`: a non-finite loss is kept until the next optimizer step (which updates on
        it: then it is the failure) or the script dies; a backward that comes first means the
        script skipped that update itself."""
        with self.quiet():
            for t in iter_tensors(tensors):
                if not is_checked(t):
                    continue
                if t.numel() == 1:
                    self._losses.append(float(t.detach()))
                if is_finite(t):
                    continue
                if not defer:
                    self._report(t, "loss", "the loss", t)
                elif self._pending_loss is None:
                    self._pending_loss = self._found(t, "loss", "the loss", t)

    @property
    def _steps_come_later(self) -> bool:
        """An optimizer takes the gradients at its step: a script with a guard of its own (a
        hand-written loss scaler, a "skip the bad batch" check) may skip it, and what it skips
        did not reach the weights. A script that updates by hand takes them right away; under
        torch.distributed the rank stops before its backward's all-reduce spreads the NaN."""
        return (
            bool(self._constructed) and not self.updates_by_hand and not process_group_initialized()
        )

    def _tensor_entered(self, source: str, result) -> None:
        # Recorded from the start, also before per-op checks switch on at step K-1 of a replay:
        # a dataset built from numpy before training holds the rows a late batch draws from.
        if self.paused:
            return
        with self.quiet():
            if self.detector is not None:
                self.detector.tensor_entered(source, result)
            elif self.rewind is not None:
                self._note_entered(source, result)

    def _note_entered(self, source: str, result) -> None:
        for t in iter_tensors(result):
            if is_checked(t) and not is_finite(t):
                with contextlib.suppress(TypeError):
                    self._entered_nonfinite.append(
                        (weakref.ref(t), source, find_user_frame(), self.step)
                    )

    def _optimizer_created(self, optimizer) -> None:
        """Where each optimizer was built and with which settings: the line to edit for an
        optimizer setting or a learning rate."""
        if getattr(optimizer, "_nandoctor_index", None) is not None:
            return  # a wrapper optimizer re-running __init__ on the same object
        optimizer._nandoctor_index = index = len(self._constructed)
        self._constructed.append(weakref.ref(optimizer))
        location = find_construction_frame(optimizer)
        # the line that built it: a sweep run may lower the rates built at one line only
        optimizer._nandoctor_site = (location.file, location.line) if location else None
        defaults = {k: _plain(v) for k, v in optimizer.defaults.items()
                    if k in _REPORTED_SETTINGS}  # fmt: skip
        self.events.emit(
            "optimizer",
            index=index,
            type=type(optimizer).__name__,
            settings=defaults,
            groups=len(optimizer.param_groups),
            location=location.as_dict() if location else None,
            own_step=_step_written_by_the_user(optimizer),
            # a group may carry an lr its defaults lack: the rate is what the groups hold
            has_rate=any(group.get("lr") is not None for group in optimizer.param_groups),
            lrs=[_as_float(group.get("lr")) for group in optimizer.param_groups],
        )

    def _compile_used(self) -> None:
        """Said once: the script compiles, where, and whether this run kept it compiled."""
        if self._compile_noted:
            return
        self._compile_noted = True
        where = find_user_frame()
        self.events.emit("compile_used", eager=self.runs_eagerly,
                         location=where.as_dict() if where else None)  # fmt: skip
        if self.runs_eagerly:
            self.events.emit("note", text=(
                "the script uses torch.compile: this run executed it eagerly (compile disabled) "
                "so that nandoctor's checks see every op; compiled kernels can compute "
                "differently"))  # fmt: skip

    def _autocast_entered(self, region) -> None:
        """Where the script enters each autocast region, said once per line: the line to edit
        for a precision cause made inside it."""
        if not getattr(region, "_enabled", True):
            return
        where = find_user_frame()
        key = (where.file, where.line) if where else None
        if key in self._autocast_lines:
            return
        self._autocast_lines.add(key)
        dtype = str(getattr(region, "fast_dtype", "")).removeprefix("torch.")
        self.events.emit("autocast", device=getattr(region, "device", None), dtype=dtype,
                         step=self.step, location=where.as_dict() if where else None,
                         in_script=called_from_user_code())  # fmt: skip

    def _grad_scaler_used(self, outputs) -> None:
        self.uses_grad_scaler = True
        self._stop_if_asked()
        self._check_loss(outputs)

    def _gradients_clipped(self, kind: str, tensors: list, limit, iterator: bool) -> None:
        """The script clipped gradients: said at its first call, and again the first time it
        clipped nothing — no tensors given (an iterator such as `model.parameters()` consumed by
        an earlier call), none with a gradient, or gradients an optimizer step already used.
        Clipping the script relies on that never acts is positive evidence for a gradient cause."""
        if self.paused:  # nandoctor's own clip (a remedy)
            return
        with_grad = sum(1 for t in tensors if isinstance(t, torch.Tensor) and t.grad is not None)
        problem = self._clip_problem(tensors, with_grad)
        if problem in self._clip_problems_said:
            return
        self._clip_problems_said.add(problem)
        where = find_user_frame()
        # after the step: the update it came too late for is the step just counted
        step = self.step - 1 if problem == "after_step" and self.step > 0 else self.step
        self.events.emit("gradient_clip", kind=kind, problem=problem, step=step,
                         limit=_as_float(limit), tensors=len(tensors), with_grad=with_grad,
                         iterator=iterator, location=where.as_dict() if where else None)  # fmt: skip

    def _clip_problem(self, tensors: list, with_grad: int) -> str | None:
        if not tensors:
            return "no_tensors"
        if not with_grad:
            return "no_gradients"
        return "after_step" if self._already_used(tensors) else None

    def _already_used(self, tensors: list) -> bool:
        """Some of `tensors` belong to an optimizer that stepped since the last backward pass:
        their gradients were consumed before this clip."""
        with self.quiet():
            stepped = {id(p) for optimizer in self._stepped_since_backward
                       for p in params_of(optimizer)}  # fmt: skip
        return any(id(t) in stepped for t in tensors)

    def _after_backward(self, tensors) -> None:
        # Scaled gradients may overflow on purpose; the scaler then skips the step, and the
        # optimizer hook checks the gradients of every step it does not skip.
        try:
            if not self.stopping and not self.uses_grad_scaler:
                # With an optimizer, a non-finite gradient matters once a step consumes it: a
                # hand-written loss scaler checks the gradients and skips the step itself, as
                # a GradScaler does. A script that updates by hand consumes them right away.
                self._check_grads(defer=self._steps_come_later)
        finally:
            self._in_backward = False
            self._closure_running = False  # what follows in step() is the update
            self._backward_leaves = []
            self._stepped_since_backward = []
        if self.updates_by_hand and not self.stopping:
            self._finish_step([])  # the learning rate lives in the script's own code

    def clip_gradients(self, params, max_norm: float) -> None:
        """Clip `params`' gradients for a clip experiment or a remedy. The norm recorded for
        the step stays the one before clipping, whichever hook runs first (a closure's
        backward, in Lightning or L-BFGS, may be clipped before the session's own check sees
        it). A clip before a closure runs acts on the last step's gradients: not recorded."""
        params = [p for p in params if p.grad is not None]
        if not params:
            return
        with self.quiet():
            if self._backward_since_step:
                grads = [p.grad for p in params if is_checked(p.grad)]
                self._norm_before_clip = _total_norm(grads)
            torch.nn.utils.clip_grad_norm_(params, max_norm)

    def _before_step(self, optimizer) -> None:
        self._stop_if_asked()
        self.uninitialized.stop()
        self._remember(optimizer)
        if self._clock is None or self._clock() is None:
            # The first optimizer that steps keeps the step count; when it is gone (a script
            # that builds a fresh optimizer each round), the next one that steps takes over.
            self._clock = weakref.ref(optimizer)
        if self._pending_loss is not None:
            # The script updates after a non-finite loss: it mattered, whether its gradients
            # came out finite or not (a ReLU's backward turns an inf into 0).
            self._announce(self._pending_loss)
        self._check_grads(optimizer)
        self._in_optimizer = True
        self._stepping = optimizer

    def _after_step(self, optimizer) -> None:
        with self.quiet():
            # torch's optimizers skip a parameter without a gradient (a frozen table handed to
            # Adam with the rest): what it holds, the step did not write
            params = [p for p in params_of(optimizer) if p.grad is not None]
            if (
                not math.isfinite(_total_norm(params))
                and (bad := _first_nonfinite(params)) is not None
            ):
                self._report(bad, "parameter", f"parameter {self._name(bad)}", bad)
        self._in_optimizer = False
        self._closure_running = False
        if optimizer not in self._stepped_since_backward:
            self._stepped_since_backward.append(optimizer)
        if self._clock is not None and self._clock() is optimizer:
            self._finish_step([_as_float(group.get("lr")) for group in optimizer.param_groups])

    @property
    def stepping_optimizer(self):
        """The optimizer whose step() is running, or None: a backward pass inside it is a
        closure's (`optimizer.step(closure)`: L-BFGS, Lightning), whose gradients the update
        uses, computed after the step's pre-hooks ran."""
        return self._stepping if self._in_optimizer else None

    @property
    def updates_by_hand(self) -> bool:
        """A script that never builds a torch.optim optimizer updates its parameters itself
        (`p.data.add_(p.grad, alpha=-lr)`): then one backward pass is one step."""
        return self.steps_by_backward and not self._constructed and self._clock is None

    def _finish_step(self, lrs: list[float | None]) -> None:
        losses, self._losses = self._losses, []
        loss = sum(losses) / len(losses) if losses else None
        self.events.emit("step", step=self.step, loss=loss, grad_norm=self._grad_norm, lr=lrs)
        self._norm_before_clip, self._backward_since_step = None, False
        self.step += 1
        self._forward_this_step = False
        self._activate_detector_at(self.step)
        if self.options.max_steps is not None and self.step >= self.options.max_steps:
            self.events.emit("budget_reached", budget="max_steps", steps=self.step)
            self.stopping = True
            raise StopRun("step budget reached")
        if self.rewind is not None:
            self.rewind.at_step_boundary(loss)  # a resumed re-run returns from here, reconfigured

    # ---- checks -----------------------------------------------------------------------------
    def _check_grads(self, optimizer=None, defer: bool = False) -> None:
        """Gradients found non-finite after backward count as backward's; `defer`: kept until
        a step consumes them (or the script dies) instead of reported now."""
        with self.quiet():
            params = params_of(optimizer) if optimizer else self.all_params()
            grads = [p.grad for p in params if p.grad is not None and is_checked(p.grad)]
            self._grad_norm = _total_norm(grads)
            if self._norm_before_clip is not None:
                # clipped by an experiment or a remedy: the step's norm is what it acted on
                self._grad_norm, self._norm_before_clip = self._norm_before_clip, None
            if optimizer is None:
                self._pending_grad = None
            if math.isfinite(self._grad_norm):
                return
            bad = _first_nonfinite(grads)
            if bad is None:  # finite gradients whose norm exceeds float32
                return
            reached = f"the gradient of {self._name(next(p for p in params if p.grad is bad))}"
            if defer:
                self._pending_grad = self._found(bad, "gradient", reached, bad, "backward")
                return
            made_by_backward = optimizer is None or self._pending_grad is not None
            self._report(bad, "gradient", reached, bad,
                         phase="backward" if made_by_backward else None)  # fmt: skip

    def _report(
        self, tensor: torch.Tensor, target: str, reached: str, bad: torch.Tensor, phase=None
    ) -> None:
        """A non-finite value reached a loss, gradient or parameter: say where it was born."""
        self._announce(self._found(tensor, target, reached, bad, phase))

    def _announce(self, found: dict) -> None:
        self.found_nonfinite = True
        self.on_nonfinite(found)

    def _announce_dying(self, found: dict) -> bool:
        """The script is dying: the event is written, nothing is stopped."""
        self.found_nonfinite = True
        self.events.emit("nonfinite", **found)
        return True

    def _found(
        self, tensor: torch.Tensor, target: str, reached: str, bad: torch.Tensor, phase=None
    ) -> dict:
        """The nonfinite event. `target`: what the value reached, as a stable word (loss,
        gradient, parameter, read); `reached`: the same for people ("the gradient of fc.weight").
        `phase`: where it was made when no birth was located, if not the current phase."""
        birth = None
        if self.detector is not None:
            birth = self.detector.root_birth(self.detector.taint_of(tensor))
        stepping = getattr(self._stepping, "_nandoctor_index", None) if self._in_optimizer else None
        return {
            "reached": reached,
            "target": target,
            "step": self.step,
            "phase": (phase or self.phase) if birth is None else birth.phase,
            "optimizer": stepping,
            "counts": count_nonfinite(bad).describe(),
            "birth": self._birth_event(birth) if birth else None,
            "backward_call": self.backward_call.as_dict() if self.backward_call else None,
        }  # fmt: skip

    def _birth_event(self, birth: Birth) -> dict:
        """The birth as the nonfinite event carries it, with where its mask wrote the -inf."""
        found = _birth_dict(birth)
        if (constant := self.detector.constant_parent(birth)) and constant.location:
            found["constant_at"] = constant.location.as_dict()  # where the mask wrote its -inf
        return found

    def _scalar_read(self, tensor: torch.Tensor, value) -> None:
        """The script read values out of a tensor: a number (`item()`, `float()`), or an array
        (`numpy()`, how a Trainer gathers its evaluation losses). A non-finite one is kept: if
        the script dies, or ends, before it trains on, that value is the failure it died of or
        ended with (a loss it printed and raised on, an evaluation loss computed after the
        last step)."""
        if self.paused:
            return
        if isinstance(value, float):
            bad = not math.isfinite(value)
        elif is_checked(tensor):
            with self.quiet():
                bad = not is_finite(tensor)
        else:
            return
        if bad:
            self._nonfinite_read = (tensor, find_user_frame())

    def _numpy_error(self, kind: str, where) -> None:
        """numpy made NaN/Inf at a user line (instrument/numpy_errors.py): kept, once per line,
        so a data cause can name the line that produced the values, not only where they
        entered torch. DataLoader workers inherit the callback; the event writer speaks only
        for this process."""
        key = (where.file, where.line) if where else None
        if key in self._numpy_lines or len(self._numpy_lines) >= 64:
            return
        self._numpy_lines.add(key)
        self.events.emit("numpy_error", error=kind, step=self.step,
                         location=where.as_dict() if where else None)  # fmt: skip

    def report_nonfinite_read(self, dying: bool = True) -> bool:
        """The script is dying (an exception, a non-zero exit), or ended (`dying=False`): when
        it last read a non-finite value and did not train on after it, that value is reported
        as the NaN/Inf the run failed with. A dying script's loss or gradients that no step
        took count too; at a normal end they may be a step a GradScaler skipped. At a normal
        end only a value computed without autograd counts: an evaluation's result, not a
        metric of the last training step (`exp(100 * loss).item()` overflowing is no failure)."""
        if self.found_nonfinite:
            return False
        pending = self._pending_loss or self._pending_grad  # died before a step took them
        if dying and pending is not None:
            return self._announce_dying(pending)
        if self._nonfinite_read is None:
            return False
        tensor, where = self._nonfinite_read
        if not dying and tensor.grad_fn is not None:
            return False  # computed with autograd: a training step's metric
        line = f" at line {where.line}" if where else ""
        with self.quiet():
            found = self._found(tensor, "read", f"a value the script read{line}", tensor)
        return self._announce_dying(found)

    def _stop_run(self, found: dict) -> None:
        """In a child run: tell the parent, and stop the script."""
        self.events.emit("nonfinite", **found)
        self.stopping = True
        raise StopRun(f"non-finite value reached {found['reached']}")

    def _stop_if_asked(self) -> None:
        if self.stopping:
            raise StopRun("nandoctor has what it needs")

    # ---- parameters -------------------------------------------------------------------------
    def adopt_optimizer(self, optimizer) -> None:
        """Watch this optimizer's parameters from now on (in-process `nandoctor.watch`)."""
        self._remember(optimizer)

    def _remember(self, optimizer) -> None:
        if not any(ref() is optimizer for ref in self._optimizers):
            self._optimizers.append(weakref.ref(optimizer))

    def all_params(self) -> list[torch.Tensor]:
        """Everything a gradient can reach: the parameters of every optimizer and model seen,
        and the bare leaves (`requires_grad=True` tensors) of the running backward pass."""
        seen: dict[int, torch.Tensor] = {}
        for ref in (*self._optimizers, *self._constructed):
            if (optimizer := ref()) is not None:
                seen.update((id(p), p) for p in params_of(optimizer))
        for root in self.modules.roots:
            seen.update((id(p), p) for p in root.parameters())
        seen.update((id(p), p) for p in self._backward_leaves)
        return list(seen.values())

    def _name(self, param: torch.Tensor) -> str:
        """`encoder.fc.weight` inside a model; the script's variable name for a bare tensor."""
        if id(param) not in self._param_names:
            for root in self.modules.roots:
                prefix = "" if any(True for _ in root.children()) else f"{type(root).__name__}."
                for name, p in root.named_parameters():
                    self._param_names.setdefault(id(p), prefix + name)
        if id(param) not in self._param_names:
            script_globals = vars(sys.modules.get("__main__", object()))
            for name, value in list(script_globals.items()):
                if value is param:
                    self._param_names[id(param)] = name
        return self._param_names.get(id(param), f"a {tuple(param.shape)} tensor")


_LARGE_LOSS_SCALE = 1e3  # a loss multiplied by this much before backward() is a scaled loss

_REPORTED_SETTINGS = ("lr", "eps", "betas", "momentum", "weight_decay", "nesterov", "alpha",
                      "foreach", "fused", "amsgrad", "maximize", "line_search_fn")  # fmt: skip


def _plain(value):
    if isinstance(value, torch.Tensor):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def _as_float(value) -> float | None:
    if value is None:
        return None
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


def _birth_dict(birth: Birth) -> dict:
    return {
        "step": birth.step,
        "phase": birth.phase,
        "op": birth.op,
        "module": birth.module,
        "location": birth.location.as_dict() if birth.location else None,
        "explanation": birth.explanation,
        "kind": birth.kind,
        "dtype": birth.dtype,
        "forward_op": birth.forward_op,
        "facts": dict(birth.facts),
        "nonfinite": birth.nonfinite,
        "has_nan": birth.has_nan,
        "constant": birth.constant,
        "backward_node": birth.backward_node,
        "inputs_nonfinite": birth.inputs_nonfinite,
        "received": birth.received,
        "notes": list(birth.notes),
        "bounded_at": birth.bounded_at,
    }


def _step_written_by_the_user(optimizer) -> bool:
    """The optimizer's `step()` is code of the script's own (an optimizer pasted into the
    project), not torch's or an installed package's: its lines are the ones to fix."""
    try:
        source = inspect.getsourcefile(inspect.unwrap(type(optimizer).step))
    except TypeError:
        return False
    return source is not None and not is_library_file(os.path.abspath(source))
