"""torch.compile'd scripts: the watched run keeps them compiled, replays with per-op checks run
them eagerly, and a failure that appears only compiled is compared with the eager run.

The scripts compile with the "eager" and "aot_eager" backends: dynamo traces them as it would
for inductor, and no C compiler is needed."""

from __future__ import annotations

import os

import pytest

from conftest import line_of

STAGES = ("--stages", "data_scan,init_check,anomaly,device_compare")


@pytest.fixture
def no_verify(tmp_path) -> tuple[str, str]:
    """Leave out the fix-verifying re-runs: these tests are about the watch and the replay."""
    config = tmp_path / "no-verify.yaml"
    config.write_text("verify:\n  max_fixes: 0\n")
    return ("--config", str(config))


# ---- end to end -----------------------------------------------------------------------------
def test_failure_seen_only_compiled_is_compared_with_the_eager_run(nandoctor):
    script = "compiled_only_softmax.py"
    result = nandoctor("run", script, *STAGES)
    assert result.exit_code == 1, result.stdout + result.stderr
    report = result.report
    assert report["status"] == "nonfinite"
    assert report["first_nonfinite"]["step"] == 3
    assert report["first_nonfinite"]["phase"] == "forward"
    notes = " ".join(report["run"]["notes"])
    assert "appears only when compiled" in notes
    assert "not deterministic" not in notes

    stage = report["stages"]["device_compare"]
    assert stage["status"] == "ran"
    compared = stage["compiled_vs_eager"]
    assert compared["first_differing_step"] == 3
    assert compared["compiled"]["first_nonfinite_step"] == 3
    assert compared["compiled"]["losses"][3] is None
    assert compared["eager"]["first_nonfinite_step"] is None
    assert len(compared["eager"]["losses"]) == 4
    assert all(loss is not None for loss in compared["eager"]["losses"])
    # the same math until the compiled path overflows: losses agree before step 3
    assert compared["max_relative_difference"] < compared["loss_rtol"]
    assert set(stage["loss_trajectories"]) == {"compiled", "eager"}

    cause = report["causes"][0]
    assert cause["category"] == "device"
    assert cause["stage"] == "device_compare"
    assert cause["verified_fix"] is True
    assert cause["location"]["line"] == line_of(script, "model = torch.compile(")
    assert "torch.compiler.disable" in cause["fix"]
    assert 'TORCHDYNAMO_REPRO_AFTER="aot"' in cause["fix"]
    # the anomaly stage, which could not localize an op, points the same way
    assert all(c["category"] != "invalid_operation" for c in report["causes"])
    assert "compiled vs eager" in result.stdout


def test_compiled_failure_that_also_fails_eagerly_is_localized_by_an_eager_replay(
    nandoctor, no_verify
):
    script = "compiled_log_zero.py"
    result = nandoctor("run", script, "--stages", "anomaly", *no_verify)
    assert result.exit_code == 1, result.stdout + result.stderr
    report = result.report
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"], first["op"]) == (3, "forward", "aten.log.default")
    assert first["location"]["line"] == line_of(script, "return torch.log(probs)")
    assert report["run"]["localized"] == "replayed"
    assert any("ran it eagerly (compile disabled)" in note for note in report["run"]["notes"])
    assert report["causes"][0]["category"] == "invalid_operation"


def test_healthy_compiled_script_gets_no_cause(nandoctor):
    result = nandoctor("run", "compiled_healthy.py", "--profile", "quick")
    assert result.exit_code == 0, result.stdout + result.stderr
    report = result.report
    assert report["status"] == "healthy"
    assert report["causes"] == []
    assert report["run"]["steps_observed"] == 6


# ---- the switch itself, in this process ------------------------------------------------------
def test_every_entry_point_of_torch_compile_runs_eagerly_when_disabled():
    import torch
    from torch import nn

    from nandoctor.instrument.hooks import HookSet

    compiling: list[bool] = []

    class Probe(nn.Module):
        def forward(self, x):
            compiling.append(torch.compiler.is_compiling())
            return x + 1

    x = torch.ones(2)
    torch.compile(Probe(), backend="eager")(x)
    assert compiling == [True]  # the control: compiled unless switched off

    hooks, calls = HookSet(), []
    hooks.compile_used(lambda: calls.append(1))
    hooks.compile_disabled()
    try:
        torch.compile(Probe(), backend="eager")(x)

        @torch.compile
        def bare(x):
            compiling.append(torch.compiler.is_compiling())
            return x * 2

        @torch.compile(mode="max-autotune")
        def with_mode(x):
            compiling.append(torch.compiler.is_compiling())
            return x * 3

        bare(x)
        with_mode(x)
        module = Probe()
        module.compile()
        module(x)
    finally:
        hooks.remove_all()
    assert compiling == [True, False, False, False, False]
    assert calls  # nandoctor heard of each entry point
    assert "TORCHDYNAMO_DISABLE" not in os.environ  # restored


# ---- the comparison, parent side -------------------------------------------------------------
def test_comparison_finds_the_first_step_where_losses_part():
    from nandoctor.runner import RunOutcome
    from nandoctor.stages.device_compare.compiled import compare_compiled_with_eager

    steps = [{"event": "step", "step": i, "loss": loss} for i, loss in enumerate([1.0, 0.9, 0.8])]
    watch = RunOutcome(events=[*steps, {"event": "nonfinite", "step": 3}])
    rerun = {"losses": [1.0, 0.9, 0.7, 0.6, 0.5], "first_nonfinite_step": None}
    compared = compare_compiled_with_eager(watch, rerun, loss_rtol=1e-3)
    assert compared["compiled"]["losses"] == [1.0, 0.9, 0.8, None]
    assert compared["eager"]["losses"] == [1.0, 0.9, 0.7, 0.6]
    assert compared["first_differing_step"] == 2
    assert "differed by more than 0.001 from step 2" in compared["verdict"]

    same = {"losses": [1.0, 0.9, 0.8, 0.7], "first_nonfinite_step": None}
    assert compare_compiled_with_eager(watch, same, 1e-3)["first_differing_step"] == 3
