"""The JSON report contract: the packaged schema is the shared one, and a real report that holds
a cause without a location still matches it."""

import copy
import json

import jsonschema
import pytest

from conftest import SCHEMA_PATH, SHARED_SCHEMA_PATH, validate_report


def test_packaged_schema_is_the_shared_schema_byte_for_byte():
    if not SHARED_SCHEMA_PATH.exists():
        pytest.skip("no shared/ checkout beside the repository")
    assert SCHEMA_PATH.read_bytes() == SHARED_SCHEMA_PATH.read_bytes()


def test_a_cause_without_a_location_is_valid_and_a_bad_one_is_not(nandoctor):
    report = nandoctor("run", "log_zero_loss.py", "--stages", "anomaly").report
    assert report["causes"], "the run should give a cause"
    located = report["causes"][0]
    assert located["location"] is not None
    unlocated = copy.deepcopy(report)
    unlocated["causes"][0]["location"] = None
    validate_report(unlocated)  # the strict validator of the schema's own draft
    broken = copy.deepcopy(report)
    broken["causes"][0]["location"] = {"line": "fourteen"}
    with pytest.raises(jsonschema.ValidationError):
        validate_report(broken)


@pytest.mark.parametrize("status", ["healthy", "nonfinite", "inconclusive", "script_error",
                                    "timeout"])  # fmt: skip
def test_every_documented_status_is_in_the_schema(status):
    schema = json.loads(SCHEMA_PATH.read_text())
    assert status in schema["properties"]["status"]["enum"]
