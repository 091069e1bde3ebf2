"""The line that made the data's NaN/Inf, when the batch only carried values made before training.

A Dataset that serves `self.x[i]`, or a tensor converted with `torch.from_numpy` before the
loop, shows where bad values entered torch, not where they were made. When such a finding
explains the failure, the script runs once more from the start under the provenance tracer
(instrument/provenance.py) until training begins, and the finding moves to the line that made
NaN/Inf from finite values (a parse, a load, a percent change), the lines the values passed
through staying as evidence.
"""

from __future__ import annotations

import dataclasses
import os

from nandoctor.instrument.kinds import counted_kinds
from nandoctor.report.model import Finding, Location
from nandoctor.source_values import enclosing_class, writes_nonfinite_constant
from nandoctor.stages import StageContext

EVENT = "data_made"
REQUEST = "data_provenance"  # the key of ChildOptions.extra that asks for the trace
_RUN = "provenance"
_SHOWN_HOPS = 4  # lines the values passed through, shown as evidence


# ---- in the re-run ---------------------------------------------------------------------------
def install(session, request: dict) -> None:
    """Trace the script from its start until the first batch is fetched or the model first
    runs, then say where the requested values were made and stop the run."""
    from nandoctor.instrument.loaders import watch_loader_batches
    from nandoctor.instrument.provenance import ProvenanceTracer

    tracer = ProvenanceTracer()
    answered = False
    served: list = []  # the dataset of the first batch

    def training_begins(*_) -> None:
        nonlocal answered
        if answered:
            return
        answered = True
        tracer.stop()
        session.stopping = True  # stops the script at its next step boundary
        try:
            chain = _chain(tracer, request, served)
            steps, cleanup = [_step(m) for m in chain], _cleanup(tracer, chain, served)
        except Exception as error:  # the tracer's trouble leaves the finding as it was
            session.events.emit("note", text=f"the data provenance tracer stopped: "
                                             f"{type(error).__name__}: {error}")  # fmt: skip
            return
        session.events.emit(EVENT, chain=steps, cleanup=cleanup)

    def first_batch(loaded) -> None:
        if not served:
            served.append(loaded.dataset)
        training_begins()

    session.hooks.add_undo(watch_loader_batches(first_batch))
    session.on_batch.append(training_begins)
    session.modules.on_root_forward.append(training_begins)
    session.hooks.add_undo(tracer.stop)
    tracer.start()


def _chain(tracer, request: dict, served: list) -> list:
    """From where the values were seen back to where they were made: the dataset attribute or
    line the request names, else the statement that built the dataset the first batch came
    from (a `TensorDataset` of the script's arrays)."""
    sink = None
    if "attribute" in request:
        sink = tracer.first_attribute(set(request["classes"]), request["attribute"])
    elif "line" in request:
        sink = tracer.first_at(request["file"], request["line"])
    if sink is None and served:
        sink = tracer.where_bound(served[0])
    return [] if sink is None else tracer.trace_back(sink, set(request.get("kinds", ())))


def _cleanup(tracer, chain: list, served: list) -> dict | None:
    """A clean-up on the values' way that removed one kind of NaN/Inf and kept another: written
    into an array the dataset serves, or a filter on the chain."""
    found = (tracer.cleanup_of(served[0]) if served else None) or tracer.filtered_in(chain)
    if found is None:
        return None
    return {"location": found.location.as_dict(), "variable": found.variable,
            "before": found.before, "after": found.after}  # fmt: skip


def _step(made) -> dict:
    return {"location": made.location.as_dict(), "variable": made.name,
            "counts": made.counts}  # fmt: skip


# ---- in nandoctor ----------------------------------------------------------------------------
def request_for(finding: Finding, origin: dict | None, script: str) -> dict | None:
    """What to trace back for a data finding that explains the failure: the dataset attribute
    its line only read, or the line of the script where the values entered torch. None when
    the line that made them is already known (computed in `__getitem__`)."""
    if finding.severity != "error" or finding.location is None:
        return None
    if origin is not None and origin.get("container"):
        where = origin["location"]
        owner = enclosing_class(where["file"], where["line"])
        if owner is None:
            return None
        return {"attribute": origin["container"], "classes": [owner]}
    if origin is not None or os.path.abspath(finding.location.file) != os.path.abspath(script):
        return None
    return {"file": finding.location.file, "line": finding.location.line}


