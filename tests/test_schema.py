"""The JSON report contract: the packaged schema is the shared one."""

import json

import pytest

from conftest import SCHEMA_PATH, SHARED_SCHEMA_PATH


def test_packaged_schema_matches_the_shared_schema():
    if not SHARED_SCHEMA_PATH.exists():
        pytest.skip("no shared/ checkout beside the repository")
    assert json.loads(SCHEMA_PATH.read_text()) == json.loads(SHARED_SCHEMA_PATH.read_text())
