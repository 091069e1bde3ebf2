"""Scripts that fight back: each gets a clear outcome, the documented exit code, a report on
disk, and no user file changed by any re-run."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import SCRIPTS, processes_mentioning, run_cli, validate_report

ANOMALY = ("--stages", "anomaly")


def test_except_exception_pass_cannot_swallow_the_stop(nandoctor):
    result = nandoctor("run", "swallows_exceptions.py", *ANOMALY)
    assert result.exit_code == 1
    first = result.report["first_nonfinite"]
    assert (first["op"], first["step"], first["location"]["line"]) == ("aten.log.default", 3, 12)
    assert "training finished" not in result.stdout


@pytest.mark.parametrize("how", ["os._exit", "segfault"])
def test_what_was_seen_survives_a_hard_exit(nandoctor, how):
    args = ["--segfault"] if how == "segfault" else []
    result = nandoctor("run", "exits_hard_after_nan.py", *ANOMALY, script_args=args)
    assert result.exit_code == 1
    report = result.report
    assert report["status"] == "nonfinite"
    assert report["first_nonfinite"]["op"] == "aten.div.Tensor"
    assert report["first_nonfinite"]["step"] == 2
    assert report["run"]["ended"].startswith("crashed")


def test_ctrl_c_stops_the_child_and_writes_the_partial_report(tmp_path):
    marker, report_path = tmp_path / "stepped", tmp_path / "report.json"
    command = [sys.executable, "-m", "nandoctor", "run", str(SCRIPTS / "hangs.py"), *ANOMALY,
               "--json", str(report_path), "--", str(marker)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), "the script never reached its first step"
    time.sleep(0.2)  # the marker is written, perhaps not yet closed
    process.send_signal(signal.SIGINT)
    stdout, _ = process.communicate(timeout=60)
    assert process.returncode == 130
    report = json.loads(report_path.read_text())
    validate_report(report)
    assert report["run"]["ended"] == "interrupted"
    assert report["run"]["interrupted_by"] == "SIGINT"
    assert report["run"]["steps_observed"] == 1
    assert _gone(int(marker.read_text()))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _start_in_own_temp(command: list[str], tmp_path):
    """nandoctor with a temp folder of its own, so its scratch folders can be counted."""
    temp = tmp_path / "temp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)  # fmt: skip
    return process, temp


def _scratch_left(temp) -> list[str]:
    """nandoctor's own folders in the temp folder (torch keeps a compile cache there too)."""
    return [path.name for path in temp.iterdir() if path.name.startswith("nandoctor")]


def _wait_for(condition, seconds: float = 120) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.2)  # written, perhaps not yet closed
    return condition()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_the_child_clean_up_and_write_the_report(tmp_path, sig, code):
    marker, report_path = tmp_path / "stepped", tmp_path / "report.json"
    command = [sys.executable, "-m", "nandoctor", "run", str(SCRIPTS / "hangs.py"), *ANOMALY,
               "--json", str(report_path), "--", str(marker)]  # fmt: skip
    process, temp = _start_in_own_temp(command, tmp_path)
    assert _wait_for(marker.exists), "the script never reached its first step"
    process.send_signal(sig)
    process.communicate(timeout=60)
    assert process.returncode == code
    report = json.loads(report_path.read_text())
    validate_report(report)
    assert report["run"]["ended"] == "interrupted"
    assert report["run"]["interrupted_by"] == sig.name
    assert _gone(int(marker.read_text())), "the watched script is still running"
    assert _scratch_left(temp) == [], "scratch folders were left behind"