def traced_to_where_made(context: StageContext, finding: Finding, request: dict) -> Finding:
    """`finding` moved to the line that made its values, when the traced re-run finds one that
    is not the line already shown."""
    from nandoctor.runner import rerun_options, rerun_timeout_s, run_child

    context.progress("tracing the data's NaN/Inf back to the line that made them")
    options = rerun_options(context.target, context.config, context.workdir, _RUN,
                            max_steps=1, probes=["data_scan"], extra={REQUEST: request})  # fmt: skip
    watch = context.watch
    run = run_child(options, context.workdir, name=_RUN,
                    timeout_s=rerun_timeout_s(context.config, watch, len(watch.steps)))  # fmt: skip
    answer = run.first(EVENT) or {}
    if answer.get("cleanup"):
        return _at_the_cleanup(finding, answer["cleanup"])
    chain = _trimmed(answer.get("chain") or [])
    if len(chain) < 2:
        return finding
    made = Location.from_dict(chain[-1]["location"])
    if made is None or made == finding.location:
        return finding
    if writes_nonfinite_constant(made.file, made.line):
        # NaN written on purpose marks missing values (`x[gaps] = np.nan`, `np.full(n, np.nan)`
        # filled where there is data): what went wrong is that nothing dropped them later, so
        # the line where they entered training stays the one shown
        marked = (f"the NaN/Inf were written on purpose at {made.short()} (`{made.code}`), as "
                  "missing values, and nothing dropped them before training")  # fmt: skip
        return dataclasses.replace(finding, evidence=(marked, *finding.evidence))
    evidence = (_describe(chain), *finding.evidence)
    fix = (f"repair the values where they are made (line {made.line}: `{made.code}`): drop or "
           "impute the NaN/Inf rows there, before training")  # fmt: skip
    return dataclasses.replace(finding, location=made, evidence=evidence, fix=fix)


def _at_the_cleanup(finding: Finding, cleanup: dict) -> Finding:
    """The script already cleans these values, and its clean-up let one kind through: that line
    is what to complete (a NaN test, `x != x` or `np.isnan`, that `np.isfinite` would make
    whole)."""
    where = Location.from_dict(cleanup["location"])
    evidence = (f"the script re-run from its start under a line tracer: line {where.short()} "
                f"(`{where.code}`) cleans `{cleanup['variable']}` of some NaN/Inf but not all: "
                f"{cleanup['before']} before it, {cleanup['after']} after")  # fmt: skip
    missed = ", ".join(sorted(counted_kinds(cleanup["after"])))
    fix = (f"make the clean-up at line {where.line} (`{where.code}`) catch every non-finite "
           f"value, {missed} included: test with `np.isfinite` / `torch.isfinite`")  # fmt: skip
    return dataclasses.replace(finding, location=where, evidence=(evidence, *finding.evidence),
                               fix=fix)  # fmt: skip


def _trimmed(chain: list[dict]) -> list[dict]:
    """A chain that ends in an argument whose caller was library code (a framework calling the
    script's hook) ends at the line before: the last line of the script that held them. One
    that ends inside a comprehension ends at the statement that holds it, in its function."""
    if chain and chain[-1]["variable"].startswith("<argument>"):
        chain = chain[:-1]
    if len(chain) >= 2 and _comprehension(chain[-1]) and _same_line(chain[-1], chain[-2]):
        chain = chain[:-1]
    return chain


def _comprehension(made: dict) -> bool:
    return made["location"]["function"] in ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>")


def _same_line(a: dict, b: dict) -> bool:
    return all(a["location"][key] == b["location"][key] for key in ("file", "line"))


def _describe(chain: list[dict]) -> str:
    made, *passed = reversed(chain)
    where = Location.from_dict(made["location"])
    text = (f"the script re-run from its start under a line tracer: {_variable(made)} first "
            f"holds {made['counts'] or 'NaN/Inf'} after line {where.short()} in "
            f"{where.function}, and nothing that line read held any")  # fmt: skip
    lines = [line for line in dict.fromkeys(_line_of(m, where.file) for m in passed)
             if line != str(where.line)]  # fmt: skip
    if lines:
        shown = ", ".join(lines[:_SHOWN_HOPS]) + (", ..." if len(lines) > _SHOWN_HOPS else "")
        text += f"; they then passed through line{'s' if len(lines) > 1 else ''} {shown}"
    return text


def _line_of(made: dict, file: str) -> str:
    where = Location.from_dict(made["location"])
    return str(where.line) if where.file == file else where.short()


def _variable(made: dict) -> str:
    name = made["variable"]
    if name == "<returned>":
        return "the value it returns"
    if name == "<call>":
        return "an argument of the call"
    return f"`{name.removeprefix('<argument>')}`"
