"""Child -> parent events: one JSON object per line, flushed at once, so a crash loses nothing."""

from __future__ import annotations

import json
import os
import time


class EventWriter:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the run
        self._pid = os.getpid()

    def retarget(self, path: str) -> None:
        """From now on, write to `path` as this process: a run resumed from a rewind point
        speaks for itself, not for the run it was copied from."""
        self._file.close()
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._pid = os.getpid()

    def emit(self, kind: str, /, **fields) -> None:
        # DataLoader workers forked from the run inherit this object; only the run itself speaks.
        if os.getpid() != self._pid:
            return
        # `t` orders events of different processes (the ranks of a torchrun launch)
        record = {"event": kind, **fields, "t": round(time.time(), 4)}
        self._file.write(json.dumps(record, default=str) + "\n")
        self._file.flush()


def first_event(events: list[dict], *kinds: str) -> dict | None:
    """The first event of `events` whose kind is one of `kinds`."""
    return next((e for e in events if e["event"] in kinds), None)


def rank_events_path(path: str, rank: int) -> str:
    """Where rank `rank` of a multi-process launch writes the events of `path`."""
    stem, suffix = os.path.splitext(path)
    return f"{stem}.rank{rank}{suffix}"


def read_events(path: str, offset: int = 0) -> tuple[list[dict], int]:
    """Complete event lines of `path` from byte `offset` on, and the offset after them."""
    try:
        with open(path, "rb") as file:
            file.seek(offset)
            data = file.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a line still being written is read next time
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events, offset + end
