"""The ranks of a torchrun launch: which one went wrong first, and what each of them saw.

Every rank writes its own events. A NaN/Inf born on one rank reaches the others through the
gradient all-reduce, in the same phase or later, so "first" orders by step, then by whether the
rank made the value or received it, then by phase within the step, then by the wall clock the
ranks share on one machine.
"""

from __future__ import annotations

from nandoctor.child.events import first_event

_PHASE_ORDER = {"data": 0, "forward": 1, "backward": 2, "optimizer": 3}
_FAILURES = ("script_error", "script_exit", "internal_error")


def _nonfinite_order(event: dict) -> tuple:
    """Earlier step first; within a step, a value made on this rank before one it received
    from another rank, then the earlier phase, then the clock."""
    received = bool((event.get("birth") or {}).get("received"))
    return (event["step"], received, _PHASE_ORDER.get(event.get("phase"), 9), event.get("t", 0.0))


def primary_rank(events_by_rank: dict[int, list[dict]]) -> int:
    """The rank whose run tells the story: the first to see a NaN/Inf, else the first to
    fail, else rank 0."""
    nonfinite = {rank: e for rank, events in events_by_rank.items()
                 if (e := first_event(events, "nonfinite"))}  # fmt: skip
    if nonfinite:
        return min(nonfinite, key=lambda rank: _nonfinite_order(nonfinite[rank]))
    failed = {rank: e for rank, events in events_by_rank.items()
              if (e := first_event(events, *_FAILURES))}  # fmt: skip
    if failed:
        return min(failed, key=lambda rank: failed[rank].get("t", 0.0))
    return min(events_by_rank, default=0)


def rank_summaries(events_by_rank: dict[int, list[dict]], primary: int) -> list[dict]:
    """One line of facts per rank, for the report."""
    summaries = [_summary(rank, events, rank == primary)
                 for rank, events in sorted(events_by_rank.items())]  # fmt: skip
    stops = {rank: e["t"] for rank, events in events_by_rank.items()
             if (e := first_event(events, "nonfinite")) and "t" in e}  # fmt: skip
    for summary in summaries:
        failed_at = summary.pop("failed_at", None)
        earlier = [r for r, t in stops.items() if r != summary["rank"] and failed_at
                   and t <= failed_at]  # fmt: skip
        if earlier:  # its collective lost a peer that nandoctor had stopped
            summary["after_rank_stopped"] = min(earlier, key=stops.get)
    return summaries


def _summary(rank: int, events: list[dict], primary: bool) -> dict:
    steps = [e for e in events if e["event"] == "step"]
    nonfinite = first_event(events, "nonfinite")
    failure = first_event(events, *_FAILURES)
    end = first_event(events, "end")
    summary = {
        "rank": rank,
        "first": primary,
        "steps_observed": len(steps),
        "last_loss": steps[-1].get("loss") if steps else None,
        "ended": end["outcome"] if end else ("did not start" if not events else "crashed"),
        # stopped by nandoctor: it was waiting on a rank nandoctor had stopped
        "left_behind": bool(end and end.get("left_behind")),
        "nonfinite": _nonfinite_summary(nonfinite) if nonfinite else None,
    }
    if failure is not None:
        summary["error"] = _failure_text(failure)
        summary["failed_at"] = failure.get("t")
    return summary


def _nonfinite_summary(event: dict) -> dict:
    birth = event.get("birth") or {}
    return {
        "step": event["step"],
        "phase": event.get("phase"),
        "reached": event.get("reached"),
        "received": bool(birth.get("received")),
        "op": birth.get("op"),
        "location": birth.get("location"),
    }


def _failure_text(event: dict) -> str:
    if event["event"] == "script_error":
        # a collective's error after a peer stopped runs to several lines: the first says it
        first_line = str(event.get("message", "")).strip().splitlines()[:1]
        return f"{event.get('type')}: {first_line[0] if first_line else ''}"[:200]
    if event["event"] == "script_exit":
        return f"exit code {event.get('code')}"
    return event.get("text", "internal error")


def describe_rank(summary: dict) -> str:
    """`rank 1: NaN/Inf in the loss at step 3 (forward)` and the like, for the report."""
    found = summary["nonfinite"]
    if found and found["received"]:
        text = f"received NaN/Inf from another rank at step {found['step']} ({found['phase']})"
    elif found:
        text = f"NaN/Inf reached {found['reached']} at step {found['step']} ({found['phase']})"
    elif "after_rank_stopped" in summary:
        text = (f"stopped after {_steps(summary)}: it lost rank "
                f"{summary['after_rank_stopped']}, which nandoctor had stopped at its NaN/Inf "
                f"({_shortened(summary['error'])})")  # fmt: skip
    elif "error" in summary:
        text = f"failed after {_steps(summary)}: {_shortened(summary['error'])}"
    elif summary["left_behind"]:
        text = (f"stopped by nandoctor after {_steps(summary)}, waiting on a "
                "rank that had stopped")  # fmt: skip
    else:
        text = f"no NaN/Inf in {_steps(summary)} ({summary['ended']})"
    return f"rank {summary['rank']}: {text}"


def _shortened(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def _steps(summary: dict) -> str:
    count = summary["steps_observed"]
    return f"{count} step{'s' if count != 1 else ''}"
