"""Device comparison: every op shadowed on a reference (float64 here, the CPU beside a GPU).

End to end through `nandoctor compare-devices` for the planted precision bugs and a healthy
script; the comparison math against a naive oracle; the shadow mode op by op in this process
(in-place, out=, random, factory and conversion ops, masks, sampling, attribution)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from conftest import SCRIPTS, line_of
from nandoctor.codes import measured_confidence


@pytest.fixture
def no_verify(tmp_path) -> tuple[str, str]:
    """Options that leave out the anomaly stage's fix-verifying re-runs: these tests are about
    the comparison, and each re-run costs a child process."""
    config = tmp_path / "no-verify.yaml"
    config.write_text("verify:\n  max_fixes: 0\n")
    return ("--config", str(config))


# ---- end to end -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("script", "op", "module", "marker", "dtype", "dtype_max"),
    [
        ("exp_overflow.py", "aten.exp.default", None, "e = torch.exp(logits)",
         "float32", 3.4028234663852886e38),
        ("precision_half_overflow.py", "aten.addmm.default", "0",
         "loss = nn.functional.mse_loss(model(prices)", "float16", 65504.0),
    ],
)  # fmt: skip
def test_an_overflow_is_compared_against_float64(
    nandoctor, no_verify, script, op, module, marker, dtype, dtype_max
):
    result = nandoctor("compare-devices", script, "--steps", "1", *no_verify)
    assert result.exit_code == 1, result.stdout + result.stderr
    stage = result.report["stages"]["device_compare"]
    assert stage["status"] == "ran"
    assert stage["reference"] == "cpu-float64"
    assert stage["target"] == f"cpu-{dtype}"
    assert "float64" in stage["reference_reason"]
    first = stage["first_divergence"]
    line = line_of(script, marker)
    assert (first["op"], first["phase"], first["step"], first["module"]) == (
        op,
        "forward",
        0,
        module,
    )
    assert first["location"]["line"] == line
    assert first["nonfinite_only_on"] == "target"
    assert dtype_max < first["reference_max"] < math.inf  # float64 kept what the dtype lost
    compared = [f for f in result.report["findings"] if f["stage"] == "device_compare"]
    if dtype == "float32":
        # float64 has more range than float32, and that is all it shows: no precision cause
        # without a reduced precision; the formula is the bug
        assert compared == []
        cause = result.report["causes"][0]
        assert (cause["category"], cause["location"]["line"]) == ("invalid_operation", line)
        return
    cause = result.report["causes"][0]
    assert cause["category"] == "precision"
    assert cause["location"]["line"] == line
    (finding,) = compared
    # its strength 0.9, moved towards PR401's record on the dev split
    assert finding["category"] == "precision"
    assert finding["confidence"] == pytest.approx(measured_confidence("PR401", 0.9), abs=0.01)
    assert finding["location"]["line"] == line
    assert any("cpu-float64 reference finite: max |x| =" in e for e in finding["evidence"])
    if dtype == "float16":
        assert "65504" in finding["fix"] and "bfloat16" in finding["fix"]
    assert stage["loss_trajectories"] == {f"cpu-{dtype}": [None]}  # step 0 went non-finite


def test_the_checklist_compares_no_float32_cpu_run_and_does_a_half_one(nandoctor, no_verify):
    result = nandoctor("run", "exp_overflow.py", "--stages", "anomaly,device_compare", *no_verify)
    assert result.exit_code == 1
    stage = result.report["stages"]["device_compare"]
    assert stage["status"] == "skipped" and "float32 on the CPU" in stage["summary"]
    assert result.report["causes"][0]["category"] == "invalid_operation"
    result = nandoctor("run", "precision_half_overflow.py", "--stages", "anomaly,device_compare",
                       *no_verify)  # fmt: skip
    assert result.report["stages"]["device_compare"]["status"] == "ran"
    assert result.report["causes"][0]["category"] == "precision"
    precisions = result.report["run"].get("precisions")
    assert precisions and precisions[0]["param_dtypes"] == ["float16"]


def test_the_checklist_skips_the_comparison_of_a_finite_run(nandoctor):
    result = nandoctor("run", "healthy_mlp.py", "--stages", "anomaly,device_compare")
    assert result.exit_code == 0
    stage = result.report["stages"]["device_compare"]
    assert stage["status"] == "skipped" and "stayed finite" in stage["summary"]


def test_healthy_script_has_no_divergence(nandoctor):
    result = nandoctor("compare-devices", "healthy_mlp.py", "--steps", "2",
                      script_args=["--steps", "4"])  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    stage = result.report["stages"]["device_compare"]
    assert stage["status"] == "ran"
    assert stage["first_divergence"] is None
    assert stage["ops_compared"] > 20
    assert stage["steps"] == 2
    assert all(not op["beyond_tolerance"] for op in stage["worst_ops"])
    assert len(stage["loss_trajectories"]["cpu-float32"]) == 2
    assert result.report["causes"] == []
    assert not [f for f in result.report["findings"] if f["stage"] == "device_compare"]
    assert "no op differed beyond tolerance" in result.stdout


def test_adam_eps_vanishing_in_float16(nandoctor, no_verify):
    result = nandoctor("compare-devices", "precision_adam_eps_fp16.py", "--steps", "1", *no_verify)
    first = result.report["stages"]["device_compare"]["first_divergence"]
    assert (first["op"], first["phase"], first["nonfinite_only_on"]) == (
        "aten.addcdiv_.default", "optimizer", "target")  # fmt: skip
    assert first["location"]["line"] == line_of("precision_adam_eps_fp16.py", "optimizer.step()")
    assert "precision" in [cause["category"] for cause in result.report["causes"]]
    (finding,) = [f for f in result.report["findings"] if f["stage"] == "device_compare"]
    assert finding["category"] == "precision"
    assert "eps" in finding["fix"] and "1e-4" in finding["fix"]


def test_reference_flag_is_checked():
    from conftest import run_cli

    result = run_cli("compare-devices", str(SCRIPTS / "healthy_mlp.py"), "--reference", "gpu")
    assert result.exit_code == 2


def test_tolerances_accept_yaml_exponents_and_name_bad_values(tmp_path):
    from conftest import run_cli
    from nandoctor.config import load_config

    config = tmp_path / "tolerances.yaml"
    config.write_text("device_compare:\n  tolerances:\n    float16: {atol: 1e-5, rtol: 0.01}\n")
    assert load_config(path=str(config)).device_compare.tolerances.float16.atol == 1e-5
    config.write_text("device_compare:\n  tolerances:\n    float16: {atol: tiny, rtol: 0.01}\n")
    result = run_cli("compare-devices", str(SCRIPTS / "healthy_mlp.py"), "--config", str(config))
    assert result.exit_code == 2
    assert "device_compare.tolerances.float16.atol" in result.stderr


# ---- parent-side pieces (no torch) ----------------------------------------------------------
def test_window_ends_at_the_failure():
    from nandoctor.stages.device_compare.runs import comparison_window

    assert comparison_window(None, 3) == (0, 3)
    assert comparison_window(10, 3) == (8, 11)
    assert comparison_window(1, 3) == (0, 2)


@pytest.mark.parametrize(
    ("cpu_losses", "cpu_bad", "gpu_losses", "gpu_bad", "verdict", "only_gpu"),
    [
        ([1.0, 0.9, 0.8], None, [1.0, 0.9, 0.8], None, "losses agree", False),
        ([1.0, 0.9, 0.8], None, [1.0, 0.95, 0.8], None, "differ by more than", False),
        ([1.0, 0.9, 0.8], None, [1.0], 1, "only the cuda:0 run", True),
        ([1.0], 1, [1.0, 0.9], None, "only the CPU run", False),
    ],
)
def test_run_level_verdicts(cpu_losses, cpu_bad, gpu_losses, gpu_bad, verdict, only_gpu):
    from nandoctor.stages.device_compare.runs import compare_sides

    def side(losses, bad):
        return {"losses": losses, "first_nonfinite_step": bad, "error": None, "timed_out": False}

    compared = compare_sides(side(cpu_losses, cpu_bad), side(gpu_losses, gpu_bad), "cuda:0", 1e-3)
    assert verdict in compared["verdict"]
    assert compared["only_accelerator_nonfinite"] is only_gpu


def test_device_findings_for_same_precision_disagreement():
    from nandoctor.stages.device_compare.findings import findings_from

    record = {
        "step": 2, "phase": "forward", "op": "aten.mm.default", "module": "fc",
        "location": {"file": "/x/train.py", "line": 7, "code": "y = fc(x)"},
        "target": "cuda:0-float32", "reference": "cpu-float32", "nonfinite_only_on": "target",
        "target_nonfinite": "nan=2 of 8", "reference_max": 3.5, "max_abs_err": None,
        "tolerance": {"dtype": "tf32", "atol": 1e-5, "rtol": 1e-2}, "ratio": 0.0,
    }  # fmt: skip
    (finding,) = findings_from(record, None, run_went_bad=True, device="cuda")
    assert finding.category == "device"
    assert finding.location.line == 7
    assert "allow_tf32 = False" in finding.fix


def test_settings_are_validated():
    from nandoctor.config import load_config
    from nandoctor.errors import ConfigError

    with pytest.raises(ConfigError, match="device_compare.reference"):
        load_config("standard", overrides={"device_compare": {"reference": "gpu"}})
    with pytest.raises(ConfigError, match="device_compare.steps"):
        load_config("standard", overrides={"device_compare": {"steps": 0}})
    assert (
        load_config("thorough").device_compare.steps > load_config("standard").device_compare.steps
    )


# ---- the comparison math against a naive oracle ---------------------------------------------
def _naive(target, reference, atol, rtol, near_zero):
    both = [(t, r) for t, r in zip(target, reference, strict=True)
            if math.isfinite(t) and math.isfinite(r)]  # fmt: skip
    only_target = sum(1 for t, r in zip(target, reference, strict=True)
                      if not math.isfinite(t) and math.isfinite(r))  # fmt: skip
    only_reference = sum(1 for t, r in zip(target, reference, strict=True)
                         if math.isfinite(t) and not math.isfinite(r))  # fmt: skip
    top = max(abs(r) for _, r in both)
    ratios, relatives, beyond = [], [], 0
    for t, r in both:
        scale = max(abs(r), near_zero * top)
        bound = atol + rtol * scale
        ratios.append(abs(t - r) / bound)
        relatives.append(abs(t - r) / scale)
        beyond += abs(t - r) > bound
    return {
        "max_abs_err": max(abs(t - r) for t, r in both),
        "max_rel_err": max(relatives),
        "ratio": max(ratios),
        "beyond": beyond,
        "only_target": only_target,
        "only_reference": only_reference,
    }


@pytest.mark.parametrize(
    ("target", "reference"),
    [
        ([1.0, 2.0, 3.0], [1.0, 2.0001, 3.0]),
        ([1e-9, 100.0, -5.0], [0.0, 100.02, -5.0]),  # a near-zero element judged at 1% of 100
        ([math.inf, 1.0, math.nan, -math.inf], [1e40, 1.0, math.nan, -math.inf]),
        ([1.0, 5.0, 2.0], [1.0, math.nan, 2.5]),
    ],
)
def test_comparison_matches_the_oracle(target, reference):
    import torch

    from nandoctor.instrument.compare import Tolerance, compare_tensors

    got = compare_tensors(torch.tensor(target, dtype=torch.float64),
                          torch.tensor(reference, dtype=torch.float64),
                          Tolerance(atol=1e-6, rtol=1e-4), near_zero=0.01)  # fmt: skip
    want = _naive(target, reference, 1e-6, 1e-4, 0.01)
    for key, value in want.items():
        assert getattr(got, key) == pytest.approx(value, rel=1e-9, abs=1e-15), key
    assert got.diverges == (want["ratio"] > 1 or want["only_target"] or want["only_reference"])


def test_nonfinite_on_both_sides_is_agreement():
    import torch

    from nandoctor.instrument.compare import Tolerance, compare_tensors

    t = torch.tensor([-math.inf, math.nan, 1.0])
    r = torch.tensor([-math.inf, math.inf, 1.0], dtype=torch.float64)  # NaN vs inf: both bad
    comparison = compare_tensors(t, r, Tolerance(1e-6, 1e-4), 0.01)
    assert not comparison.diverges
    assert comparison.nonfinite_only_on is None


# ---- the shadow mode in this process ---------------------------------------------------------
TOLERANCES = {
    "float16": {"atol": 1e-5, "rtol": 1e-2},
    "bfloat16": {"atol": 1e-5, "rtol": 5e-2},
    "tf32": {"atol": 1e-5, "rtol": 1e-2},
    "float32": {"atol": 1e-6, "rtol": 1e-4},
    "float64": {"atol": 1e-12, "rtol": 1e-9},
}


@dataclass
class _Events:
    emitted: list = field(default_factory=list)

    def emit(self, kind: str, **fields) -> None:
        self.emitted.append((kind, fields))


@dataclass
class _Session:
    """What the shadow reads from the watch session."""

    step: int = 0
    phase: str = "forward"
    module: str | None = None
    backward_call: object = None
    paused: bool = False
    stopping: bool = False
    events: _Events = field(default_factory=_Events)


def _shadow(reference="float64", **settings):
    from nandoctor.instrument.shadow import ShadowMode, ShadowSettings

    options = dict(reference=reference, start=0, stop=10, max_ops_per_step=2000,
                   max_op_elements=10**8, near_zero=0.01, rounding_factor=10.0, top_k=10,
                   tolerances=TOLERANCES)  # fmt: skip
    options.update(settings)
    session = _Session()
    return session, ShadowMode(session, ShadowSettings.from_dict(options))


def _here(marker: str) -> int:
    from pathlib import Path

    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line and "_here(" not in line)


def test_exp_overflow_in_process():
    import torch

    session, mode = _shadow()
    x = torch.full((4,), 100.0)
    with mode:
        y = torch.exp(x)  # overflow here
    assert torch.isinf(y).all()
    first = mode.first
    assert first["op"] == "aten.exp.default"
    assert first["nonfinite_only_on"] == "target"
    assert first["reference"] == "cpu-float64"
    assert first["location"]["line"] == _here("y = torch.exp(x)  # overflow here")
    assert first["reference_max"] == pytest.approx(math.exp(100.0), rel=1e-12)
    assert session.events.emitted[0][0] == "shadow_divergence"


def test_masked_softmax_is_not_a_divergence():
    import torch

    _, mode = _shadow()
    scores = torch.randn(4, 4)
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), diagonal=1)
    with mode:
        masked = scores.masked_fill(mask, float("-inf"))
        full_row = masked.clone()
        full_row[0] = float("-inf")  # a fully masked row: NaN on both sides
        torch.softmax(masked, dim=-1)
        torch.softmax(full_row, dim=-1)
    assert mode.first is None
    assert mode.counts["compared"] >= 3


def test_in_place_and_out_ops_compare_what_they_wrote():
    import torch

    _, mode = _shadow()
    x = torch.full((3,), 100.0)
    out = torch.empty(3)
    with mode:
        torch.exp(torch.full((3,), 1.0), out=out)
        x.exp_()
    assert mode.first["op"] == "aten.exp_.default"
    assert mode.first["nonfinite_only_on"] == "target"
    assert mode.first["input_max"] == 100.0  # the input as the op saw it, before the write
    ops = {record["op"] for record in mode.summary()["worst"]}
    assert "aten.exp.out" in ops


def test_random_ops_are_not_run_again_and_keep_the_random_stream():
    import torch
    from torch.nn.functional import dropout

    def draws():
        return [torch.rand(3), torch.randn(3), dropout(torch.ones(8), 0.5),
                torch.empty(3).normal_()]  # fmt: skip

    torch.manual_seed(0)
    expected = [*draws(), torch.rand(2)]
    torch.manual_seed(0)
    _, mode = _shadow()
    with mode:
        got = draws()
    got.append(torch.rand(2))  # the stream goes on where it would have without the shadow
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a, b)
    assert mode.counts["skipped: random"] >= 4
    assert mode.first is None


def test_conversions_and_factories_keep_the_requested_meaning():
    import torch

    _, mode = _shadow()
    big = torch.tensor([70000.0, 1.0])
    with mode:
        halved = big.half()  # float16 cannot hold 70000
        torch.full((2,), 0.1, dtype=torch.float16, device="cpu")  # float64 keeps 0.1 exact
        big.to(torch.float64)  # exact: not compared
        torch.arange(5) * 2  # integers: nothing to compare
    assert torch.isinf(halved[0])
    first = mode.first
    assert (first["op"], first["nonfinite_only_on"]) == ("aten._to_copy.default", "target")
    assert first["reference_max"] == 70000.0
    records = {record["op"]: record for record in mode.summary()["worst"]}
    rounding = abs(float(torch.tensor(0.1, dtype=torch.float16)) - 0.1)
    assert records["aten.full.default"]["max_abs_err"] == pytest.approx(rounding)
    assert "aten.mul.Tensor" not in records


def test_rounding_in_a_cancelling_sum_is_not_a_divergence():
    import torch

    _, mode = _shadow()
    torch.manual_seed(0)
    terms = torch.randn(8192) * 1e4
    terms = terms - terms.mean()  # sums to about 0.3, with float32 rounding noise of ~0.06
    with mode:
        terms.sum()
    (record,) = mode.summary()["worst"]
    assert record["max_rel_err"] > 1e-4  # beyond the plain float32 tolerance ...
    assert not record["beyond_tolerance"]  # ... but within what rounding the sum explains


def test_backward_ops_are_attributed_to_their_forward_line():
    import torch

    session, mode = _shadow()
    x = torch.full((3,), 2.0, requires_grad=True)
    with mode:
        y = torch.exp(x)  # forward line
        session.phase = "forward"
        y.sum().backward()
    backward = [r for r in mode.summary()["worst"] if r["phase"] == "backward"]
    assert any(
        r["backward_node"] == "ExpBackward0"
        and r["location"]["line"] == _here("y = torch.exp(x)  # forward line")
        for r in backward
    )


def test_the_chain_follows_in_place_updates():
    """Adam in float16: eps=1e-8 rounds to 0 in `add_`, so `addcdiv_` divides 0 by 0. The same
    inputs give NaN in float64 too; float64 followed from the step's start gives 0."""
    import torch

    session, mode = _shadow()
    param = torch.zeros(4, dtype=torch.float16)
    exp_avg, exp_avg_sq = torch.zeros(4, dtype=torch.float16), torch.zeros(4, dtype=torch.float16)
    session.phase = "optimizer"
    with mode:
        denom = (exp_avg_sq.sqrt() / 0.5).add_(1e-8)
        param.addcdiv_(exp_avg, denom, value=-0.1)  # 0 / 0
    assert torch.isnan(param).all()
    first = mode.first
    assert (first["op"], first["phase"]) == ("aten.addcdiv_.default", "optimizer")
    assert first["basis"] == "float64 followed from the step's start"
    assert first["reference_max"] == 0.0
    assert first["location"]["line"] == _here("# 0 / 0")


