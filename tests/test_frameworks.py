"""Scripts written with the Hugging Face Trainer, Lightning and accelerate, run unmodified
through the CLI (tiny models built from configs; nothing downloaded)."""

from __future__ import annotations

import pytest

from conftest import line_of

pytestmark = pytest.mark.slow


def test_a_hand_written_loss_in_a_trainer_subclass(nandoctor):
    pytest.importorskip("transformers")
    script = "hf_trainer_log_sigmoid.py"
    result = nandoctor("run", script, timeout=900)
    assert result.exit_code == 1, result.stderr[-2000:]
    top = result.report["causes"][0]
    assert (top["category"], top["code"]) == ("invalid_operation", "IO105")
    assert top["location"]["line"] == line_of(script, "torch.log(p)")
    assert result.report["first_nonfinite"]["phase"] == "forward"
    # the fix shown is the line rewritten with the guard the re-run used
    assert top["verified_fix"] is True
    assert "torch.log(p.clamp_min(1e-12))" in top["fix"]
    assert any(
        "re-ran with line" in line and "clamp_min(1e-12)" in line for line in top["evidence"]
    )


def test_a_trainer_learning_rate_is_named_where_training_arguments_set_it(nandoctor):
    # The Trainer builds the optimizer inside trainer.train(): the line to edit is
    # `learning_rate=` in TrainingArguments. (Its default logging_nan_inf_filter logs the NaN
    # losses as 0.)
    pytest.importorskip("transformers")
    script = "hf_trainer_lr_typo.py"
    result = nandoctor("run", script, "--stages", "anomaly", timeout=900)
    assert result.exit_code == 1, result.stderr[-2000:]
    top = result.report["causes"][0]
    assert (top["category"], top["code"]) == ("learning_rate", "LR602")
    assert top["location"]["line"] == line_of(script, "learning_rate=2e5")
    assert top["verified_fix"] is True
    assert "`learning_rate`" in top["fix"]
    assert any(str(line_of(script, "trainer.train()")) in line for line in top["evidence"])


def test_lightning_runs_the_step_in_a_closure_and_the_data_is_still_found(nandoctor):
    pytest.importorskip("lightning")
    script = "lightning_constant_feature.py"
    result = nandoctor("run", script, "--profile", "quick", timeout=900)
    assert result.exit_code == 1, result.stderr[-2000:]
    top = result.report["causes"][0]
    assert top["category"] == "data"
    assert result.report["first_nonfinite"]["phase"] == "data"
    # the line where numpy made the NaN (0/0 of the constant column), not where it entered torch
    assert top["location"]["line"] == line_of(script, "/ x.std(axis=0)")
    assert any(
        "entered torch at" in line and str(line_of(script, "torch.from_numpy(x)")) in line
        for line in top["evidence"]
    )


def test_accelerate_bf16_mixed_precision_that_trains_is_healthy(nandoctor):
    pytest.importorskip("accelerate")
    result = nandoctor("run", "accelerate_bf16_healthy.py", timeout=900)
    assert result.exit_code == 0, result.stderr[-2000:]
    assert result.report["status"] == "healthy"
    assert result.report["causes"] == []
