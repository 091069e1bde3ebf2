"""The one error hierarchy of nandoctor; only `cli.py` turns these into exit codes."""


class NandoctorError(Exception):
    """Base class of every error nandoctor raises on purpose."""


class UsageError(NandoctorError):
    """Bad command-line usage or unreadable input (exit code 2)."""


class ConfigError(UsageError):
    """A profile or config file that does not parse or names unknown keys."""
