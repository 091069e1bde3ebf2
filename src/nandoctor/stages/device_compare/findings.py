"""Findings of the device comparison: `precision` when float64 stays finite (or close) where the
target does not, `device` when the CPU and the accelerator disagree at the same precision."""

from __future__ import annotations

from nandoctor.instrument.kinds import CONSTANT_OVERFLOW, CONVERSION_OVERFLOW, OVERFLOW_KINDS
from nandoctor.instrument.precision import REDUCED_DTYPES, REDUCED_LABELS
from nandoctor.report.model import Finding, Location, display_path

# Births where a value the formula itself brings is beyond the dtype: the op's line is the fix.
_FORMULA_VALUE_OVERFLOWS = (CONVERSION_OVERFLOW, CONSTANT_OVERFLOW)

NAME = "device_compare"
_EXP_OPS = {"exp", "expm1", "exp2", "sinh", "cosh", "pow", "softmax", "_softmax"}
# A finite error this many times the tolerance is a cause when the run went non-finite.
_FAR_BEYOND = 100.0


def op_name(op: str) -> str:
    """`aten.exp.default` -> `exp`; `aten.addcdiv_.default` -> `addcdiv`."""
    parts = op.split(".")
    name = parts[1] if len(parts) > 1 and parts[0] == "aten" else parts[0]
    return name.rstrip("_") or name


def _dtype(record: dict) -> str:
    return record["target"].rsplit("-", 1)[-1]


def _where(record: dict) -> str:
    location = record.get("location")
    place = f"{display_path(location['file'])}:{location['line']}" if location else "no user line"
    module = f", module {record['module']}" if record.get("module") else ""
    return f"{record['op']} in {record['phase']} at step {record['step']}{module}, {place}"


def findings_from(first: dict | None, run_comparison: dict | None, run_went_bad: bool,
                  device: str | None) -> list[Finding]:  # fmt: skip
    findings = []
    if first is not None:
        finding = _op_finding(first, run_went_bad)
        if finding is not None:
            findings.append(finding)
    if run_comparison and run_comparison.get("only_accelerator_nonfinite") and not findings:
        findings.append(
            Finding(
                stage=NAME,
                category="device",
                title=f"the run goes non-finite on {device} but not on the CPU",
                confidence=0.5,
                evidence=(run_comparison["verdict"],),
                fix="compare the failing step op by op (`nandoctor compare-devices --reference "
                "cpu`) and run the op that differs on the CPU or in float32 meanwhile",
                code="DV402",
            )
        )
    return findings


def _op_finding(record: dict, run_went_bad: bool) -> Finding | None:
    float64 = record["reference"].endswith("float64")
    if float64 and not _reduced_on_the_chain(record):
        # float64 staying finite where float32 did not shows only that float64 has more range:
        # `precision` needs a reduced precision on the failing chain
        return None
    category = "precision" if float64 else "device"
    side = record["nonfinite_only_on"]
    ratio = record.get("ratio") or 0.0
    if side == "target":
        confidence, severity = (0.9 if float64 else 0.85), "error"
        if record.get("drift_from"):
            confidence = 0.85
        elif float64 and _at_a_domain_edge(record):
            # float32 rounding put an input at the edge of the op's domain (a cosine of 1 +
            # 1 ulp into acos, say): guarding the op is the fix; float64 only moves the edge.
            confidence, severity = 0.5, "warning"
    elif side == "reference":
        confidence, severity = 0.6, ("warning" if not float64 else "hint")
    elif run_went_bad and ratio >= _FAR_BEYOND:
        confidence, severity = 0.6, "error"
    else:
        confidence, severity = 0.4, "warning"
    drift = record.get("drift_from")
    location = Location.from_dict((drift or record).get("location"))
    return Finding(
        stage=NAME,
        category=category,
        title=_title(record, category),
        confidence=confidence,
        evidence=tuple(_evidence(record)),
        fix=_fix(record, category),
        location=location,
        severity=severity,
        remedy=_remedy(record, category, location),
        code="PR401" if category == "precision" else "DV401",
    )


def _remedy(record: dict, category: str, location: Location | None) -> dict | None:
    """Computing the op's line in float32 is the fix shown when rounding, not range, broke the
    op (a value it needs rounded away, or a cast the dtype cannot hold): the re-run does that."""
    op_local = _rounded_to_the_edge(record) or record.get("birth_kind") in _FORMULA_VALUE_OVERFLOWS
    if category != "precision" or location is None or not op_local:
        return None
    if record["phase"] == "optimizer":
        return None  # the fix shown is the optimizer's eps or float32 master weights
    if _dtype(record.get("drift_from") or record) not in REDUCED_DTYPES:
        return None  # TF32 is a matmul setting, not a dtype the line's tensors have
    # the line in float32 first; when that does not hold (the value was rounded away on an
    # earlier line), the run with the model kept in float32 shows whether the dtype is the cause
    return {"kind": "float32_at", "file": location.file, "line": location.line,
            "otherwise": {"kind": "float32"}}  # fmt: skip


def _reduced_on_the_chain(record: dict) -> bool:
    """The failing op, or the op where its rounding began, computed below float32."""
    drift = record.get("drift_from")
    return _dtype(record) in REDUCED_LABELS or (
        drift is not None and _dtype(drift) in REDUCED_LABELS
    )


_FLOAT32_MAX = 3.4028234663852886e38