def test_steps_outside_the_window_and_sampling():
    import torch

    session, mode = _shadow(start=1, stop=3, max_ops_per_step=2)
    x = torch.ones(8)
    with mode:
        x + 1  # step 0: outside the window
        session.step = 1
        for _ in range(6):
            x * 2
        torch.full((2,), 1e30) * 1e30  # overflows: compared although the budget is spent
        session.step = 2  # the window's last (failing) step: every op, for an unbroken chain
        for _ in range(4):
            x - 1
        session.step = 3
        x - 1
    summary = mode.summary()
    assert summary["steps_compared"] == [1, 2]
    assert mode.counts["compared"] == 3 + 4
    assert mode.counts["sampled out"] == 5
    assert mode.first["op"] == "aten.mul.Tensor"
    kinds = [kind for kind, _ in session.events.emitted]
    assert "shadow_summary" in kinds  # emitted when step 1 ended


def test_explicit_cpu_reference_without_accelerator_compares_nothing():
    import torch

    if torch.cuda.is_available():
        pytest.skip("an accelerator is present")
    _, mode = _shadow(reference="cpu")
    x = torch.full((2,), 100.0)
    with mode:
        torch.exp(x)
    assert mode.counts["compared"] == 0
    assert mode.counts["skipped: already on the cpu"] == 1


