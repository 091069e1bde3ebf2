"""Packaging: a wheel must carry every package, the profiles and the schema."""

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed_in_pyproject():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    source = ROOT / "src"
    found = {
        ".".join(init.parent.relative_to(source).parts) for init in source.rglob("__init__.py")
    }
    assert found | {"nandoctor.configs"} == listed


def test_profiles_load_and_float_settings_accept_yaml_exponents(tmp_path):
    from nandoctor.config import PROFILES, load_config

    for profile in PROFILES:
        load_config(profile)
    custom = tmp_path / "c.yaml"
    custom.write_text("verify:\n  margin_factor: 3e-1\n")
    assert load_config(path=str(custom)).verify.margin_factor == 0.3
