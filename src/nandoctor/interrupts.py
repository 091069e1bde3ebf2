"""Ctrl-C, SIGTERM and SIGHUP end a command the same way: every child run is stopped, scratch
folders are removed, the partial report is written, and the exit code names the signal.

SIGTERM is what Slurm, a CI cancel or `kill` send, SIGHUP what a closed terminal sends. Child
runs lead process groups of their own (so a DataLoader worker dies with its run), which also
keeps the terminal's signals from reaching them: nandoctor stops them itself.
"""

from __future__ import annotations

import signal
import threading

HANDLED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_requested = threading.Event()
_received: list[signal.Signals] = []


def install() -> None:
    """Route the handled signals through `_on_signal` (the CLI's process only: library code
    never changes signal handlers)."""
    for sig in HANDLED:
        signal.signal(sig, _on_signal)


def _on_signal(signum: int, frame) -> None:
    first = not _received
    _received.append(signal.Signals(signum))
    _requested.set()
    if first:
        # The same path as Ctrl-C: the running stage unwinds, `finally` blocks clean up. A
        # second signal while that is under way is noted and waits for it (it is bounded by
        # the kill grace of the child runs).
        raise KeyboardInterrupt


def stop_requested() -> bool:
    """True once a handled signal arrived: child runs in worker threads (sweep candidates,
    fix verifications) stop their processes when they see it."""
    return _requested.is_set()


def received() -> str | None:
    """The first signal that asked the command to stop (`SIGTERM`), or None."""
    return _received[0].name if _received else None


def exit_code() -> int:
    """128 + the signal's number, as shells report a process a signal ended: 130 for Ctrl-C
    (also when KeyboardInterrupt came without a signal), 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + int(_received[0] if _received else signal.SIGINT)
