"""Re-runs resume from a rewind point shortly before the failure: the report says where each
started and why, the verdict is the one a run from step 0 gives, the user's open files stay
untouched, nothing is left running, and a point that cannot be taken falls back to step 0."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import SCRIPTS, line_of, processes_mentioning, run_cli

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fdinfo").exists(), reason="rewind points need Linux (/proc, fork)"
)

# Points are due every 5 % of the run's time; a test run lasts a second or two.
FAST_POINTS = "rewind:\n  min_interval_s: 0.05\n"


def _diagnose(
    request,
    tmp_path: Path,
    script: str,
    *script_args: str,
    config: str = FAST_POINTS,
    options: tuple[str, ...] = (),
):
    config_path = tmp_path / "config.yaml"
    config_path.write_text(config)
    # nandoctor's own temp folder: its processes name it. A short path: DataLoader workers
    # hand tensors over through a Unix socket in the temp folder, whose path has a length limit.
    temp = Path(tempfile.mkdtemp(prefix="nd-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    result = run_cli("run", str(SCRIPTS / script), "--config", str(config_path), *options, "--",
                     *script_args, json_path=tmp_path / "report.json", cwd=tmp_path,
                     env={"TMPDIR": str(temp)})  # fmt: skip
    return result, temp


def _none_left(temp: Path) -> bool:
    """No process nandoctor started is alive: every run, point and resumed run names its
    options file in nandoctor's temp folder. A point notices within a poll that its nandoctor
    is gone."""
    deadline = time.monotonic() + 5
    while processes_mentioning(str(temp)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not processes_mentioning(str(temp))


def test_replay_and_fix_resume_from_a_point_and_leave_the_users_open_log_alone(request, tmp_path):
    log = tmp_path / "train.log"
    result, temp = _diagnose(request, tmp_path, "rewind_open_log.py", str(log),
                             options=("--keep-workdir",))  # fmt: skip
    assert result.exit_code == 1, result.stdout + result.stderr
    report = result.report
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"]) == (300, "data")
    assert first["location"]["line"] == line_of("rewind_open_log.py", "torch.log(")
    top = report["causes"][0]
    assert top["category"] == "data" and top["verified_fix"] is True
    reruns = {r["run"]: r for r in report["run"]["reruns"]}
    replay = next(r for name, r in reruns.items() if name.startswith("replay-from-299-resumed"))
    fix = reruns["verify-0"]
    assert 0 < replay["from_step"] <= 299
    assert replay["why"] == f"from the rewind point at step {replay['from_step']}"
    assert 0 < fix["from_step"] <= 299
    assert any(f"from the rewind point at step {fix['from_step']}" in line
               for line in top["evidence"])  # fmt: skip
    assert report["run"]["rewind_points"]
    # The watched run wrote steps 0-299 to the log it held open; the resumed re-runs wrote
    # theirs to private copies.
    lines = log.read_text().splitlines()
    assert len(lines) == 300 and lines[-1].startswith("step 299 ")
    # The resumed runs computed with the watched run's threads, not one
    workdir = next(temp.glob("nandoctor-*"))
    threads = _first(workdir / "watch.events.jsonl", "end")["threads"]
    assert _first(workdir / f"{replay['run']}.events.jsonl", "end")["threads"] == threads
    assert _first(workdir / "verify-0.events.jsonl", "end")["threads"] == threads
    assert _none_left(temp), "a rewind point or a re-run is still running"


_FORK_AFTER_PARALLEL_OPS = """
import os, sys, torch
from nandoctor.child.rewind import release_openmp_threads

torch.set_num_threads(2)
a = torch.randn(512, 512)
ref = float((a @ a + a.exp()).sum())  # the parent's OpenMP pool now exists
assert release_openmp_threads()
pid = os.fork()
if pid == 0:
    torch.set_num_threads(2)
    got = [float((a @ a + a.exp()).sum()) for _ in range(2)]
    print(got, ref, file=sys.stderr)
    # the same values as the parent's up to rounding: a reduction split over another number
    # of threads may round differently
    print(all(abs(value - ref) <= 1e-5 * abs(ref) for value in got), torch.get_num_threads(),
          flush=True)
    os._exit(0)
