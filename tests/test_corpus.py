"""The labelled accuracy corpus: each split's manifest matches its files (no nandoctor runs
here). The dev split is `corpus/manifest.yaml`, the test split `corpus/test/manifest.yaml`."""

from collections import Counter
from pathlib import Path

import pytest
import yaml

from nandoctor.report.model import CATEGORIES as MODEL_CATEGORIES

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "corpus"
CATEGORIES = set(MODEL_CATEGORIES)
PHASES = {None, "data", "forward", "backward", "optimizer"}


SPLITS = {"dev": CORPUS, "test": CORPUS / "test"}


def _entries(split: str = "dev") -> list[dict]:
    manifest = SPLITS[split] / "manifest.yaml"
    if not manifest.exists():
        pytest.skip(f"no {split} split")
    return yaml.safe_load(manifest.read_text())["scripts"]


@pytest.mark.parametrize("split", SPLITS)
def test_every_entry_points_at_a_script_and_a_real_culprit_line(split):
    for entry in _entries(split):
        script = SPLITS[split] / entry["path"]
        assert script.is_file(), entry["path"]
        assert entry["category"] in CATEGORIES | {"healthy"}, entry
        assert entry.get("phase") in PHASES, entry
        assert set(entry.get("requires") or ()) <= {
            "cuda",
            "transformers",
            "lightning",
            "accelerate",
            "timm",
        }, entry
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


@pytest.mark.parametrize("split", SPLITS)
def test_every_script_is_listed_once(split):
    listed = [entry["path"] for entry in _entries(split)]
    assert len(listed) == len(set(listed))
    folder = SPLITS[split]
    on_disk = {p.relative_to(folder).as_posix() for p in folder.glob("*/*.py")
               if p.parent.name != "test"}  # fmt: skip
    # a public script vendored with its modules: the entry names its main file in a folder
    in_folders = {path for path in listed if path.count("/") == 2}
    assert on_disk == set(listed) - in_folders
    assert all((folder / path).is_file() for path in in_folders)


@pytest.mark.parametrize("split", SPLITS)
def test_scripts_sit_in_the_folder_of_their_category(split):
    for entry in _entries(split):
        assert Path(entry["path"]).parts[0] == entry["category"], entry


def test_every_sick_test_script_cites_the_public_report_it_reproduces():
    for entry in _entries("test"):
        if entry["category"] == "healthy":
            continue
        assert str(entry.get("source", "")).startswith("http"), entry
        assert entry.get("fix"), entry


def test_scripts_written_with_frameworks_and_public_scripts_run_unmodified():
    entries = _entries() + _entries("test")
    sick = [e for e in entries if e["category"] != "healthy"]
    frameworks = Counter(e["framework"] for e in sick if e.get("framework"))
    assert sum(frameworks.values()) >= 15, frameworks
    assert set(frameworks) >= {"transformers", "lightning", "accelerate"}
    assert sum(bool(e.get("public_script")) for e in entries) >= 3
    public = [e for e in sick if str(e.get("source", "")).startswith("http")]
    assert len(public) >= 40


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
