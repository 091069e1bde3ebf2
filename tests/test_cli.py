"""The CLI as a user meets it: bad input, exit codes, budgets, the script run as `python` would."""

import json
import subprocess
import sys

import pytest

from conftest import SCRIPTS, run_cli

ANOMALY = ("--stages", "anomaly")


def test_help_is_instant_and_does_not_import_torch():
    code = (
        "import runpy, sys; sys.argv = ['nandoctor', '--help']\n"
        "try:\n    runpy.run_module('nandoctor', run_name='__main__')\n"
        "except SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "run" in done.stdout
    assert done.stdout.strip().endswith("NO-TORCH")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.py", "script not found"),
        (lambda d: d, "is a directory"),
        (lambda d: _write(d / "weights.bin", b"\x00\x01\x02"), "not a Python source file"),
        (lambda d: _write(d / "broken.py", b"import torch\nx = (\n"), "syntax error at line 2"),
    ],
)
def test_unusable_script_is_a_one_line_usage_error(tmp_path, make, message):
    result = run_cli("run", str(make(tmp_path)), json_path=tmp_path / "r.json")
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


def _write(path, data: bytes):
    path.write_bytes(data)
    return path


def test_script_error_is_reported_with_the_users_frames(nandoctor):
    result = nandoctor("run", "raises_before_training.py", *ANOMALY)
    assert result.exit_code == 3
    report = result.report
    assert report["status"] == "script_error"
    error = report["run"]["script_error"]
    assert error["type"] == "FileNotFoundError"
    assert error["location"]["line"] == 7
    assert "runpy" not in error["traceback"] and "nandoctor" not in error["traceback"]
    assert "raised FileNotFoundError" in result.stdout


@pytest.mark.parametrize(
    ("code", "exit_code", "status"), [("0", 0, "healthy"), ("3", 3, "script_error")]
)
def test_sys_exit_in_the_script(nandoctor, code, exit_code, status):
    result = nandoctor("run", "exits_midway.py", *ANOMALY, script_args=[code])
    assert result.exit_code == exit_code
    assert result.report["status"] == status
    assert result.report["run"]["steps_observed"] == 3


def test_script_without_optimizer_still_gets_a_report(nandoctor):
    result = nandoctor("run", "no_optimizer.py", *ANOMALY)
    assert result.exit_code == 0
    assert result.report["run"]["steps_observed"] == 0
    assert result.report["run"]["backward_calls"] == 3
    assert "no optimizer step was observed" in result.stdout


def test_timeout_stops_a_hanging_script(nandoctor):
    result = nandoctor("run", "hangs.py", *ANOMALY, "--timeout", "20")
    assert result.exit_code == 3
    assert result.report["status"] == "timeout"
    assert result.report["run"]["steps_observed"] == 1


def test_max_steps_bounds_the_watch(nandoctor):
    result = nandoctor("run", "healthy_mlp.py", *ANOMALY, "--max-steps", "7")
    assert result.report["run"]["steps_observed"] == 7
    assert result.report["run"]["ended"] == "stopped"


def test_script_runs_as_python_would(tmp_path):
    record = tmp_path / "record.json"
    script = SCRIPTS / "env_probe.py"
    args = ["--record", str(record), "--flag", "a b", "ünï"]
    result = run_cli("run", str(script), *ANOMALY, "--", *args, json_path=tmp_path / "r.json",
                     cwd=tmp_path)  # fmt: skip
    assert result.exit_code == 0, result.stdout + result.stderr
    seen = json.loads(record.read_text())
    assert seen["argv"] == [str(script), *args]
    assert seen["name"] == "__main__"
    assert seen["cwd"] == str(tmp_path)
    assert seen["path0"] == str(SCRIPTS)
    assert seen["batches"] == 8  # two epochs of four batches, through two DataLoader workers
    assert result.report["script"]["args"] == args


def test_unknown_stage_names_the_valid_ones(tmp_path):
    result = run_cli("run", str(SCRIPTS / "healthy_mlp.py"), "--stages", "anomaly,lr_swep")
    assert result.exit_code == 2
    assert "lr_swep" in result.stderr and "lr_sweep" in result.stderr


@pytest.mark.parametrize(
    "category",
    ["data", "learning_rate", "initialization", "invalid_operation", "exploding_gradients",
     "precision", "device", "optimizer_config"],
)  # fmt: skip
def test_explain_every_category(category):
    result = run_cli("explain", category)
    assert result.exit_code == 0
    assert "why it produces NaN/Inf" in result.stdout and "usual fixes" in result.stdout


def test_explain_unknown_category_lists_the_valid_ones():
    result = run_cli("explain", "gremlins")
    assert result.exit_code == 2
    assert "learning_rate" in result.stderr


def test_the_bundled_example_with_the_default_profile(tmp_path):
    """The README's first command: the whole checklist on examples/train_nan.py."""
    from conftest import ROOT

    result = run_cli("run", str(ROOT / "examples" / "train_nan.py"), json_path=tmp_path / "r.json")
    assert result.exit_code == 1
    report = result.report
    assert [c["category"] for c in report["causes"]] == ["invalid_operation"]
    assert report["causes"][0]["verified_fix"] is True
    assert report["causes"][0]["location"]["line"] == 21
    assert set(report["stages"]) == {
        "data_scan",
        "init_check",
        "anomaly",
        "lr_sweep",
        "device_compare",
    }
    assert report["stages"]["lr_sweep"]["status"] == "skipped"
