"""Shared test helpers: run the real CLI in a child process and validate its JSON report."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCHEMA_PATH = ROOT / "src" / "nandoctor" / "report" / "report-schema.json"
SHARED_SCHEMA_PATH = ROOT.parent / "shared" / "report-schema.json"


@dataclass
class CliResult:
    exit_code: int
    report: dict | None
    stdout: str
    stderr: str


def line_of(script: str | Path, marker: str) -> int:
    """The 1-based line of `script` (a name in tests/scripts or a path) containing `marker`."""
    path = Path(script) if Path(script).is_absolute() else SCRIPTS / script
    lines = path.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if marker in line)


def validate_report(report: dict) -> None:
    """The schema, and the finding codes: every cause and finding carries a registered code of
    its own category (codes.py)."""
    from nandoctor.codes import CODES

    schema = json.loads(SCHEMA_PATH.read_text())
    jsonschema.validate(report, schema)
    for claim in [*report.get("causes", []), *report.get("findings", [])]:
        code = CODES.get(claim.get("code"))
        assert code is not None, f"no registered code: {claim.get('code')!r} ({claim['title']})"
        assert code.category == claim["category"], f"{code.code} is not {claim['category']}"


def run_cli(
    *args: str,
    json_path: Path | None = None,
    cwd: Path | None = None,
    timeout: float = 300,
    env: dict | None = None,
) -> CliResult:
    """`python -m nandoctor ARGS [--json PATH]`; the report, if written, is schema-checked."""
    command = [sys.executable, "-m", "nandoctor", *args]
    if json_path is not None and "--" in command:
        at = command.index("--")
        command[at:at] = ["--json", str(json_path)]
    elif json_path is not None:
        command += ["--json", str(json_path)]
    full_env = dict(os.environ, COLUMNS="160", **(env or {}))
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env
    )
    report = None
    if json_path is not None and json_path.exists():
        report = json.loads(json_path.read_text())
        validate_report(report)
    return CliResult(done.returncode, report, done.stdout, done.stderr)


@pytest.fixture
def nandoctor(tmp_path):
    """Run `nandoctor COMMAND SCRIPT [options] [-- script args]` and get the checked report."""

    def run(command: str, script: str | Path, *options: str, script_args=(), **kwargs) -> CliResult:
        script_path = script if Path(script).is_absolute() else SCRIPTS / script
        args = [command, str(script_path), *options]
        if script_args:
            args += ["--", *script_args]
        return run_cli(*args, json_path=tmp_path / "report.json", **kwargs)

    return run


def processes_mentioning(text: str) -> list[int]:
    """Processes whose command line mentions `text`: every run nandoctor starts, and every
    rewind point and run resumed from one, names its options file in nandoctor's temp folder."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
    return found