os.waitpid(pid, 0)
(a @ a).sum()  # and the parent starts a new one
print("parent", flush=True)
"""


def test_a_fork_after_the_openmp_threads_are_released_computes_on_several_threads(tmp_path):
    # Without the release, the copy's first parallel op waits forever for its parent's pool
    script = tmp_path / "fork.py"
    script.write_text(_FORK_AFTER_PARALLEL_OPS)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "2", "parent"], done.stderr


def test_a_sweep_from_a_point_names_the_learning_rate_it_would_from_step_0(request, tmp_path):
    # Three points a fifth of the run apart: one lies 40 steps or more before the failure,
    # however fast the machine runs the steps.
    config = ("rewind:\n  min_interval_s: 0.05\n  interval_fraction: 0.2\n  keep: 3\n"
              "lr_sweep:\n  rewind_min_lead: 40\n")  # fmt: skip
    result, temp = _diagnose(request, tmp_path, "rewind_warmup_peak.py", config=config)
    assert result.exit_code == 1, result.stdout + result.stderr
    report = result.report
    sweep = report["stages"]["lr_sweep"]
    assert sweep["status"] == "ran", sweep["summary"]
    assert sweep["from_step"] > 0
    assert sweep["summary"].startswith(
        f"candidates resumed from the rewind point at step {sweep['from_step']}"
    )
    top = report["causes"][0]
    assert top["category"] == "learning_rate" and top["verified_fix"] is True
    assert top["location"]["line"] == line_of("rewind_warmup_peak.py", "torch.optim.SGD(")
    assert _none_left(temp)


def test_dataloader_workers_refuse_a_point_and_every_rerun_starts_from_step_0(request, tmp_path):
    result, temp = _diagnose(request, tmp_path, "rewind_loader_workers.py")
    assert result.exit_code == 1, result.stdout + result.stderr
    report = result.report
    refused = report["run"]["rewind_refused"]
    assert "child processes" in refused["reason"] and "DataLoader workers" in refused["reason"]
    assert "rewind_points" not in report["run"]
    reruns = report["run"]["reruns"]
    assert reruns and all(r["from_step"] == 0 for r in reruns)
    assert all(r["why"].startswith("from step 0: no rewind point could be taken") for r in reruns)
    top = report["causes"][0]
    assert top["category"] == "data" and top["verified_fix"] is True
    assert report["first_nonfinite"]["step"] == 300
    assert _none_left(temp)


def test_with_points_switched_off_every_rerun_starts_from_step_0(request, tmp_path):
    result, _ = _diagnose(request, tmp_path, "rewind_open_log.py", str(tmp_path / "train.log"),
                          config="rewind:\n  enabled: false\n")  # fmt: skip
    assert result.exit_code == 1
    report = result.report
    assert report["run"]["reruns"] and all(r["from_step"] == 0 for r in report["run"]["reruns"])
    assert report["causes"][0]["category"] == "data"
    assert report["first_nonfinite"]["step"] == 300


def _first(path: Path, kind: str) -> dict:
    return next(e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind)


def _run_parents(workdir: Path) -> dict[str, int]:
    """Each run's parent process, by run name, from its `start` event."""
    return {path.name.removesuffix(".events.jsonl"): _first(path, "start")["parent"]
            for path in workdir.rglob("*.events.jsonl")}  # fmt: skip


