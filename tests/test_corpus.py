"""The labelled accuracy corpus: the manifest matches the files (no nandoctor runs here)."""

from collections import Counter
from pathlib import Path

import yaml

from nandoctor.report.model import CATEGORIES as MODEL_CATEGORIES

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
CATEGORIES = set(MODEL_CATEGORIES)
PHASES = {None, "data", "forward", "backward", "optimizer"}


def _entries() -> list[dict]:
    return yaml.safe_load((CORPUS / "manifest.yaml").read_text())["scripts"]


def test_every_entry_points_at_a_script_and_a_real_culprit_line():
    for entry in _entries():
        script = CORPUS / entry["path"]
        assert script.is_file(), entry["path"]
        assert entry["category"] in CATEGORIES | {"healthy"}, entry
        assert entry.get("phase") in PHASES, entry
        assert set(entry.get("requires") or ()) <= {"cuda"}, entry
        assert all(isinstance(arg, str) for arg in entry.get("args") or ()), entry
        nproc = entry.get("nproc_per_node", 1)
        assert type(nproc) is int and nproc >= 1, entry
        assert entry.get("why"), entry
        line = entry["culprit_line"]
        if entry["category"] == "healthy":
            assert line is None, entry
        elif line is not None:
            lines = script.read_text().splitlines()
            assert 1 <= line <= len(lines), entry
            assert lines[line - 1].strip(), f"{entry['path']}:{line} is blank"


def test_every_script_is_listed_once():
    listed = [entry["path"] for entry in _entries()]
    assert len(listed) == len(set(listed))
    on_disk = {str(p.relative_to(CORPUS)) for p in CORPUS.glob("*/*.py")}
    assert on_disk == set(listed)


def test_scripts_sit_in_the_folder_of_their_category():
    for entry in _entries():
        assert Path(entry["path"]).parts[0] == entry["category"], entry


def test_coverage_of_categories():
    counts = Counter(entry["category"] for entry in _entries())
    for category in CATEGORIES:
        assert counts[category] >= 2, category
    assert counts["healthy"] >= 5
    assert sum(n for c, n in counts.items() if c != "healthy") >= 20


def test_culprit_lines_on_most_buggy_scripts():
    buggy = [e for e in _entries() if e["category"] != "healthy"]
    with_line = [e for e in buggy if e["culprit_line"] is not None]
    assert len(with_line) >= len(buggy) - 2
