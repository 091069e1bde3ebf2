"""The run spine end to end: planted bugs are localized to their birth; healthy scripts stay quiet."""

import pytest

ANOMALY = ("--stages", "anomaly")


def _line_of(script_name: str, marker: str) -> int:
    from conftest import SCRIPTS

    lines = (SCRIPTS / script_name).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


@pytest.mark.parametrize(
    ("script", "phase", "op", "module", "marker", "why"),
    [
        ("log_zero_loss.py", "forward", "aten.log.default", None,
         "torch.log(probs", "log of 22 zero inputs"),
        ("div_zero_norm_module.py", "forward", "aten.div.Tensor", "encoder.layers.1",
         "return h / h.sum", "division by zero"),
        ("sqrt_backward.py", "backward", "aten.div.Tensor", None,
         "torch.sqrt((diff", "derivative of sqrt(x) is infinite at x = 0"),
        ("where_log_grad.py", "backward", "aten.div.Tensor", None,
         "torch.where(x > 0, torch.log(x)", "derivative of log(x) is infinite"),
        ("exp_overflow.py", "forward", "aten.exp.default", None,
         "e = torch.exp(logits)", "overflows float32"),
    ],
)  # fmt: skip
def test_birth_is_located(nandoctor, script, phase, op, module, marker, why):
    result = nandoctor("run", script, *ANOMALY)
    assert result.exit_code == 1, result.stderr
    report = result.report
    assert report["status"] == "nonfinite"
    first = report["first_nonfinite"]
    assert (first["phase"], first["op"], first["module"]) == (phase, op, module)
    assert first["location"]["file"].endswith(script)
    assert first["location"]["line"] == _line_of(script, marker)
    assert marker in first["location"]["code"]
    assert why in first["explanation"]
    assert first["step"] == 0
    assert report["causes"], "a non-finite run must name a cause"
    assert report["causes"][0]["location"]["line"] == first["location"]["line"]


def test_finite_loss_with_nan_gradient_is_caught(nandoctor):
    result = nandoctor("run", "where_log_grad.py", *ANOMALY)
    first = result.report["first_nonfinite"]
    assert first["reached"] == "the gradient of scale"
    cause = result.report["causes"][0]
    assert cause["category"] == "invalid_operation"
    assert "double-where" in cause["fix"]


def test_fix_rewrites_the_users_line(nandoctor):
    result = nandoctor("run", "log_zero_loss.py", *ANOMALY)
    assert (
        "torch.log(probs[torch.arange(32), y].clamp_min(1e-12))"
        in result.report["causes"][0]["fix"]
    )


@pytest.mark.parametrize("script", ["healthy_mlp.py", "healthy_masked_attention.py"])
def test_healthy_scripts_get_no_cause(nandoctor, script):
    result = nandoctor("run", script, *ANOMALY)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert result.report["status"] == "healthy"
    assert result.report["causes"] == []
    assert result.report["first_nonfinite"] is None
    assert result.report["run"]["steps_observed"] >= 10