def test_reruns_from_step_0_fork_from_a_copy_taken_before_the_script_ran(request, tmp_path):
    # AdamW's weight decay blows the run up at step 15, before any point 20 steps ahead of it:
    # the sweep's candidates and the fix's re-run (its optimizer rebuilt) start from step 0
    result, temp = _diagnose(request, tmp_path, "adamw_decay_typo.py",
                             options=("--keep-workdir",))  # fmt: skip
    assert result.exit_code == 1, result.stdout + result.stderr
    report = result.report
    top = report["causes"][0]
    assert (top["category"], top["verified_fix"]) == ("optimizer_config", True)
    workdir = next(temp.glob("nandoctor-*"))
    copy = _first(workdir / "watch.events.jsonl", "fresh_starts")["pid"]
    from_step_0 = [r["run"] for r in report["run"]["reruns"] if r["from_step"] == 0]
    assert "verify-0" in from_step_0 and any(n.startswith("lr_sweep-") for n in from_step_0)
    parents = _run_parents(workdir)
    assert all(parents[name] == copy for name in from_step_0)
    assert _none_left(temp)

    # switched off, each starts as a new interpreter, and the verdict is the same
    result, temp = _diagnose(request, tmp_path, "adamw_decay_typo.py",
                             config="rewind:\n  fresh_starts: false\n",
                             options=("--keep-workdir", "--stages", "anomaly"))  # fmt: skip
    top = result.report["causes"][0]
    assert (top["category"], top["verified_fix"]) == ("optimizer_config", True)
    workdir = next(temp.glob("nandoctor-*"))
    assert "fresh_starts" not in (workdir / "watch.events.jsonl").read_text()
    assert _run_parents(workdir)["verify-0"] != copy


_OPEN_FILES = """
import sys
from nandoctor.child.rewind import private_copies_of_open_files

user_file, scratch = sys.argv[1], sys.argv[2]
log = open(user_file, "a")
log.write("watched\\n")
log.flush()
copied = private_copies_of_open_files(scratch, keep=())
log.write("resumed\\n")
log.flush()
print(copied)
"""


def test_files_held_open_for_writing_get_private_copies_at_the_same_offset(request, tmp_path):
    """What a resumed run does first: each writable file the watched run held open is copied
    into the scratch folder and the descriptor pointed at the copy, same offset."""
    import subprocess
    import sys

    user_file, scratch = tmp_path / "train.log", tmp_path / "scratch"
    user_file.write_text("before\n")
    done = subprocess.run([sys.executable, "-c", _OPEN_FILES, str(user_file), str(scratch)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert str(user_file) in done.stdout
    assert user_file.read_text() == "before\nwatched\n"
    copy = scratch / "open-files" / str(user_file).lstrip("/")
    assert copy.read_text() == "before\nwatched\nresumed\n"


def test_no_point_is_taken_while_the_loss_runs_away():
    """A point taken after the loss began to rise hands every re-run weights (and momentum)
    already thrown out of range: a smaller rate or a clip tried from it fails for that alone.
    Points resume once the loss is back down, or once a higher level has lasted the window's
    length (the run's new normal); negative losses have no scale to compare."""
    from nandoctor.child.rewind import RewindKeeper

    keeper = RewindKeeper(session=None, settings={"runaway_factor": 3.0})
    healthy = [2.0, 1.5, 1.2, 1.0, 0.9, 1.1, 0.8]
    assert not any(keeper._running_away(loss) for loss in healthy)
    rising = [keeper._running_away(loss) for loss in (2.0, 3.0, 5.0, 9.0, 20.0, 40.0)]
    # the median of the last five (lowest 1.0) goes 1, 1.1, 2, 3, then 5: past 3x
    assert rising == [False, False, False, False, True, True]
    assert keeper._running_away(float("nan"))
    # back down once most of the last five are
    assert [keeper._running_away(0.8) for _ in range(5)] == [True, True, False, False, False]
    assert not any(RewindKeeper(None, {})._running_away(-v) for v in (1.0, 5.0, 50.0, 500.0))
    # a loss that rose and stays up: once the window holds only the higher level, it is the new
    # normal; a slow drift (3x over 1,000 steps) never counts
    stays_up = RewindKeeper(None, {})
    held = [stays_up._running_away(v) for v in [1.0] * 60 + [4.0] * 200]
    assert held[62:150] == [True] * 88 and not any(held[170:])
    drifting = RewindKeeper(None, {})
    assert not any(drifting._running_away(1.0 + 3.0 * i / 1000) for i in range(1000))


def test_a_runaway_factor_at_or_below_1_is_refused():
    """At 1 or below every step would count as running away, and no point would ever be taken."""
    from nandoctor.config import load_config
    from nandoctor.errors import ConfigError

    assert load_config("standard").rewind.runaway_factor == 3.0
    with pytest.raises(ConfigError, match="runaway_factor"):
        load_config("standard", overrides={"rewind": {"runaway_factor": 1.0}})