def test_bfloat16_cancellation_in_process_points_at_the_subtraction():
    import torch

    _, mode = _shadow()
    torch.manual_seed(0)
    h = (120.0 + torch.randn(16, 32) * 0.6).to(torch.bfloat16)
    with mode, torch.autocast("cpu", dtype=torch.bfloat16):
        mean = h.mean(dim=-1, keepdim=True)
        var = (h * h).mean(dim=-1, keepdim=True) - mean * mean  # cancellation
        inv = torch.rsqrt(var + 1e-5)
    if not torch.isnan(inv).any():
        pytest.skip("this draw's rounding left every variance positive")
    first = mode.first
    assert first["op"] == "aten.rsqrt.default"
    assert first["drift_from"]["location"]["line"] == _here("# cancellation")


@pytest.mark.parametrize("autocast", [False, True])
def test_healthy_models_step_without_divergence(autocast):
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    attention = nn.TransformerEncoderLayer(4, 2, dim_feedforward=8, batch_first=True, dropout=0.0)
    optimizer = torch.optim.AdamW([*model.parameters(), *attention.parameters()], lr=1e-3)
    x, y = torch.randn(8, 6, 16), torch.randn(8, 6, 4)
    causal = nn.Transformer.generate_square_subsequent_mask(6)
    session, mode = _shadow()
    with mode:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = attention(model(x), src_mask=causal, is_causal=True)
            loss = nn.functional.mse_loss(out.float(), y)
        session.phase = "forward"
        loss.backward()
        session.phase = "optimizer"
        optimizer.step()
    assert mode.counts["compared"] > 50
    worst = mode.summary()["worst"][0]
    assert mode.first is None, worst


