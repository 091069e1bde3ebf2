"""The fix shown is the fix verified: the line the report tells the user to paste computes what
the guarded re-run computes (no child processes: the guard runs in this process)."""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

from nandoctor.fixes import (
    GUARDS,
    bound_remedy,
    guard_for,
    guarded_line,
    population_statistics_line,
)
from nandoctor.instrument.remedies import (
    BoundAtTheLine,
    Float32AtTheLine,
    OpGuard,
    PopulationStatisticsAtTheLine,
)


@pytest.mark.parametrize(
    ("line", "op", "guard", "expected"),
    [
        ("return self.scale * x / rms", "div", "positive",
         "return self.scale * x / rms.clamp_min(1e-12)"),
        # every call of the op on the line: the re-run guards them all
        ("kl = (p * (torch.log(p) - torch.log(q))).sum()", "log", "positive",
         "kl = (p * (torch.log(p.clamp_min(1e-12)) - torch.log(q.clamp_min(1e-12)))).sum()"),
        ("z = torch.div(a, b - c)", "div", "away_from_zero",
         "z = torch.div(a, torch.where((b - c).abs() < 1e-12, 1e-12, (b - c)))"),
        ("if torch.log(x).mean() > 0:", "log", "positive",
         "if torch.log(x.clamp_min(1e-12)).mean() > 0:"),
        ("y = x ** 0.5", "pow", "positive", "y = x.clamp_min(1e-12) ** 0.5"),
        ("out = torch.exp(s * t)", "exp", "exp_range", "out = torch.exp((s * t).clamp(max=80.0))"),
    ],
)  # fmt: skip
def test_the_line_is_rewritten_with_the_guard(line, op, guard, expected):
    assert guarded_line(line, op, guard) == expected


def test_the_guard_follows_the_operand():
    assert guard_for("div") == "positive"
    assert guard_for("div", signed=True) == "away_from_zero"
    assert guard_for("exp", dtype="float16") == "exp_range_half"
    assert guard_for("acos") == "inside_unit"


def test_the_guard_holds_in_the_dtype_the_op_computed_in():
    # 1e-12 is 0 in float16 and 1 - 1e-7 is 1 in float16 and bfloat16: a guard there must not be
    zero = torch.zeros(1, dtype=torch.float16)
    positive = GUARDS[guard_for("div", dtype="float16")].format(x="zero")
    assert eval(positive, {"torch": torch, "zero": zero}).item() > 0
    for dtype in (torch.float16, torch.bfloat16):
        one = torch.ones(1, dtype=dtype)
        inside = GUARDS[guard_for("acos", dtype=str(dtype).removeprefix("torch."))].format(x="one")
        assert eval(inside, {"torch": torch, "one": one}).item() < 1


_LINES = {
    "log": "out = (p * (torch.log(p) - torch.log(q))).sum() + (1 - p).log().sum()",
    "div": "out = a / (b - c) + torch.div(a, b)",
    "sqrt": "out = torch.sqrt(((a - b) ** 2).sum(-1))",
    "acos": "out = torch.acos(cosine)",
    "exp": "out = torch.exp(a * 100.0)",
}


def _compute(tmp_path, name: str, line: str, values: dict, guard: OpGuard | None = None):
    path = tmp_path / f"{name}.py"
    path.write_text(
        f"import torch\n\n\ndef compute({', '.join(values)}):\n    {line}\n    return out\n"
    )
    module = _load(path)
    if guard is None:
        return module.compute(**values), path
    with guard:
        return module.compute(**values), path


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("op", sorted(_LINES))
@pytest.mark.parametrize("signed", [False, True])
def test_the_shown_line_computes_what_the_guarded_rerun_computes(tmp_path, op, signed):
    g = torch.Generator().manual_seed(0)
    values = {n: torch.rand(4, 3, generator=g) for n in ("p", "q", "a", "b", "c", "cosine")}
    values["p"][0, 0] = values["q"][1, 1] = 0.0  # log(0)
    values["b"][0] = values["c"][0]  # 0 / 0 and a zero distance
    values["cosine"][0, 0] = 1.0 + 1e-7
    if signed:
        values = {n: v - 0.5 for n, v in values.items()}
    guard = guard_for(op, signed=signed)
    line = _LINES[op]
    values = {n: v for n, v in values.items() if n in line}
    shown = guarded_line(line, op, guard)
    expected, _ = _compute(tmp_path, "shown", shown, values)
    original = tmp_path / "original.py"
    rerun = OpGuard(op, str(original), 5, guard)
    got, _ = _compute(tmp_path, "original", line, values, rerun)
    assert rerun.applied > 0
    torch.testing.assert_close(got, expected, equal_nan=True)


