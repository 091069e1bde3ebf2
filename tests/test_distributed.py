"""`--nproc-per-node`: scripts launched through torchrun (gloo on the CPU, 2 processes), every
rank watched, the rank that went non-finite first named, the ranks merged into one report."""

from __future__ import annotations

from conftest import line_of


def _ranks(report: dict) -> dict[int, dict]:
    return {summary["rank"]: summary for summary in report["run"]["ranks"]}


def test_the_rank_that_made_the_nan_comes_first_not_the_rank_it_reached(nandoctor):
    # Rank 1's backward makes the NaN; the all-reduce hands it to rank 0 in the same phase.
    result = nandoctor("run", "ddp_zero_row_norm.py", "--nproc-per-node", "2",
                       "--stages", "anomaly")  # fmt: skip
    assert result.exit_code == 1, result.stderr
    report = result.report
    first = report["first_nonfinite"]
    assert (first["rank"], first["step"], first["phase"]) == (1, 2, "backward")
    assert first["location"]["line"] == line_of("ddp_zero_row_norm.py", "torch.sqrt(")
    ranks = _ranks(report)
    assert ranks[1]["first"] and not ranks[0]["first"]
    assert ranks[0]["nonfinite"]["received"] is True
    assert ranks[0]["nonfinite"]["step"] == 2
    assert report["environment"]["world_size"] == 2
    assert "on rank 1 of 2" in result.stdout
    assert "rank 0: received NaN/Inf from another rank at step 2" in result.stdout


def test_a_data_problem_on_one_rank_through_the_whole_checklist(nandoctor, tmp_path):
    result = nandoctor("run", "ddp_rank_shard_std.py", "--nproc-per-node", "2",
                       "--report", str(tmp_path / "report.md"))  # fmt: skip
    assert result.exit_code == 1, result.stderr
    report = result.report
    std_line = line_of("ddp_rank_shard_std.py", "/ features.std(0)")
    first = report["first_nonfinite"]
    assert (first["rank"], first["step"], first["location"]["line"]) == (1, 3, std_line)
    top = report["causes"][0]
    assert top["category"] == "data"
    assert top["location"]["line"] == std_line
    # The collective is never re-run on the float64 reference: no precision false alarm.
    assert all(cause["category"] != "precision" for cause in report["causes"])
    ranks = _ranks(report)
    assert ranks[1]["first"] and ranks[1]["nonfinite"]["step"] == 3
    assert ranks[0]["nonfinite"] is None  # rank 1 stopped before the all-reduce of step 3
    assert ranks[0]["after_rank_stopped"] == 1  # its all-reduce lost rank 1: not a crash of its own
    assert "## Ranks" in (tmp_path / "report.md").read_text()


def test_healthy_ddp_script_gives_no_cause(nandoctor):
    result = nandoctor("run", "ddp_healthy.py", "--nproc-per-node", "2", "--stages", "anomaly")
    assert result.exit_code == 0, result.stdout + result.stderr
    report = result.report
    assert report["status"] == "healthy"
    assert report["causes"] == []
    assert report["first_nonfinite"] is None
    for summary in _ranks(report).values():
        assert summary["steps_observed"] == 8
        assert summary["ended"] == "finished"
        assert summary["nonfinite"] is None


def test_ranks_still_running_after_one_stopped_are_ended_after_the_grace(nandoctor, tmp_path):
    config = tmp_path / "grace.yaml"
    config.write_text("watch:\n  rank_grace_s: 1\n")
    result = nandoctor("run", "ranks_independent_log_zero.py", "--nproc-per-node", "2",
                       "--stages", "anomaly", "--config", str(config))  # fmt: skip
    assert result.exit_code == 1, result.stderr
    report = result.report
    first = report["first_nonfinite"]
    assert (first["rank"], first["step"]) == (1, 2)
    assert first["location"]["line"] == line_of("ranks_independent_log_zero.py", "torch.log(")
    ranks = _ranks(report)
    assert ranks[0]["left_behind"] is True
    assert ranks[0]["steps_observed"] < 400
    assert "waiting on a rank that had stopped" in result.stdout


def test_nproc_per_node_must_be_positive(nandoctor):
    result = nandoctor("run", "ddp_healthy.py", "--nproc-per-node", "0")
    assert result.exit_code == 2
    assert result.report is None