# ---- CPU against CUDA -------------------------------------------------------------------------
def _needs_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.mark.gpu
def test_cuda_ops_are_compared_with_the_cpu():
    import torch

    _needs_cuda()
    _, mode = _shadow(reference="auto")
    torch.manual_seed(0)
    a, b = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    with mode:
        (a @ b).relu().sum()
    assert mode.reference == "cpu"
    assert mode.first is None, mode.summary()["worst"][:2]
    assert mode.summary()["references"] == {"cpu": mode.counts["compared"]}
    assert all(label.startswith("cuda:") for label in mode.summary()["targets"])


@pytest.mark.gpu
def test_cuda_overflow_on_both_devices_is_precision():
    import torch

    _needs_cuda()
    _, mode = _shadow(reference="auto")
    x = torch.full((8,), 20.0, device="cuda", dtype=torch.float16)
    with mode:
        torch.exp(x)  # e^20 > 65504 on the GPU and on the CPU alike
    first = mode.first
    assert first["nonfinite_only_on"] == "target"
    assert first["reference"] == "cpu-float64"
    assert first["target"] == "cuda:0-float16"


@pytest.mark.gpu
def test_cuda_script_end_to_end(nandoctor):
    _needs_cuda()
    result = nandoctor("compare-devices", "device_cuda_mlp.py", "--steps", "2")
    assert result.exit_code == 0, result.stdout + result.stderr
    stage = result.report["stages"]["device_compare"]
    assert stage["reference"] == "cpu"
    assert stage["target"].startswith("cuda:")
    assert stage["first_divergence"] is None
    sides = stage["loss_trajectories"]
    assert set(sides) == {"cpu", stage["target"]}
    assert len(sides["cpu"]) == len(sides[stage["target"]]) == 5
    assert "agree" in stage["run_comparison"]["verdict"]


