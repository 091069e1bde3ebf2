"""nandoctor inside your own code: `guard()` localizes the first NaN/Inf that matters, `watch()`
checks loss, gradients and parameters every step at almost no cost."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from nandoctor.errors import NonFiniteError
from nandoctor.report.model import FirstNonfinite


class _NoEvents:
    def emit(self, kind: str, **fields) -> None:
        """In-process use reports through exceptions, not through an event file."""


def describe(first: FirstNonfinite) -> str:
    """The message of NonFiniteError and of the pytest plugin's failures."""
    if first.op == "unknown":
        return (
            f"NaN/Inf reached {first.reached} at step {first.step}; run it under "
            "`nandoctor.guard()` or `nandoctor run` to see where it was born"
        )
    where = first.location.short() if first.location else "(no user line)"
    module = f", module {first.module}" if first.module else ""
    lines = [f"NaN/Inf born in {first.op} at {where} ({first.phase}, step {first.step}{module})"]
    if first.location and first.location.code:
        lines.append(f"    {first.location.code}")
    lines.append(f"why: {first.explanation}; it reached {first.reached}")
    return "\n".join(lines)


def _raise_nonfinite(found: dict) -> None:
    from nandoctor.stages.anomaly import first_nonfinite_from

    first = first_nonfinite_from(found)
    raise NonFiniteError(
        describe(first),
        op=first.op,
        module=first.module,
        phase=first.phase,
        step=first.step,
        location=first.location,
        explanation=first.explanation,
        reached=first.reached,
    )


def _session(detect: bool, model=None, optimizer=None):
    from nandoctor.child.options import ChildOptions
    from nandoctor.child.session import WatchSession

    options = ChildOptions(script="", args=[], events_path="", detect=detect)
    session = WatchSession(options, _NoEvents(), on_nonfinite=_raise_nonfinite,
                           steps_by_backward=False)  # fmt: skip
    if model is not None:
        session.modules.adopt(model)
    if optimizer is not None:
        session.adopt_optimizer(optimizer)
    return session


@contextlib.contextmanager
def guard() -> Iterator[None]:
    """Raise NonFiniteError at the first NaN/Inf that reaches a loss, a gradient or a
    parameter, naming the op where it was born, its module, your line and why.

        with nandoctor.guard():
            train_one_epoch(model, loader)

    Intermediate non-finite values that never reach them (attention masks) pass. Every op is
    checked while the guard is active, which costs about 1.2-1.5x per step.
    """
    session = _session(detect=True)
    session.install()
    try:
        yield
    finally:
        session.remove()


class Watch:
    """A cheap watch over a training loop: `close()` (or leave the `with`) to stop watching."""

    def __init__(self, session) -> None:
        self._session = session

    @property
    def steps(self) -> int:
        """Optimizer steps watched so far."""
        return self._session.step

    def close(self) -> None:
        self._session.remove()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def watch(model=None, optimizer=None) -> Watch:
    """Check the loss, the gradients and the parameters at every optimizer step (a few fused
    reductions, no per-op work) and raise NonFiniteError as soon as one is not finite.
    `model` names parameters in the message; `optimizer` is watched even before its first step.
    """
    session = _session(detect=False, model=model, optimizer=optimizer)
    session.install()
    return Watch(session)