def _at_a_domain_edge(record: dict) -> bool:
    """A float32 op that went non-finite while the float64 reference stayed within float32's
    range: not an overflow."""
    reference_max = record.get("reference_max")
    return (
        _dtype(record) == "float32" and reference_max is not None and reference_max < _FLOAT32_MAX
    )


def _rounded_to_the_edge(record: dict) -> bool:
    """The target made NaN/Inf by a domain error or a division by zero (not an overflow) that
    the float64 chain does not make: rounding moved a value onto the op's edge."""
    kind = record.get("birth_kind")
    return (
        record.get("nonfinite_only_on") == "target"
        and kind is not None
        and kind not in OVERFLOW_KINDS
    )


def _title(record: dict, category: str) -> str:
    op, dtype = op_name(record["op"]), _dtype(record)
    if category == "device":
        return f"{op} on {record['target']} disagrees with the CPU at the same precision"
    if record.get("drift_from") or _rounded_to_the_edge(record):
        return f"{op} turns NaN/Inf through rounding in {dtype} (float64 stays finite)"
    if record["nonfinite_only_on"] == "target":
        return f"{op} overflows {dtype} (the float64 reference stays finite)"
    return f"{op} loses precision in {dtype} ({record.get('ratio', 0):.3g}x its tolerance)"


def _evidence(record: dict) -> list[str]:
    lines = [_where(record)]
    reference = record["reference"]
    if record.get("target_nonfinite"):
        why = f" ({record['explanation']})" if record.get("explanation") else ""
        lines.append(f"on the target ({record['target']}): {record['target_nonfinite']}{why}")
    if record.get("reference_max") is not None:
        state = "finite" if record["nonfinite_only_on"] != "reference" else "partly finite"
        lines.append(f"{reference} reference {state}: max |x| = {record['reference_max']:.4g}")
    if record.get("max_abs_err") is not None:
        lines.append(
            f"max error {record['max_abs_err']:.3g} (relative {record['max_rel_err']:.3g}), "
            f"{record['ratio']:.3g}x the {record['tolerance']['dtype']} tolerance"
        )
    if record.get("input_max") is not None:
        lines.append(f"largest input |x| = {record['input_max']:.4g}")
    if drift := record.get("drift_from"):
        lines.append(
            f"rounding began at {_where(drift)}: {drift['ratio']:.3g}x the "
            f"{drift['tolerance']['dtype']} tolerance against float64 followed from the step's start"
        )
    location = (drift or record).get("location")
    if location and location.get("code"):
        lines.append(f"code: {location['code']}")
    return lines


def _fix(record: dict, category: str) -> str:
    op, dtype, phase = op_name(record["op"]), _dtype(record), record["phase"]
    if category == "device":
        tf32 = record["tolerance"]["dtype"] == "tf32"
        switch = (
            " or switch TF32 off (`torch.backends.cuda.matmul.allow_tf32 = False`, "
            "`torch.backends.cudnn.allow_tf32 = False`)"
            if tf32
            else ""
        )
        return (
            f"the accelerator's kernel for {op} gives a different result than the CPU at "
            f"{dtype}: compute this op in a higher precision or on the CPU for now{switch}, "
            "try another torch/CUDA version, and report it to PyTorch with the input ranges"
        )
    if phase == "optimizer" and dtype == "float16":
        return (
            "the optimizer runs in float16, where Adam's eps=1e-8 rounds to 0 and an update of "
            "0/0 is NaN: keep float32 master weights (`torch.autocast` + `GradScaler` instead of "
            "`.half()`), or pass eps >= 1e-4 if the parameters must stay float16"
        )
    if _rounded_to_the_edge(record) and dtype in REDUCED_DTYPES:
        return (
            f"a value this computation needs rounds away in {dtype} (an eps of 1e-8 or 1e-12 "
            "is 0 in float16, and 1 - 1e-6 is 1 in bfloat16), so the op divides by 0 or leaves "
            "its domain: compute it in float32 (`.float()` on its inputs, or outside the "
            "autocast region), or use constants the dtype can hold "
            f"(`torch.finfo(torch.{dtype}).eps` and up)"
        )
    if record.get("drift_from") or dtype == "bfloat16":
        return (
            f"rounding in {dtype} breaks this computation: compute it in float32 (`.float()` on "
            "the inputs of the reduction, or outside the autocast region), and prefer "
            "`torch.var`/`F.layer_norm` to E[x^2] - E[x]^2"
        )
    if record.get("birth_kind") in _FORMULA_VALUE_OVERFLOWS and dtype in REDUCED_DTYPES:
        return (
            f"a value beyond {dtype}'s range is converted to {dtype} here: write constants the "
            "dtype can hold (`torch.finfo(scores.dtype).min` rather than -1e10 for a mask, say), "
            "or keep this tensor in float32"
        )
    if dtype == "float16":
        return (
            "float16 tops out at 65504: keep float32 weights and use `torch.autocast(device_type, "
            "dtype=torch.bfloat16)` instead of `.half()` (bfloat16 has float32's range), or keep "
            "activations in range (normalize the inputs, add a LayerNorm); if it must stay "
            f"float16, compute {op} in float32 (`.float()` on its inputs)"
        )
    if op in _EXP_OPS:
        return (
            "compute it in log space: `torch.logsumexp`, `F.log_softmax` or `F.softmax` instead "
            f"of exp and a sum, or compute {op} in float64 (`.double()` on its input)"
        )
    return f"compute {op} in float64 (`.double()` on its inputs) or keep its inputs in range"