def test_a_precision_cause_made_by_autocast_leads_with_the_autocast_line(nandoctor, no_verify):
    script = "autocast_fp16_overflow.py"
    result = nandoctor("run", script, "--stages", "anomaly,device_compare", *no_verify)
    assert result.exit_code == 1
    report = result.report
    assert report["run"]["precisions"][0]["autocast"] == ["cpu:float16"]
    cause = report["causes"][0]
    assert cause["category"] == "precision"
    assert cause["location"]["line"] == line_of(script, "with torch.autocast(")
    assert any("inside the autocast region entered at" in e for e in cause["evidence"])


def test_an_autocast_dtype_named_elsewhere_leads_with_where_it_is_written(nandoctor, no_verify):
    script = "autocast_dtype_named.py"
    result = nandoctor("run", script, "--stages", "anomaly,device_compare", *no_verify)
    assert result.exit_code == 1
    cause = result.report["causes"][0]
    assert cause["category"] == "precision"
    assert cause["location"]["line"] == line_of(script, "# fix here")
    entered = line_of(script, "with torch.autocast(")
    assert any("region is entered at" in e and f":{entered}" in e for e in cause["evidence"])


def test_a_precision_chosen_by_an_option_leads_with_that_option(nandoctor, no_verify):
    # `--precision` defaults to "16-true" and the script casts its model to float16 for it: that
    # default is what the user edits; the op that overflowed stays as evidence.
    script = "precision_option_half.py"
    result = nandoctor("run", script, "--stages", "anomaly,device_compare", *no_verify)
    assert result.exit_code == 1
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("precision", "PR401")
    assert cause["location"]["line"] == line_of(script, "# fix here")
    op_line = line_of(script, "weights = logits.exp()")
    assert any("failed in it is at" in e and f":{op_line}" in e for e in cause["evidence"])


