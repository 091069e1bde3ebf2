"""The data scan's findings, built from the events of its probe (plain data, no torch)."""

from __future__ import annotations

import io
import tokenize

from nandoctor.fixes import guard_for, guard_remedy, guarded_line
from nandoctor.instrument.precision import overflowed_reduced_precision
from nandoctor.report.model import Finding, Location
from nandoctor.source_values import WrittenAt, container_origin

NAME = "data_scan"

# Above the anomaly stage's 0.85 for "non-finite values come from the data": this stage names
# the sample and, where it can, the line that made it.
_CONFIDENCE_LOCATED = 0.95
_CONFIDENCE_UNLOCATED = 0.9
_CONFIDENCE_NOT_CAUSE = 0.5


# ---- NaN/Inf in batches -----------------------------------------------------------------------
def _bad_leaves(batches: list[dict]) -> list[tuple[dict, dict]]:
    return [(event, leaf) for event in batches for leaf in event["leaves"] if leaf.get("bad_at")]


def located_origin(watch) -> dict | None:
    """The first bad sample's refetch that found the line of `__getitem__` that made it."""
    return next((o for o in watch.all("data_origin") if o.get("location")), None)


def first_bad_kinds(batches: list[dict]) -> list[str]:
    """Which of "nan", "+inf", "-inf" the first batch tensor with NaN/Inf holds."""
    bad = _bad_leaves(batches)
    leaf = bad[0][1] if bad else {}
    return [kind for key, kind in (("nan", "nan"), ("posinf", "+inf"), ("neginf", "-inf"))
            if leaf.get(key)]  # fmt: skip


def nonfinite_finding(watch, batches: list[dict]) -> Finding | None:
    bad = _bad_leaves(batches)
    if not bad:
        return None
    event, leaf = bad[0]
    sample = leaf["bad_at"][0]
    dataset_at = [i for i in leaf.get("dataset_at", []) if i is not None]
    origin = located_origin(watch)
    tried = watch.first("data_origin")
    explains = _explains_failure(watch.nonfinite, event["step"])
    kinds = _kinds(leaf)
    title = f"{kinds} in the training data: {leaf['path']} sample {sample} at step {event['step']}"
    if dataset_at:
        title += f" (dataset index {dataset_at[0]})"
    evidence = [_describe_bad_leaf(event, leaf)]
    if dataset_at:
        evidence.append(f"dataset indices of those samples: {listed(dataset_at)}")
    steps = sorted({e["step"] for e, _ in bad})
    evidence.append(
        f"{len({id(e) for e, _ in bad})} of {len(batches)} scanned batches held NaN/Inf "
        f"(steps {listed(steps)})"
    )
    if tried is not None:
        evidence.append(_describe_origin(tried))
    filled = _where_filled(origin)
    if filled is not None:
        evidence.append(_describe_filled(origin, filled))
    if source := leaf.get("script_tensor"):
        evidence.append(
            f"the script's tensor `{source['name']}` {tuple(source['shape'])} holds NaN/Inf in "
            f"{source['bad_rows']} row{'s' if source['bad_rows'] != 1 else ''} "
            f"(rows {listed(source['rows'])})"
        )
    if explains:
        nonfinite = watch.nonfinite
        when = (
            "the step of this batch"
            if nonfinite["step"] == event["step"]
            else f"after this batch (step {event['step']})"
        )
        evidence.append(
            f"the run's first NaN/Inf reached {nonfinite['reached']} at step "
            f"{nonfinite['step']}, {when}"
        )
    elif _made_by_reduced_precision((watch.nonfinite or {}).get("birth")):
        birth = watch.nonfinite["birth"]
        evidence.append(
            f"these values were made by the script's {birth.get('op')} overflowing "
            f"{birth.get('dtype')} at step {watch.nonfinite['step']}, from finite inputs: "
            "the data carried none"
        )
    else:
        evidence.append(
            "the run's NaN/Inf did not come from this batch: its values are masked or unused"
            if watch.nonfinite is not None
            else "the run stayed finite: these values are masked or unused"
        )
    located = bool(dataset_at or origin or leaf.get("script_tensor"))
    confidence = _CONFIDENCE_LOCATED if located else _CONFIDENCE_UNLOCATED
    return Finding(
        stage=NAME,
        category="data",
        title=title,
        confidence=confidence if explains else _CONFIDENCE_NOT_CAUSE,
        evidence=tuple(evidence),
        fix=_nonfinite_fix(origin, leaf, dataset_at, filled),
        location=_data_location(origin, watch.nonfinite, event, filled),
        severity=_severity(explains, watch.nonfinite),
        remedy=_remedy(origin) if explains else None,
        code="DA201",
    )


