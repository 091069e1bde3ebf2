"""Where data's NaN/Inf were made before training, traced back through the script's own lines.

A Dataset that serves `self.x[i]`, or a `torch.from_numpy(x)` before the loop, only passes on
values made earlier: a `np.genfromtxt` that read empty CSV fields as NaN, a percent change of a
zero price. That earlier line is the one the user edits. The script is re-run from the start
under `sys.settrace` until training begins; for every frame of user code the tracer notes after
which line each variable (and each attribute of the frame's `self`) first holds NaN/Inf, which
variables arrived non-finite as arguments, and which calls returned NaN/Inf. From the line
where the values were seen (the sink), the walk goes upstream: to the latest line that made a
variable the sink's statement reads non-finite, into the call on that line that returned them,
or out to the caller whose argument brought them, until a line made NaN/Inf from finite inputs.

Only objects that are new to a variable, or that its line changes in place (`x[i] = v`,
`rows.append(r)`), are checked, so a line costs a dictionary walk, not a scan of every array.
"""

from __future__ import annotations

import itertools
import os
import sys
from dataclasses import dataclass, field

from nandoctor.instrument.frames import SourceLine, is_library_file
from nandoctor.instrument.origin import holds_nonfinite, nonfinite_counts
from nandoctor.source_values import line_dataflow

_MAX_HOPS = 64
_MAX_MADE = 100_000  # values noted; each costs a count of its NaN/Inf
_ENTRY, _RETURN = "<argument>", "<returned>"


@dataclass(frozen=True)
class Made:
    """Variable `name` of frame `frame` holds NaN/Inf after the statement at `location` (begun
    at `began`, seen at `seq`); `_ENTRY` for an argument, `_RETURN` for a returned value."""

    seq: int
    began: int
    frame: int
    location: SourceLine
    name: str
    counts: str
    classes: tuple[str, ...] = ()  # of `self`, for an attribute `self.<name>`


@dataclass
class _Frame:
    key: int
    line: int = 0
    began: int = 0  # the seq at which the current line began
    ids: dict[str, int] = field(default_factory=dict)  # what each variable was last checked at


