"""Scale every optimizer's learning rate by one multiplier around each step (sweep runs), or
only the rates of the optimizers one line of the script built.

The global step pre-hook multiplies each param group's `lr` and the post-hook puts the original
object back, so the script's schedulers, warmup and per-group ratios see the unscaled values
and keep their shape. The post-hook is registered at the first step, after the session's own,
so the `step` events report the learning rate the update really used.

Also recorded, for the sweep's report: where each optimizer and scheduler was constructed (the
fix names that line), and with a GradScaler the unscaled loss, the scale and skipped steps.
Optionally clips the gradients before each update (the clip experiment), and ends the run when
the sweep asks for it through a stop file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

from nandoctor.instrument.detector import StopRun
from nandoctor.instrument.frames import find_user_frame
from nandoctor.instrument.tensors import params_of


def _lr_value(value) -> float | None:
    if value is None:
        return None
    return float(value.item()) if isinstance(value, torch.Tensor) else float(value)


class LrScaling:
    """Multiply-and-restore of every param group's learning rate, plus the sweep's records."""

    def __init__(
        self,
        session,
        multiplier: float = 1.0,
        clip: float | None = None,
        stop_file: str | None = None,
        only_site: tuple[str, int] | None = None,
    ) -> None:
        self.session = session
        self.multiplier = multiplier
        # (file, line): only optimizers built there are scaled (the session tags each one)
        self.only_site = tuple(only_site) if only_site else None
        self.clip = clip
        self.stop_file = stop_file
        # id(param group) -> its original lr object, while a step is under way. A wrapper
        # optimizer shares its inner optimizer's groups: a group already scaled is not scaled
        # again when the inner step's hook fires.
        self._scaled: dict[int, object] = {}
        self._steps: list[tuple[object, list[dict]]] = []  # (optimizer, groups it scaled)
        self._clipped: set[int] = set()
        self._post_handle = None
        self._stepped = False
        self._amp_losses: list[float] = []
        self._undo: list[Callable[[], None]] = []

    # ---- install / remove ---------------------------------------------------------------------
    def install(self) -> None:
        handle = register_optimizer_step_pre_hook(self._before_step)
        self._undo.append(handle.remove)
        if self.clip is not None:
            self.session.hooks.backward_calls(lambda tensors: None, self._after_backward)
        self._record_constructions()
        self._watch_grad_scaler()

    def remove(self) -> None:
        if self._post_handle is not None:
            self._post_handle.remove()
        while self._undo:
            with contextlib.suppress(Exception):
                self._undo.pop()()

    # ---- the multiplier -----------------------------------------------------------------------
    def _before_step(self, optimizer, args, kwargs) -> None:
        self._stop_if_asked()
        self._stepped = True
        if self._post_handle is None:
            # Registered now, after the session's post-hook, so that hook reads the scaled lr.
            self._post_handle = register_optimizer_step_post_hook(self._after_step)
        scaled = []
        for group in self._groups_to_scale(optimizer):
            if id(group) in self._scaled or "lr" not in group:
                continue
            self._scaled[id(group)] = group["lr"]  # the object itself: a Tensor lr is mutated
            group["lr"] = group["lr"] * self.multiplier  # in place by schedulers later on
            scaled.append(group)
        self._steps.append((optimizer, scaled))
        if self.clip is not None and id(optimizer) not in self._clipped:
            # A per-optimizer pre-hook runs after every global one: the session has recorded
            # the gradient norm before clipping by then.
            self._clipped.add(id(optimizer))
            optimizer.register_step_pre_hook(self._clip_gradients)

    def _groups_to_scale(self, optimizer) -> list[dict]:
        if (
            self.only_site is not None
            and getattr(optimizer, "_nandoctor_site", None) != self.only_site
        ):
            return []
        return optimizer.param_groups

    def _after_step(self, optimizer, args, kwargs) -> None:
        for index in range(len(self._steps) - 1, -1, -1):
            if self._steps[index][0] is optimizer:
                _, groups = self._steps.pop(index)
                for group in groups:
                    group["lr"] = self._scaled.pop(id(group))
                return

    def _clip_gradients(self, optimizer, args=(), kwargs=None) -> None:
        self.session.clip_gradients(params_of(optimizer), self.clip)

    def _after_backward(self, tensors) -> None:
        # A closure passed to optimizer.step(closure) (L-BFGS, Lightning) computes the
        # gradients after the step's pre-hook: they are clipped once its backward is done.
        optimizer = self.session.stepping_optimizer
        if optimizer is not None and id(optimizer) in self._clipped:
            self._clip_gradients(optimizer)

    def _stop_if_asked(self) -> None:
        if self.stop_file and os.path.exists(self.stop_file):
            self.session.events.emit("note", text="stopped by the sweep: no longer needed")
            self.session.stopping = True
            raise StopRun("the sweep no longer needs this run")

    # ---- records ------------------------------------------------------------------------------
    def _record_constructions(self) -> None:
        optimizer_class = torch.optim.Optimizer
        original_init = optimizer_class.__init__
        events = self.session.events

        def init(optimizer, *args, **kwargs):
            original_init(optimizer, *args, **kwargs)
            where = find_user_frame()
            events.emit(
                "lr_sweep_optimizer",
                class_name=type(optimizer).__name__,
                lrs=[_lr_value(g.get("lr")) for g in optimizer.param_groups],
                location=where.as_dict() if where else None,
            )

        optimizer_class.__init__ = init
        self._undo.append(lambda: setattr(optimizer_class, "__init__", original_init))

        # Not every scheduler calls LRScheduler.__init__ (SequentialLR, ReduceLROnPlateau do
        # not), but every one is created through __new__.
        scheduler_class = torch.optim.lr_scheduler.LRScheduler
        had_new = "__new__" in scheduler_class.__dict__
        original_new = scheduler_class.__new__

        def new(cls, *args, **kwargs):
            where = find_user_frame()
            events.emit("lr_sweep_scheduler", class_name=cls.__name__,
                        location=where.as_dict() if where else None)  # fmt: skip
            if original_new is object.__new__:
                return object.__new__(cls)
            return original_new(cls, *args, **kwargs)

        scheduler_class.__new__ = new

        def restore_new() -> None:
            if had_new:
                scheduler_class.__new__ = original_new
            else:
                del scheduler_class.__new__

        self._undo.append(restore_new)

    def _watch_grad_scaler(self) -> None:
        """With a GradScaler the loss given to backward is scaled: keep the unscaled one, the
        scale, and which steps the scaler skipped (it then never calls optimizer.step)."""
        scaler_class = torch.amp.GradScaler
        original_scale, original_step = scaler_class.scale, scaler_class.step

        def scale(scaler, outputs):
            if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
                with self.session.quiet():
                    self._amp_losses.append(float(outputs.detach()))
            return original_scale(scaler, outputs)

        def step(scaler, optimizer, *args, **kwargs):
            self._stepped = False
            result = original_step(scaler, optimizer, *args, **kwargs)
            if scaler.is_enabled():
                losses, self._amp_losses = self._amp_losses, []
                self.session.events.emit(
                    "lr_sweep_amp",
                    steps=self.session.step,
                    skipped=not self._stepped,
                    scale=float(scaler.get_scale()),
                    loss=sum(losses) / len(losses) if losses else None,
                )
            return result

        scaler_class.scale, scaler_class.step = scale, step
        self._undo.append(lambda: setattr(scaler_class, "scale", original_scale))
        self._undo.append(lambda: setattr(scaler_class, "step", original_step))