def _remedy(origin: dict | None) -> dict:
    """What a re-run applies to verify the fix: the guarded division at the line that made the
    value (a torch op, so the guard can reach it), else NaN/Inf in the batches replaced by 0."""
    if origin is not None and origin.get("value_kind") == "torch":
        where = origin["location"]
        if "/" in _without_comment(where.get("code") or ""):
            return guard_remedy(
                "div", guard_for("div"), where["file"], where["line"], where.get("code")
            )
    return {"kind": "sanitize_inputs"}


def _severity(explains: bool, nonfinite: dict | None) -> str:
    """NaN/Inf that never reached a loss, gradient or parameter is often deliberate (missing
    values masked in the loss, -inf attention masks): a hint while the run stays finite."""
    if explains:
        return "error"
    return "warning" if nonfinite is not None else "hint"


def _explains_failure(nonfinite: dict | None, step: int) -> bool:
    """The run failed at or after the bad batch, and nothing blames an op on finite inputs."""
    if nonfinite is None or nonfinite["step"] < step:
        return False
    birth = nonfinite.get("birth")
    if birth is None or birth.get("inputs_nonfinite"):
        return True
    # Before the forward, an op that overflowed float16 or bfloat16 made the values from finite
    # ones (`height * width` computed in half precision): the data carried nothing non-finite.
    # A 0/0 or log(0) of a silent clip or an empty row is the data's own.
    return birth.get("phase") == "data" and not _made_by_reduced_precision(birth)


def _made_by_reduced_precision(birth: dict | None) -> bool:
    return birth is not None and overflowed_reduced_precision(birth.get("kind"), birth.get("dtype"))


def _kinds(leaf: dict) -> str:
    has_nan, has_inf = leaf.get("nan", 0) > 0, leaf.get("posinf", 0) + leaf.get("neginf", 0) > 0
    return "NaN and Inf" if has_nan and has_inf else "NaN" if has_nan else "Inf"


def _describe_bad_leaf(event: dict, leaf: dict) -> str:
    counts = ", ".join(
        f"{label}={leaf[key]}"
        for key, label in (("nan", "nan"), ("posinf", "+inf"), ("neginf", "-inf"))
        if leaf.get(key)
    )
    source = (
        "a DataLoader batch"
        if event["source"] == "loader"
        else (f"an input of {event.get('module') or 'the model'}")
    )
    text = (
        f"step {event['step']}, {source}: {leaf['path']} {tuple(leaf['shape'])} holds {counts} "
        f"in {leaf['bad_samples']} of {leaf['samples']} samples (samples {listed(leaf['bad_at'])}"
    )
    if leaf.get("bad_features"):
        text += f"; feature/channel {listed(leaf['bad_features'])} (dim 1)"
    return text + f"; first at index {tuple(leaf['first_bad'])})"


def _describe_origin(origin: dict) -> str:
    fetched = f"fetching dataset index {origin['dataset_index']} again in the main process"
    if origin.get("location"):
        where = Location.from_dict(origin["location"])
        return (
            f"{fetched}: `{origin['variable']}` holds {origin['counts'] or 'NaN/Inf'} after line "
            f"{where.short()} in {where.function}"
        )
    if origin.get("reproduced"):
        return f"{fetched} gave NaN/Inf again, made outside the dataset's own code"
    return f"{fetched} gave finite values (random augmentation, or state outside the dataset)"


def _where_filled(origin: dict | None) -> WrittenAt | None:
    """Where the dataset's container that the origin line only reads from was filled."""
    if origin is None or not origin.get("container"):
        return None
    return container_origin(origin["location"]["file"], origin["location"]["line"],
                            origin["container"])  # fmt: skip


def _describe_filled(origin: dict, filled: WrittenAt) -> str:
    read = Location.from_dict(origin["location"])
    return (f"line {read.line} only reads `self.{origin['container']}`, whose values were "
            f"made before training, at line {filled.line}: `{filled.code}`")  # fmt: skip


def _data_location(
    origin: dict | None, nonfinite: dict | None, event: dict, filled: WrittenAt | None = None
) -> Location | None:
    """Where the dataset's container was filled, when the line that made the value only read
    it; else the line that made the value; else where the run saw it born in the data; else the
    line that fetched or fed the batch."""
    if filled is not None:
        return Location(origin["location"]["file"], filled.line, None, filled.code)
    if origin is not None:
        return Location.from_dict(origin["location"])
    birth = (nonfinite or {}).get("birth") or {}
    if birth.get("phase") == "data" and birth.get("location"):
        return Location.from_dict(birth["location"])
    return Location.from_dict(event.get("location"))