def _running_candidates(temp) -> list[int]:
    """Pids of the sweep candidates that have started their script: started from step 0 or
    resumed from a rewind point, each says so in its events."""
    pids = []
    for events in temp.glob("nandoctor-*/lr_sweep/lr_sweep-*.events.jsonl"):
        with contextlib.suppress(OSError, ValueError, IndexError):  # not written yet
            start = json.loads(events.read_text().splitlines()[0])
            pids.append(start["pid"])
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")
def test_sigterm_during_a_sweep_ends_every_candidate(tmp_path):
    report_path = tmp_path / "report.json"
    command = [sys.executable, "-m", "nandoctor", "sweep-lr",
               str(SCRIPTS / "hangs_below_full_lr.py"), "--jobs", "2", "--json", str(report_path)]  # fmt: skip
    process, temp = _start_in_own_temp(command, tmp_path)
    assert _wait_for(lambda: len(_running_candidates(temp)) >= 2), "no two candidates were running"
    candidates = _running_candidates(temp)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 143
    report = json.loads(report_path.read_text())
    validate_report(report)
    assert report["run"]["interrupted_by"] == "SIGTERM"
    assert _wait_for(lambda: all(_gone(pid) for pid in candidates), seconds=5), (
        "a sweep candidate is still running")  # fmt: skip
    assert _wait_for(lambda: not processes_mentioning(str(temp)), seconds=5), (
        "a process nandoctor started (a run, a rewind point) is still running")  # fmt: skip
    assert _scratch_left(temp) == [], "scratch folders were left behind"


def test_paths_with_spaces_and_non_ascii(tmp_path):
    folder = tmp_path / "my experiments ü"
    folder.mkdir()
    script = folder / "tràin log zero.py"
    shutil.copy(SCRIPTS / "log_zero_loss.py", script)
    result = run_cli("run", str(script), *ANOMALY, json_path=tmp_path / "r.json", cwd=folder)
    assert result.exit_code == 1, result.stderr
    location = result.report["first_nonfinite"]["location"]
    assert location["file"] == str(script) and location["line"] == 14


def test_re_runs_leave_the_users_files_as_the_watched_run_left_them(nandoctor, tmp_path):
    out = tmp_path / "run-output"
    out.mkdir()
    result = nandoctor("run", "writes_files.py", *ANOMALY, script_args=[str(out)])
    assert result.exit_code == 1
    # the localizing replay and the verification re-run happened (clamping the log's input
    # keeps it finite but the loss diverges, so that fix is honestly reported as not enough)...
    assert result.report["run"]["localized"] == "replayed"
    assert result.report["causes"][0]["verified_fix"] is False
    # ...and wrote nothing here: one run's worth of log lines, the watched run's checkpoint
    lines = (out / "train.log").read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["0", "1", "2", "3"]
    import torch

    assert torch.load(out / "last.pt")["step"] == 3
    assert sorted(os.listdir(out)) == ["last.pt", "train.log"]


def test_a_failing_stage_is_reported_and_the_others_still_run(monkeypatch, tmp_path):
    from nandoctor import diagnose
    from nandoctor.config import load_config
    from nandoctor.runner import RunOutcome
    from nandoctor.stages import StageContext
    from nandoctor.target import Target

    class Broken:
        @staticmethod
        def run(context):
            raise RuntimeError("probe lost")

    real = diagnose.stage_module
    monkeypatch.setattr(diagnose, "stage_module",
                        lambda name: Broken if name == "data_scan" else real(name))  # fmt: skip
    watch = RunOutcome(events=[{"event": "end", "outcome": "finished"}])
    context = StageContext(Target("t.py"), load_config(), str(tmp_path), watch)
    assert diagnose.run_stages(context, ("data_scan", "anomaly"), lambda text: None)
    assert context.earlier["data_scan"].result.status == "failed"
    assert "RuntimeError: probe lost" in context.earlier["data_scan"].result.summary
    assert context.earlier["anomaly"].result.status == "ran"


def test_a_reader_that_closes_early_keeps_the_exit_code_and_the_report(tmp_path):
    """`nandoctor run … | head -1`, or a terminal closed by SIGHUP: the pipe breaks while the
    report prints, and the status's exit code and the JSON must survive it."""
    report_path = tmp_path / "report.json"
    # an inconclusive run: its exit code 4 cannot be mistaken for the 1 of a broken pipe
    command = [sys.executable, "-m", "nandoctor", "run", str(SCRIPTS / "healthy_mlp.py"),
               *ANOMALY, "--max-steps", "3", "--json", str(report_path)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    process.stdout.read(10)
    process.stdout.close()
    assert process.wait(timeout=120) == 4
    report = json.loads(report_path.read_text())
    validate_report(report)
    assert report["status"] == "inconclusive"