class ProvenanceTracer:
    """Run code under it (`start()` ... `stop()`), then ask `trace_back(...)`."""

    def __init__(self) -> None:
        self.made: list[Made] = []
        self._counter = itertools.count(1)
        self._frames: dict[int, _Frame] = {}  # id(frame object) -> its record, while it runs
        self._stack: list[_Frame] = []
        self._keys = itertools.count(1)
        self._user: dict[str, str] = {}
        self._previous = None
        # frame key -> (the caller's key, the calling line, the seq at which that line began)
        self._callers: dict[int, tuple[int, SourceLine, int]] = {}

    # ---- recording -------------------------------------------------------------------------
    def start(self) -> None:
        self._previous = sys.gettrace()
        sys.settrace(self._on_call)

    def stop(self) -> None:
        sys.settrace(self._previous)

    def _user_file(self, code) -> str:
        name = code.co_filename
        known = self._user.get(name)
        if known is None:
            known = self._user[name] = "" if is_library_file(name) else os.path.abspath(name)
        return known

    def _on_call(self, frame, event, arg):
        if event != "call" or not self._user_file(frame.f_code):
            return None
        record = _Frame(next(self._keys))
        if self._stack and frame.f_back is not None and id(frame.f_back) in self._frames:
            parent = self._stack[-1]
            back = frame.f_back.f_code
            called_at = SourceLine(os.path.abspath(back.co_filename), parent.line, back.co_name)
            self._callers[record.key] = (parent.key, called_at, parent.began)
        record.line, record.began = self._statement(frame), next(self._counter)
        self._frames[id(frame)] = record
        self._stack.append(record)
        for name, value in self._values(frame):
            record.ids[name] = id(value)
            if holds_nonfinite(value):
                self._note(record, frame, frame.f_lineno, _ENTRY + name, value)
        return self._on_line

    def _on_line(self, frame, event, arg):
        record = self._frames.get(id(frame))
        if record is None:
            return None
        if event in ("line", "return"):
            self._check(record, frame)
        if event == "line" and (line := self._statement(frame)) != record.line:
            # the lines of one statement that spans several are one step (a call's arguments
            # written one per line); a loop runs its header between two runs of its body
            record.line, record.began = line, next(self._counter)
        elif event == "return":
            if holds_nonfinite(arg):
                self._note(record, frame, record.line, _RETURN, arg)
            self._frames.pop(id(frame), None)
            if self._stack and self._stack[-1] is record:
                self._stack.pop()
        return self._on_line

    def _statement(self, frame) -> int:
        """The first line of the statement the frame is at."""
        flow = line_dataflow(self._user_file(frame.f_code), frame.f_lineno)
        return flow.start if flow is not None else frame.f_lineno

    def _check(self, record: _Frame, frame) -> None:
        """The variables the line that just ran left holding NaN/Inf: those it bound to a new
        object, or changed in place."""
        flow = line_dataflow(self._user_file(frame.f_code), record.line)
        changed = flow.changes if flow is not None else frozenset()
        for name, value in self._values(frame):
            if record.ids.get(name) == id(value) and name not in changed:
                continue
            record.ids[name] = id(value)
            if holds_nonfinite(value):  # noted again when rebound: a filter may have changed them
                self._note(record, frame, record.line, name, value)

    def _values(self, frame):
        """The frame's variables, and the attributes of its `self` as `self.<name>` (not those
        of a torch module: its parameters are the model's, not the data's)."""
        values = frame.f_locals
        yield from list(values.items())
        owner = values.get("self")
        attributes = getattr(owner, "__dict__", None)
        if isinstance(attributes, dict) and "_parameters" not in attributes:
            for name, value in list(attributes.items()):
                yield f"self.{name}", value

    def _note(self, record: _Frame, frame, line: int, name: str, value) -> None:
        if len(self.made) >= _MAX_MADE:
            return  # a loop over rows that hold NaN: what came first is noted already
        code = frame.f_code
        owner = frame.f_locals.get("self")
        classes = tuple(c.__name__ for c in type(owner).__mro__) if name.startswith("self.") else ()
        where = SourceLine(os.path.abspath(code.co_filename), line, code.co_name)
        self.made.append(Made(next(self._counter), record.began, record.key, where, name,
                              nonfinite_counts(value), classes))  # fmt: skip

    # ---- tracing back ----------------------------------------------------------------------
    def first_attribute(self, classes: set[str], attribute: str) -> Made | None:
        """The first time `self.<attribute>` of an instance of one of `classes` held NaN/Inf."""
        name = f"self.{attribute}"
        return next((m for m in self.made if m.name == name and classes & set(m.classes)), None)

    def first_at(self, file: str, line: int) -> Made | None:
        """The first variable (or returned value) a statement at `line` of `file` left holding
        NaN/Inf."""
        return next((m for m in self.made if m.location.file == file
                     and _start(m.location) == _start(SourceLine(file, line, ""))
                     and not m.name.startswith(_ENTRY)), None)  # fmt: skip

    def trace_back(self, sink: Made, kinds: set[str] = frozenset()) -> list[Made]:
        """From `sink` upstream to the line that made NaN/Inf from finite values (last).
        `kinds`: what the values are where they were seen ("nan", "+inf", "-inf"), followed
        where a line mixes several variables that hold NaN/Inf."""
        chain = [sink]
        for _ in range(_MAX_HOPS):
            own = _kinds(chain[-1].counts)
            kinds = (own & kinds) or own or kinds  # the kinds that reach the sink
            upstream = self._upstream(chain[-1], kinds)
            if upstream is None:
                break
            chain.append(upstream)
        return chain

    def _upstream(self, made: Made, kinds: set[str]) -> Made | None:
        if made.name.startswith(_ENTRY):
            return self._argument_source(made)
        frame, line, began = made.frame, made.location.line, made.began
        flow = line_dataflow(made.location.file, line)
        reads = flow.reads if flow is not None else frozenset()
        read = [m for m in self.made if m.frame == frame and m.seq < began
                and _variable(m.name) in reads]  # fmt: skip
        returned = [m for m in self.made if m.name == _RETURN and began < m.seq <= made.seq
                    and self._called_during(m.frame, frame, began)]  # fmt: skip
        # What the line read comes before what its calls returned (they may only pass it on),
        # of the values alike to those followed: a column's +inf, not a NaN filtered out later.
        # Else what it read that it did not only write into (`out[1:] = x / y` keeps the NaN
        # `out` was filled with and makes the +inf): inf - inf gives NaN from Inf.
        changed = flow.changes if flow is not None else frozenset()
        inputs = [m for m in read if _variable(m.name) not in changed]
        for group in (_alike(read, kinds), _alike(returned, kinds), inputs, returned):
            if group:
                return max(group, key=lambda m: m.seq)
        return None

    def _argument_source(self, entry: Made) -> Made | None:
        """The call that passed NaN/Inf in, as a step of the chain: its line in the caller."""
        caller = self._callers.get(entry.frame)
        if caller is None:
            return None
        key, location, began = caller
        return Made(entry.seq, began, key, location, "<call>", entry.counts)

    def _called_during(self, frame_key: int, frame: int, began: int) -> bool:
        caller = self._callers.get(frame_key)
        return caller is not None and caller[0] == frame and caller[2] == began


def _alike(candidates: list[Made], kinds: set[str]) -> list[Made]:
    """Those of `candidates` that hold a kind of value among `kinds` ("nan", "+inf", "-inf");
    all of them when `kinds` is not known, or for a value whose kinds are not counted."""
    return [m for m in candidates if not kinds or not _kinds(m.counts) or kinds & _kinds(m.counts)]


def _kinds(counts: str) -> set[str]:
    """{"nan", "+inf", "-inf"} of a count such as "nan=2, +inf=1 of 300"."""
    return {kind for kind in ("nan", "+inf", "-inf") if f"{kind}=" in counts}


def _variable(name: str) -> str:
    return name[len(_ENTRY) :] if name.startswith(_ENTRY) else name


def _start(location: SourceLine) -> int:
    flow = line_dataflow(location.file, location.line)
    return flow.start if flow is not None else location.line