def _nonfinite_fix(
    origin: dict | None, leaf: dict, dataset_at: list[int], filled: WrittenAt | None = None
) -> str:
    if filled is not None:
        return (f"repair the values where `self.{origin['container']}` is filled from (line "
                f"{filled.line}: `{filled.code}`): drop or impute the NaN/Inf rows there, before "
                "the Dataset serves them")  # fmt: skip
    if origin is not None:
        where = Location.from_dict(origin["location"])
        code = _without_comment(where.code or "")
        rewritten = guarded_line(code, "div", guard_for("div")) if "/" in code else None
        if rewritten:
            return (
                f"`{rewritten}` - guard the division in {where.function} ({where.short()}): it "
                "divides by zero for some samples"
            )
        return f"repair the computation at {where.short()} in {where.function}, which makes NaN/Inf"
    if source := leaf.get("script_tensor"):
        name = source["name"]
        return (
            f"drop or repair rows {listed(source['rows'])} of `{name}` (and the matching "
            f"targets) before training: `keep = torch.isfinite({name}).flatten(1).all(dim=1)`, "
            "or impute them (`torch.nan_to_num`, column means)"
        )
    if dataset_at:
        return (
            f"drop or repair dataset samples {listed(dataset_at)} (and any like them) before "
            "training, e.g. keep rows where `torch.isfinite(x).all(dim=1)`, or impute with "
            "`torch.nan_to_num`"
        )
    return "drop or repair the non-finite samples before training (`torch.isfinite`, `torch.nan_to_num`)"


# ---- class targets ----------------------------------------------------------------------------
def target_findings(watch, targets: list[dict]) -> list[Finding]:
    findings = []
    outside = [t for t in targets if t["out_of_range"]]
    if outside:
        findings.append(_out_of_range_finding(watch, outside))
    empty = [t for t in targets if t["all_ignored"] and t["reduction"] == "mean"]
    if empty:
        first = empty[0]
        findings.append(
            Finding(
                stage=NAME,
                category="data",
                title=f"every target of a batch equals ignore_index ({first['ignore_index']}): "
                f"the mean {first['loss']} over no targets is NaN",
                confidence=0.9 if watch.nonfinite is not None else 0.6,
                evidence=(
                    f"step {first['step']}: all {first['targets']} targets of F.{first['loss']} "
                    f"equal ignore_index={first['ignore_index']}",
                    f"{len(empty)} loss calls had no target left",
                ),
                fix="skip batches without a labelled target (`if (y != ignore_index).any():`), "
                "or sum the loss and divide by `max(count, 1)`",
                location=Location.from_dict(first.get("location")),
                severity="error" if watch.nonfinite is not None else "warning",
                code="DA202",
            )
        )
    return findings


def _out_of_range_finding(watch, outside: list[dict]) -> Finding:
    first = outside[0]
    classes, ignore = first["classes"], first["ignore_index"]
    values = sorted({v for t in outside for v in t.get("bad_values", [])})
    evidence = [
        f"step {first['step']}: {first['out_of_range']} of {first['targets']} targets of "
        f"F.{first['loss']} are outside [0, {classes}) (C = {classes} from the input's class "
        f"dim; {first['ignored']} equal to ignore_index={ignore} left out)",
        f"targets range {first['min']}..{first['max']}; bad values {listed(values)}",
        f"samples {listed(first['bad_at'])} of that batch"
        + (f" ({first['path']})" if first.get("path") else ""),
    ]
    dataset_at = [i for i in first.get("dataset_at", []) if i is not None]
    if dataset_at:
        evidence.append(f"dataset indices of those samples: {listed(dataset_at)}")
    evidence.append(f"{len(outside)} loss calls received targets outside [0, {classes})")
    if error := watch.first("script_error"):
        evidence.append(f"the script then failed: {error['type']}: {error['message']}")
    return Finding(
        stage=NAME,
        category="data",
        title=f"class targets outside [0, {classes}) in {first['loss']}: {listed(values)}",
        confidence=0.95,
        evidence=tuple(evidence),
        fix=f"targets must be class indices in [0, {classes}): remap the labels (1-based labels: "
        f"`y - 1`), give the model {max(classes, (first['max'] or 0) + 1)} outputs, or mark "
        f"unlabelled samples with ignore_index={ignore}",
        location=Location.from_dict(first.get("location")),
        code="DA203",
    )


