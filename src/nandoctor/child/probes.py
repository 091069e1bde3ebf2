"""What every in-child probe of a stage shares."""

from __future__ import annotations

import functools


def safely(method):
    """A probe must never break the script: its first error is reported as a note naming the
    probe (`self.label`), calls `self.stop_looking()` if the probe has one, and switches it off
    (`self.broken`)."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self.broken:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            self.broken = True
            if stop := getattr(self, "stop_looking", None):
                stop()
            self.session.events.emit(
                "note", text=f"the {self.label} stopped looking: {type(error).__name__}: {error}"
            )
            return None

    return call
