"""Find the line of user code where a sample's NaN/Inf is born, by fetching it again under a
line tracer.

DataLoader workers run `Dataset.__getitem__` out of sight, and numpy arithmetic never reaches
torch's dispatcher, so the watched run sees a bad sample only once it is a batch. Fetching that
one sample again in the main process under `sys.settrace` finds the first line of user code
after which a variable of its frame (or the value it returns) holds NaN/Inf, whatever made it:
torch, numpy or plain Python floats. The random-number states are restored afterwards, so the
script's own random stream is left as it was.
"""

from __future__ import annotations

import math
import os
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch

from nandoctor.instrument.frames import SourceLine, user_file
from nandoctor.instrument.tensors import NonfiniteCount, count_nonfinite, is_checked, is_finite
from nandoctor.source_values import container_reads

_MAX_ITEMS = 16  # items of a list/dict variable looked into


@dataclass(frozen=True)
class Origin:
    location: SourceLine
    variable: str  # the variable that turned non-finite, or "the returned value"
    counts: str  # "nan=16 of 16" where it can be counted
    kind: str  # what holds it: torch | numpy | python
    # The dataset attribute that line only reads the value from (`row = self.rows[i]`): the
    # values were made where that container was filled, before training.
    container: str | None = None


def trace_nonfinite_origin(fetch: Callable[[], object]) -> tuple[Origin | None, bool]:
    """Call `fetch()` under the tracer: (where a NaN/Inf first appeared or None, whether the
    fetched value held NaN/Inf at all). Exceptions of `fetch` count as not reproduced."""
    tracer = _Tracer()
    states = _random_states()
    previous = sys.gettrace()
    sys.settrace(tracer.on_call)
    try:
        value = fetch()
    except Exception:
        return None, False
    finally:
        sys.settrace(previous)
        _restore_random_states(states)
    return tracer.found, tracer.found is not None or holds_nonfinite(value, 0)


class _Tracer:
    def __init__(self) -> None:
        self.found: Origin | None = None

    def on_call(self, frame, event, arg):
        if self.found is not None or event != "call" or not user_file(frame.f_code):
            return None
        bad_at_entry = {name for name, value in frame.f_locals.items() if holds_nonfinite(value)}
        state = {"line": frame.f_lineno, "bad": bad_at_entry}

        def on_line(frame, event, arg):
            if self.found is not None:
                return None
            if event in ("line", "return"):
                self._check(frame, state, event, arg)
                state["line"] = frame.f_lineno
            return on_line

        return on_line

    def _check(self, frame, state: dict, event: str, arg) -> None:
        """Variables that turned non-finite were written by the line that ran last."""
        for name, value in frame.f_locals.items():
            if name not in state["bad"] and holds_nonfinite(value):
                where = _line(frame, state["line"])
                self.found = Origin(where, name, nonfinite_counts(value), _kind(value),
                                    _container_read(frame, where))  # fmt: skip
                return
        if event == "return" and holds_nonfinite(arg):
            where = _line(frame, frame.f_lineno)
            self.found = Origin(where, "the returned value", nonfinite_counts(arg), _kind(arg),
                                _container_read(frame, where))  # fmt: skip


def _container_read(frame, where: SourceLine) -> str | None:
    """The attribute of the frame's `self` that the line only reads the non-finite value from;
    of several read on one line, the one that holds NaN/Inf."""
    names = list(dict.fromkeys(container_reads(where.file, where.line)))
    if len(names) <= 1:
        return names[0] if names else None
    holder = frame.f_locals.get("self")
    bad = [name for name in names if holds_nonfinite(getattr(holder, name, None))]
    return bad[0] if len(bad) == 1 else None


def _line(frame, line: int) -> SourceLine:
    code = frame.f_code
    return SourceLine(os.path.abspath(code.co_filename), line, code.co_name)


def holds_nonfinite(value, depth: int = 0) -> bool:
    """NaN/Inf in a tensor, a numpy array or scalar, a float, or a small list/tuple/dict of them."""
    if isinstance(value, torch.Tensor):
        return is_checked(value) and not is_finite(value)
    if isinstance(value, float):
        return not math.isfinite(value)
    if type(value).__module__ == "numpy":
        return _numpy_nonfinite(value)
    if (values := _pandas_numbers(value)) is not None:
        return _numpy_nonfinite(values)
    if depth < 2 and isinstance(value, (list, tuple)):
        return any(holds_nonfinite(item, depth + 1) for item in value[:_MAX_ITEMS])
    if depth < 2 and isinstance(value, dict):
        items = list(value.values())[:_MAX_ITEMS]
        return any(holds_nonfinite(item, depth + 1) for item in items)
    return False


def _numpy_nonfinite(value) -> bool:
    import numpy

    kind = getattr(getattr(value, "dtype", None), "kind", "")
    if kind not in ("f", "c"):
        return False
    return not bool(numpy.isfinite(value).all())


def _pandas_numbers(value):
    """The numeric values of a pandas DataFrame or Series as one numpy array, else None."""
    if not type(value).__module__.startswith("pandas.") or type(value).__name__ not in (
        "DataFrame",
        "Series",
    ):
        return None
    if type(value).__name__ == "DataFrame":
        value = value.select_dtypes("number")
    elif value.dtype.kind not in ("f", "c"):
        return None
    return value.to_numpy(dtype=float, na_value=float("nan"))


def _kind(value) -> str:
    if isinstance(value, torch.Tensor):
        return "torch"
    return "numpy" if type(value).__module__ == "numpy" else "python"


def nonfinite_counts(value) -> str:
    if isinstance(value, torch.Tensor):
        return count_nonfinite(value).describe()
    if (values := _pandas_numbers(value)) is not None or (
        type(value).__module__ == "numpy" and hasattr(value, "size")
    ):
        import numpy

        array = numpy.asarray(value if values is None else values)
        return NonfiniteCount(
            int(numpy.isnan(array).sum()),
            int(numpy.isposinf(array).sum()) if array.dtype.kind == "f" else 0,
            int(numpy.isneginf(array).sum()) if array.dtype.kind == "f" else 0,
            int(array.size),
        ).describe()
    if isinstance(value, float):
        return NonfiniteCount(
            int(math.isnan(value)), int(value == math.inf), int(value == -math.inf), 1
        ).describe()
    return ""


def _random_states() -> dict:
    states = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        states["numpy"] = numpy.random.get_state()
    return states


def _restore_random_states(states: dict) -> None:
    random.setstate(states["python"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])
    if "numpy" in states:
        sys.modules["numpy"].random.set_state(states["numpy"])