def test_an_eps_that_rounds_away_under_autocast_leads_with_the_formula(nandoctor):
    # The script enters the float16 region itself, but what breaks is the formula's own eps
    # (1e-8 is 0 in float16): the line to edit is the formula's, and the re-run computes that
    # line, and nothing else, in float32.
    script = "autocast_eps_at_the_op.py"
    result = nandoctor("run", script, "--stages", "anomaly,device_compare")
    assert result.exit_code == 1
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("precision", "PR401")
    assert cause["location"]["line"] == line_of(script, "# the eps rounds away here")
    assert cause["verified_fix"] is True
    assert any(f"line {cause['location']['line']} computed in float32" in e
               for e in cause["evidence"])  # fmt: skip


def test_a_constant_the_reduced_dtype_cannot_hold_leads_with_the_formula(nandoctor):
    # `scores + (1 - mask) * -1e9` under float16 autocast: -1e9 is -inf in float16, whatever
    # the scores hold. The formula's constant is what to edit, not the autocast region.
    script = "autocast_fp16_mask_constant.py"
    result = nandoctor("run", script, "--stages", "anomaly,device_compare")
    assert result.exit_code == 1
    first = result.report["first_nonfinite"]
    assert (first["op"], first["kind"], first["dtype"]) == (
        "aten.mul.Tensor",
        "constant_overflow",
        "float16",
    )
    assert "the constant -1e+09" in first["explanation"]
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("precision", "PR401")
    assert cause["location"]["line"] == line_of(script, "scores = scores + (1.0 - mask")
    assert cause["verified_fix"] is True
    assert "torch.finfo(scores.dtype).min" in cause["fix"]


def test_a_value_rounded_away_before_the_ops_line_is_verified_with_the_model_in_float32(
    nandoctor,
):
    # float16 softmax probabilities underflow to 0 one line before the log: that line in float32
    # cannot bring them back; the run with the model kept in float32 trains, and says so
    script = "half_softmax_underflow_then_log.py"
    result = nandoctor("run", script, "--stages", "anomaly,device_compare")
    assert result.exit_code == 1
    cause = result.report["causes"][0]
    assert (cause["category"], cause["code"]) == ("precision", "PR401")
    assert cause["location"]["line"] == line_of(script, "# log(0) = -inf")
    assert cause["verified_fix"] is True
    assert any("computed in float32" in e and "still non-finite" in e for e in cause["evidence"])
    assert any("the model kept in float32: finite" in e for e in cause["evidence"])
    assert cause["fix"].startswith("verified with the model kept in float32")