# ---- magnitudes and constant samples ----------------------------------------------------------
def magnitude_finding(batches: list[dict], settings, failed: bool, tensors: dict) -> Finding | None:
    """Values far above unit scale: |x| above the magnitude threshold anywhere, or, in a run
    that failed, floating tensors whose RMS is above the scale threshold. Those get a remedy
    that standardizes them, so the re-run says whether their scale is what failed."""
    large = _large_tensors(tensors, settings.scale_threshold) if failed else {}
    big = [(e, leaf) for e in batches for leaf in e["leaves"] if leaf.get("big_values")]
    if not big and not large:
        return None
    evidence = []
    if big:
        event, leaf = max(big, key=lambda item: item[1]["largest"])
        path, largest = leaf["path"], leaf["largest"]
        evidence += [
            f"step {event['step']}: {leaf['big_values']} values of {leaf['path']} "
            f"{tuple(leaf['shape'])} have |x| > {settings.magnitude_threshold:g}, in "
            f"{leaf['big_samples']} samples (samples {listed(leaf['big_at'])})",
            f"{len(big)} tensor(s) in {len({id(e) for e, _ in big})} batches had such values",
        ]
    else:
        path = max(large, key=lambda p: _rms(tensors[p]))
        largest = max(abs(tensors[path]["min"]), abs(tensors[path]["max"]))
        event = next(e for e in batches if any(leaf["path"] == path for leaf in e["leaves"]))
    for name in large or [path]:
        t = tensors.get(name)
        if t:
            evidence.append(
                f"{name} over {t['batches']} scanned batches: mean {t['mean']:.4g}, std "
                f"{t['std']:.4g}, range {t['min']:.4g}..{t['max']:.4g} (RMS {_rms(t):.4g})"
            )
    return Finding(
        stage=NAME,
        category="data",
        title=f"values up to {largest:.4g} in {path}: inputs far from unit scale",
        confidence=0.4,
        evidence=tuple(evidence),
        fix="normalize the inputs, e.g. `(x - mean) / std` per feature with statistics of the "
        "training set (and scale regression targets the same way)",
        location=Location.from_dict(event.get("location")),
        severity="warning" if failed else "hint",
        remedy=_standardize(large, tensors) if large else None,
        code="DA204",
    )


def _large_tensors(tensors: dict, threshold: float) -> dict:
    """Floating tensors whose values are, as a whole, far from unit scale."""
    return {path: t for path, t in tensors.items()
            if "float" in t["dtype"] and _rms(t) > threshold}  # fmt: skip


def _rms(t: dict) -> float:
    return (t["mean"] ** 2 + t["std"] ** 2) ** 0.5


def _standardize(large: dict, tensors: dict) -> dict:
    """The re-run's remedy: each of these tensors, as it is consumed, becomes (x - mean) / std
    with the statistics of the scanned batches."""
    scaled = {path: [t["mean"], t["std"] or _rms(t)] for path, t in large.items()}
    return {"kind": "standardize_inputs", "tensors": scaled}


def constant_finding(batches: list[dict]) -> Finding | None:
    """Some (not all) samples of a floating tensor are constant: blank images, empty masks."""
    hits = [
        (e, leaf)
        for e in batches
        for leaf in e["leaves"]
        if leaf.get("constant_samples") and leaf["constant_samples"] < leaf["samples"]
    ]
    if not hits:
        return None
    event, leaf = hits[0]
    zero = leaf["zero_samples"]
    what = "all zero" if zero == leaf["constant_samples"] else "constant"
    return Finding(
        stage=NAME,
        category="data",
        title=f"samples of {leaf['path']} that are {what}",
        confidence=0.3,
        evidence=(
            f"step {event['step']}: {leaf['constant_samples']} of {leaf['samples']} samples of "
            f"{leaf['path']} are constant ({zero} all zero): samples "
            f"{listed(leaf['constant_at'])}",
            f"{len(hits)} tensor(s) in the scanned batches had such samples",
        ),
        fix="check how these samples are loaded; guard anything that divides by their "
        "max, sum or std",
        location=Location.from_dict(event.get("location")),
        severity="hint",
        code="DA205",
    )


def _without_comment(code: str) -> str:
    """The line without its trailing `# comment` (the fix shows code, not the user's note)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return code
    comment = next((t for t in tokens if t.type == tokenize.COMMENT), None)
    return code[: comment.start[1]].rstrip() if comment else code


def listed(values: list, limit: int = 8) -> str:
    shown = ", ".join(str(v) for v in values[:limit])
    return shown + (f", … ({len(values)} in all)" if len(values) > limit else "")