_UNIT = [{"side": "min", "bound": -1.0}, {"side": "max", "bound": 1.0}]
_ZERO = [{"side": "min", "bound": 0.0}]


@pytest.mark.parametrize(
    ("line", "bounds", "expected"),
    [
        ("out = torch.acos(torch.clamp(cosine, -1.0, 1.0))", _UNIT,
         "out = torch.acos(torch.clamp(cosine, -1 + 1e-7, 1 - 1e-7))"),
        ("out = cosine.clamp(min=-1, max=1).acos()", _UNIT,
         "out = cosine.clamp(min=-1 + 1e-7, max=1 - 1e-7).acos()"),
        ("out = torch.sqrt(a.clamp_min(0))", _ZERO, "out = torch.sqrt(a.clamp_min(1e-12))"),
        ("out = torch.clip(a, 0.0, None).sqrt()", _ZERO,
         "out = torch.clip(a, 1e-12, None).sqrt()"),
        # a bound that is not the singular one stays as written
        ("out = torch.log(a.clamp(0, 5.0))", _ZERO, "out = torch.log(a.clamp(1e-12, 5.0))"),
    ],
)  # fmt: skip
def test_a_clamp_on_the_ops_singular_point_is_shown_and_rerun_alike(tmp_path, line, bounds,
                                                                    expected):  # fmt: skip
    remedy = bound_remedy(str(tmp_path / "original.py"), 5, line, bounds, "float32")
    assert remedy["shown"] == expected
    values = {"a": torch.tensor([-0.5, 0.0, 2.0]), "cosine": torch.tensor([-1.5, 0.2, 1.0])}
    used = {n for n in values if re.search(rf"\b{n}\b", line)}
    values = {n: v.requires_grad_() for n, v in values.items() if n in used}
    shown, _ = _compute(tmp_path, "shown", expected, values)
    rerun = BoundAtTheLine(remedy["file"], 5, remedy["bounds"])
    got, _ = _compute(tmp_path, "original", line, values, rerun)
    assert rerun.applied > 0
    torch.testing.assert_close(got, shown)
    (gradient,) = torch.autograd.grad(got.sum(), list(values.values()))
    assert gradient.isfinite().all()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("out = (a - a.mean()) / (a.std() + 1e-8)",
         "out = (a - a.mean()) / (a.std(correction=0) + 1e-8)"),
        ("out = torch.var(a, dim=0, unbiased=True) + a.std(0)",
         "out = torch.var(a, dim=0, correction=0) + a.std(0, correction=0)"),
    ],
)  # fmt: skip
def test_a_sample_statistic_is_shown_and_rerun_without_the_correction(tmp_path, line, expected):
    assert population_statistics_line(line) == expected
    values = {"a": torch.tensor([[0.7]])}  # a single value: the corrected std is 0/0
    original, _ = _compute(tmp_path, "before", line, values)
    assert original.isnan().any()
    shown, _ = _compute(tmp_path, "shown", expected, values)
    rerun = PopulationStatisticsAtTheLine(str(tmp_path / "original.py"), 5)
    got, _ = _compute(tmp_path, "original", line, values, rerun)
    assert rerun.applied > 0 and shown.isfinite().all()
    torch.testing.assert_close(got, shown)


def test_a_correction_passed_by_position_is_not_rewritten():
    assert population_statistics_line("out = a.std(0, True)") is None


def test_a_line_computed_in_float32_hands_its_result_back_in_half(tmp_path):
    """A float16 normalization whose eps rounds to 0 divides by 0; the same line in float32
    does not, and the next (half) layer still gets a half input."""
    path = tmp_path / "norm.py"
    path.write_text(
        "import torch\n\n\ndef compute(x, layer):\n"
        "    y = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + 1e-12)\n"
        "    return layer(y)\n"
    )
    module = _load(path)
    x = torch.full((2, 8), 0.5, dtype=torch.float16)  # zero variance: 0 / sqrt(0 + 0)
    layer = torch.nn.Linear(8, 3).half()
    assert module.compute(x, layer).isnan().all()
    with Float32AtTheLine(str(path), 5):
        out = module.compute(x, layer)
    assert out.dtype == torch.float16 and out.isfinite().all()


def test_every_guard_is_valid_python_on_a_tensor():
    x = torch.tensor([-2.0, 0.0, 0.5, 3.0])
    for source in GUARDS.values():
        assert eval(source.format(x="x"), {"torch": torch, "x": x}).shape == x.shape
