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
Where no line of the script holds the values as they enter torch (a `TensorDataset` of the
script's arrays), the walk starts at the statement that built the Dataset (or DataLoader) the
first batch came from.

A clean-up the script already does is noted too: a statement that wrote into an array holding
NaN/Inf, or rebound a variable to its own values filtered, and left one kind of them
(`x[x != x] = 0` zeroes NaN and keeps -inf).

Only objects that are new to a variable, or that its line changes in place (`x[i] = v`,
`rows.append(r)`), are checked, so a line costs a dictionary walk, not a scan of every array.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from dataclasses import dataclass, field

import torch

from nandoctor.instrument.frames import SourceLine, user_file
from nandoctor.instrument.kinds import counted_kinds
from nandoctor.instrument.origin import holds_nonfinite, nonfinite_counts
from nandoctor.source_values import line_dataflow

_MAX_HOPS = 64
_MAX_MADE = 100_000  # values noted; each costs a count of its NaN/Inf
_MAX_BOUND = 1_000  # Datasets and DataLoaders noted
_SERVES_DATA = (torch.utils.data.Dataset, torch.utils.data.DataLoader)
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


@dataclass(frozen=True)
class Cleanup:
    """A statement that wrote into an array holding NaN/Inf and removed some kinds of them but
    kept others (`x[x != x] = 0` zeroes NaN and keeps -inf)."""

    location: SourceLine
    variable: str
    before: str  # counts, "nan=2, -inf=3 of 90"
    after: str
    address: int  # of the array's memory: a tensor made with `torch.from_numpy` shares it


@dataclass
class _Frame:
    key: int
    line: int = 0
    began: int = 0  # the seq at which the current line began
    ids: dict[str, int] = field(default_factory=dict)  # what each variable was last checked at
    writing: list = field(default_factory=list)  # (path, array, counts) the statement writes into


class ProvenanceTracer:
    """Run code under it (`start()` ... `stop()`), then ask `trace_back(...)`."""

    def __init__(self) -> None:
        self.made: list[Made] = []
        self._counter = itertools.count(1)
        self._frames: dict[int, _Frame] = {}  # id(frame object) -> its record, while it runs
        self._keys = itertools.count(1)
        self._previous = None
        self.cleanups: list[Cleanup] = []
        self._modules: dict[str, int] = {}  # file -> the key of its module-level frame
        self._bound: list[tuple[Made, weakref.ref]] = []  # Datasets and DataLoaders, where bound
        # frame key -> (the caller's key, the calling line, the seq at which that line began)
        self._callers: dict[int, tuple[int, SourceLine, int]] = {}

    # ---- recording -------------------------------------------------------------------------
    def start(self) -> None:
        self._previous = sys.gettrace()
        sys.settrace(self._on_call)

    def stop(self) -> None:
        sys.settrace(self._previous)

    def _on_call(self, frame, event, arg):
        if event != "call" or not user_file(frame.f_code):
            return None
        record = _Frame(next(self._keys))
        parent = self._frames.get(id(frame.f_back)) if frame.f_back is not None else None
        if parent is not None:
            back = frame.f_back.f_code
            called_at = SourceLine(user_file(back), parent.line, back.co_name)
            self._callers[record.key] = (parent.key, called_at, parent.began)
        record.line, record.began = self._statement(frame), next(self._counter)
        self._frames[id(frame)] = record
        if frame.f_code.co_name == "<module>":
            self._modules.setdefault(user_file(frame.f_code), record.key)
        for name, value in self._values(frame):
            record.ids[name] = id(value)
            if holds_nonfinite(value):
                self._note(record, frame, record.line, _ENTRY + name, value)
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
            self._finish_writes(record, frame)
            record.line, record.began = line, next(self._counter)
            self._begin_writes(record, frame)
        elif event == "return":
            self._finish_writes(record, frame)
            if holds_nonfinite(arg):
                self._note(record, frame, record.line, _RETURN, arg)
            self._frames.pop(id(frame), None)
        return self._on_line

    def _statement(self, frame) -> int:
        """The first line of the statement the frame is at."""
        return _statement_start(user_file(frame.f_code), frame.f_lineno)

    def _check(self, record: _Frame, frame) -> None:
        """The variables the line that just ran left holding NaN/Inf: those it bound to a new
        object, or changed in place."""
        flow = line_dataflow(user_file(frame.f_code), record.line)
        changed = flow.changes if flow is not None else frozenset()
        for name, value in self._values(frame):
            if record.ids.get(name) == id(value) and name not in changed:
                continue
            record.ids[name] = id(value)
            if holds_nonfinite(value):  # noted again when rebound: a filter may have changed them
                self._note(record, frame, record.line, name, value)
            elif isinstance(value, _SERVES_DATA) and len(self._bound) < _MAX_BOUND:
                # where a Dataset or DataLoader was built: a start of the walk when the values
                # the batch carried sit in a library Dataset's tensors (`TensorDataset(x, y)`)
                self._note(record, frame, record.line, name, value)
                self._bound.append((self.made[-1], weakref.ref(value)))

    def _begin_writes(self, record: _Frame, frame) -> None:
        """The arrays holding NaN/Inf that the statement about to run writes elements of."""
        flow = line_dataflow(user_file(frame.f_code), record.line)
        for path in flow.written if flow is not None else ():
            value = _resolved(frame.f_locals, path)
            if _address(value) is not None and holds_nonfinite(value):
                record.writing.append((path, value, nonfinite_counts(value)))

    def _finish_writes(self, record: _Frame, frame) -> None:
        """A write that removed one kind of NaN/Inf and kept another is a clean-up that missed
        it."""
        for path, value, before in record.writing:
            after = nonfinite_counts(value) if holds_nonfinite(value) else ""
            if after and counted_kinds(before) - counted_kinds(after):
                where = SourceLine(user_file(frame.f_code), record.line, frame.f_code.co_name)
                self.cleanups.append(Cleanup(where, ".".join(path), before, after, _address(value)))
        record.writing = []

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
        where = SourceLine(user_file(code), line, code.co_name)
        self.made.append(Made(next(self._counter), record.began, record.key, where, name,
                              nonfinite_counts(value), classes))  # fmt: skip

    # ---- tracing back ----------------------------------------------------------------------
    def first_attribute(self, classes: set[str], attribute: str) -> Made | None:
        """The first time `self.<attribute>` of an instance of one of `classes` held NaN/Inf."""
        name = f"self.{attribute}"
        return next((m for m in self.made if m.name == name and classes & set(m.classes)), None)

    def where_bound(self, dataset) -> Made | None:
        """The first statement that bound `dataset`, or a DataLoader or wrapper (`Subset`,
        `random_split`) that serves it, to a variable of the script."""
        for made, ref in self._bound:
            value = ref()
            if value is not None and _serves(value, dataset):
                return made
        return None

    def cleanup_of(self, dataset) -> Cleanup | None:
        """The last clean-up that missed a kind of NaN/Inf in an array `dataset` serves."""
        served = _addresses_in(dataset)
        return next((c for c in reversed(self.cleanups) if c.address in served), None)

    @staticmethod
    def filtered_in(chain: list[Made]) -> Cleanup | None:
        """A statement on the chain that rebound a variable to its own values with one kind of
        NaN/Inf removed and another kept (`t = t[~np.isnan(t).any(axis=1)]` keeps +inf rows)."""
        for down, up in itertools.pairwise(chain):
            removed = counted_kinds(up.counts) - counted_kinds(down.counts)
            if (down.frame == up.frame and down.name == up.name and counted_kinds(down.counts)
                    and removed and not down.name.startswith(("<", "self."))):  # fmt: skip
                return Cleanup(down.location, down.name, up.counts, down.counts, 0)
        return None

    def first_at(self, file: str, line: int) -> Made | None:
        """The first variable (or returned value) a statement at `line` of `file` left holding
        NaN/Inf."""
        start = _statement_start(file, line)  # notes are at a statement's first line
        return next((m for m in self.made if m.location.file == file
                     and m.location.line == start
                     and not m.name.startswith(_ENTRY)), None)  # fmt: skip

    def trace_back(self, sink: Made, kinds: set[str] = frozenset()) -> list[Made]:
        """From `sink` upstream to the line that made NaN/Inf from finite values (last).
        `kinds`: what the values are where they were seen ("nan", "+inf", "-inf"), followed
        where a line mixes several variables that hold NaN/Inf."""
        chain = [sink]
        for _ in range(_MAX_HOPS):
            own = counted_kinds(chain[-1].counts)
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
        # a name the function does not bind is a global of its module
        local = {_variable(m.name) for m in read}
        module = self._modules.get(made.location.file)
        read += [m for m in self.made if m.frame == module and m.seq < began
                 and m.name in reads and m.name not in local]  # fmt: skip
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
    return [
        m
        for m in candidates
        if not kinds or not counted_kinds(m.counts) or kinds & counted_kinds(m.counts)
    ]


def _resolved(values: dict, path: tuple[str, ...]):
    value = values.get(path[0])
    for name in path[1:]:
        value = getattr(value, name, None)
    return value


def _address(value) -> int | None:
    """Where the elements of a numpy array or tensor start in memory."""
    if isinstance(value, torch.Tensor):
        return (
            value.data_ptr()
            if value.layout == torch.strided and value.device.type != "meta"
            else None
        )
    interface = getattr(value, "__array_interface__", None)
    return interface["data"][0] if type(value).__module__ == "numpy" and interface else None


def _addresses_in(dataset, depth: int = 0) -> set[int]:
    """The memory of the arrays and tensors a Dataset holds: its attributes, the items of its
    lists and tuples (`TensorDataset.tensors`), and those of a dataset it wraps."""
    found: set[int] = set()
    for value in list(getattr(dataset, "__dict__", {}).values()):
        items = list(value[:16]) if isinstance(value, (list, tuple)) else [value]
        found.update(a for a in map(_address, items) if a is not None)
        if depth < 3 and isinstance(value, torch.utils.data.Dataset):
            found |= _addresses_in(value, depth + 1)
    return found


def _serves(value, dataset, depth: int = 0) -> bool:
    """`value` is `dataset`, or a DataLoader or dataset wrapper (`.dataset`) around it."""
    if value is dataset:
        return True
    inner = getattr(value, "dataset", None)
    return depth < 4 and inner is not None and _serves(inner, dataset, depth + 1)


def _variable(name: str) -> str:
    return name[len(_ENTRY) :] if name.startswith(_ENTRY) else name


def _statement_start(file: str, line: int) -> int:
    flow = line_dataflow(file, line)
    return flow.start if flow is not None else line
