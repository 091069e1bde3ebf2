"""Profiles and config files: YAML -> typed frozen dataclasses; unknown keys are an error."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from nandoctor.errors import ConfigError
from nandoctor.stages import data_scan, device_compare, init_check, lr_sweep

STAGE_ORDER = ("data_scan", "init_check", "anomaly", "lr_sweep", "device_compare")
PROFILES = ("quick", "standard", "thorough")
DEFAULT_PROFILE = "standard"


@dataclass(frozen=True)
class WatchSettings:
    """The watched run of the script that every stage starts from."""

    # Budgets; None watches the whole run, until the script ends or the first NaN/Inf that
    # matters. A budget that stops a finite run makes the verdict `inconclusive`, never healthy.
    max_steps: int | None = None  # optimizer steps watched before the script is stopped
    timeout_s: float | None = None  # wall-clock limit of one run of the script
    # Forced on torch, random and numpy (and PYTHONHASHSEED=0) before the script starts, so
    # every re-run sees the same batches; None leaves seeding to the script alone.
    seed: int | None = 0
    threads: int | None = None  # torch intra-op threads in child runs (None: torch's default)
    # "replay": watch cheaply (loss/grad/param checks per step), and when a NaN/Inf appears at
    # step K, replay the script with per-op localization from step K-1. "always": per-op
    # localization from the first step (for scripts that are not deterministic under a seed).
    localize: str = "replay"
    # A torchrun launch (--nproc-per-node): once one rank has stopped (NaN/Inf, step budget),
    # the others get this long to stop too before they are ended; they may be waiting in a
    # collective the stopped rank will never join.
    rank_grace_s: float = 10.0


@dataclass(frozen=True)
class VerifySettings:
    """Verification by treatment: re-run the script with a proposed fix applied."""

    max_fixes: int = 3  # the strongest causes with an automatic remedy that get a re-run
    # A fixed run must stay finite past the step where the original failed by a margin: this
    # fraction of the steps the re-run repeats (from step 0, or from a rewind point), and at
    # least `min_margin` steps.
    margin_factor: float = 0.25
    min_margin: int = 10
    jobs: int = 2  # re-runs at the same time


@dataclass(frozen=True)
class RewindSettings:
    """Rewind points (child/rewind.py): re-runs resume shortly before the failure instead of
    repeating the run from step 0, where a fork of the watched run is safe."""

    enabled: bool = True
    keep: int = 1  # points kept alive; each costs about one copy of what a step rewrites
    # A new point once this fraction of the run's time so far has passed since the last one,
    # and at least `min_interval_s`: the newest lies within that fraction before the failure.
    interval_fraction: float = 0.05
    min_interval_s: float = 0.5
    # No new point while the loss's running median is this many times its lowest of the last
    # 100 steps (child/rewind.py): the point kept stays from before the climb, so that a re-run
    # from it asks what a smaller rate or a clip does to a healthy state, not to weights (and
    # momentum) already thrown out of range.
    runaway_factor: float = 3.0
    # Re-runs from step 0 are forked from a copy of the watched run taken before the script
    # ran (torch imported, nothing else done) instead of starting a new interpreter.
    fresh_starts: bool = True


@dataclass(frozen=True)
class Config:
    stages: tuple[str, ...] = STAGE_ORDER
    watch: WatchSettings = field(default_factory=WatchSettings)
    verify: VerifySettings = field(default_factory=VerifySettings)
    rewind: RewindSettings = field(default_factory=RewindSettings)
    # Each stage documents its own settings in its module (`Settings`).
    data_scan: data_scan.Settings = field(default_factory=data_scan.Settings)
    init_check: init_check.Settings = field(default_factory=init_check.Settings)
    lr_sweep: lr_sweep.Settings = field(default_factory=lr_sweep.Settings)
    device_compare: device_compare.Settings = field(default_factory=device_compare.Settings)


def _field_types(cls) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _is_optional(kind) -> bool:
    return isinstance(kind, types.UnionType) and type(None) in typing.get_args(kind)


def _convert(value, kind, where: str):
    """Check (and lightly convert) one YAML value against the dataclass field's type."""
    if dataclasses.is_dataclass(kind):
        return _build(kind, value, where)
    if _is_optional(kind):
        if value is None:
            return None
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    origin = typing.get_origin(kind)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list: got {value!r}")
        item = typing.get_args(kind)[0]
        return tuple(_convert(v, item, f"{where}[]") for v in value)
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is float and isinstance(value, str):
        # YAML 1.1 reads `1e-5` (no dot) as a string
        try:
            return float(value)
        except ValueError:
            raise ConfigError(f"{where} must be a number: got {value!r}") from None
    if kind in (int, str, bool) and type(value) is not kind:
        raise ConfigError(f"{where} must be {kind.__name__}: got {value!r}")
    return value


def _build(cls, mapping, where: str):
    if mapping is None:
        mapping = {}
    if not isinstance(mapping, dict):
        raise ConfigError(f"{where or 'the config'} must be a mapping of keys: got {mapping!r}")
    kinds = _field_types(cls)
    unknown = sorted(set(mapping) - set(kinds))
    if unknown:
        raise ConfigError(
            f"unknown key {where + '.' if where else ''}{unknown[0]}: "
            f"valid keys are {', '.join(sorted(kinds))}"
        )
    values = {}
    for name, value in mapping.items():
        values[name] = _convert(value, kinds[name], f"{where}.{name}" if where else name)
    return cls(**values)


def _merge(base: dict, override: dict) -> dict:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read_yaml(text: str, origin: str) -> dict:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{origin} is not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{origin} must hold a mapping of keys")
    return data


def profile_text(name: str) -> str:
    if name not in PROFILES:
        raise ConfigError(f"unknown profile {name!r}: choose one of {', '.join(PROFILES)}")
    return resources.files("nandoctor.configs").joinpath(f"{name}.yaml").read_text("utf-8")


def load_config(
    profile: str = DEFAULT_PROFILE, path: str | None = None, overrides: dict | None = None
) -> Config:
    """The profile, then the user's config file on top, then command-line overrides."""
    data = _read_yaml(profile_text(profile), f"profile {profile}")
    if path:
        try:
            text = Path(path).read_text("utf-8")
        except OSError as error:
            raise ConfigError(f"cannot read config file {path}: {error.strerror}") from None
        data = _merge(data, _read_yaml(text, path))
    data = _merge(data, overrides or {})
    config = _build(Config, data, "")
    if config.rewind.keep < 1:
        raise ConfigError(f"rewind.keep must be at least 1: got {config.rewind.keep}")
    if not config.rewind.runaway_factor > 1:
        raise ConfigError(
            f"rewind.runaway_factor must be above 1: got {config.rewind.runaway_factor}"
        )
    if config.watch.localize not in ("replay", "always"):
        raise ConfigError(f"watch.localize must be replay or always: got {config.watch.localize!r}")
    unknown_stages = [s for s in config.stages if s not in STAGE_ORDER]
    if unknown_stages:
        raise ConfigError(
            f"unknown stage {unknown_stages[0]!r}: valid stages are {', '.join(STAGE_ORDER)}"
        )
    return config
