"""Finding codes: the registry is complete and every code's fixture script makes it, as
pylint's functional tests do (one script per message, its expected output beside it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import ROOT, SCRIPTS, run_cli
from nandoctor.codes import CODES, PREFIXES, measured_confidence, record

SOURCE = ROOT / "src" / "nandoctor"


def _codes_in_source() -> set[str]:
    prefixes = "|".join(PREFIXES)
    pattern = re.compile(rf"\"((?:{prefixes})\d{{3}})\"")
    found = set()
    for path in SOURCE.rglob("*.py"):
        if path.name != "codes.py":
            found |= set(pattern.findall(path.read_text()))
    return found


def test_every_code_is_registered_once_and_documented():
    for code, entry in CODES.items():
        assert re.fullmatch(r"[A-Z]{2}\d{3}", code) and code[:2] in PREFIXES
        assert entry.claim and entry.evidence and entry.stage
        for fixture in entry.fixtures:
            assert (SCRIPTS / fixture).is_file(), f"{code}: no fixture {fixture}"


def test_every_code_the_source_makes_is_registered_and_every_registered_one_is_made():
    made = _codes_in_source()
    assert made - set(CODES) == set(), "codes made but not registered"
    assert set(CODES) - made == set(), "codes registered but never made"


def test_measured_confidence_moves_the_prior_towards_the_record():
    for code in CODES:
        seen = record(code)
        if seen and seen["seen"]:
            rate = seen["right"] / seen["seen"]
            moved = measured_confidence(code, 0.5)
            assert min(rate, 0.5) <= moved <= max(rate, 0.5)
        else:
            assert measured_confidence(code, 0.42) == 0.42


def _fixtures():
    for code, entry in CODES.items():
        for fixture in entry.fixtures:
            profile = entry.profile
            marks = [pytest.mark.gpu] if entry.category == "device" and "cuda" in fixture else []
            yield pytest.param(code, fixture, profile, id=f"{code}-{Path(fixture).stem}",
                               marks=marks)  # fmt: skip


@pytest.mark.parametrize(("code", "fixture", "profile"), list(_fixtures()))
def test_the_fixture_script_makes_its_code(nandoctor, code, fixture, profile):
    result = nandoctor("run", fixture, "--profile", profile)
    assert result.report is not None, result.stderr[-2000:]
    made = {f["code"] for f in result.report["findings"]}
    assert code in made, f"{fixture} made {sorted(made)}"


def test_explain_a_code():
    result = run_cli("explain", "io105")
    assert result.exit_code == 0
    assert CODES["IO105"].claim in result.stdout
    assert "evidence it needs" in result.stdout and "dev split" in result.stdout


def test_explain_without_a_topic_lists_every_code():
    result = run_cli("explain")
    assert result.exit_code == 0
    assert all(code in result.stdout for code in CODES)


def test_explain_an_unknown_code_is_a_usage_error():
    result = run_cli("explain", "XX999")
    assert result.exit_code == 2
    assert "nandoctor explain" in result.stderr
