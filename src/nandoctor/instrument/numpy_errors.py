"""Where numpy made NaN/Inf: its floating-point error callback, at the user's line.

Data usually goes bad before it reaches torch: a numpy standardization of a constant column
(0/0), a log of a zero count. numpy reports each such operation through `np.seterrcall` when
its error mode is "call"; the callback records the user's line and then warns as numpy's
default mode ("warn") would, so the script's own output is unchanged. Code that silences numpy
(`np.errstate(all="ignore")`, as pandas does) stays silent here too.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable

from nandoctor.instrument.frames import SourceLine, find_user_frame

_WATCHED = ("divide", "over", "invalid")  # underflow stays ignored, as by default


def watch_numpy_errors(on_error: Callable[[str, SourceLine | None], None]) -> None:
    """Call `on_error(kind, user_line)` for every numpy floating-point error ("invalid value",
    "divide by zero", "overflow") while the error modes are numpy's defaults."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        try:
            import numpy
        except ImportError:
            return
    current = numpy.geterr()
    if any(current[name] != "warn" for name in _WATCHED):
        return  # the script (or its environment) chose its own handling: leave it alone

    def called(kind: str, flag: int) -> None:
        where = find_user_frame()
        with contextlib.suppress(Exception):  # nandoctor's trouble must never reach the script
            on_error(kind, where)
        if where is not None:
            warnings.warn_explicit(f"{kind} encountered", RuntimeWarning, where.file, where.line)
        else:
            warnings.warn(f"{kind} encountered", RuntimeWarning, stacklevel=2)

    numpy.seterr(**{name: "call" for name in _WATCHED})
    numpy.seterrcall(called)
