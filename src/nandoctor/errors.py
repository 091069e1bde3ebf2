"""The one error hierarchy of nandoctor; only `cli.py` turns these into exit codes."""


class NandoctorError(Exception):
    """Base class of every error nandoctor raises on purpose."""


class UsageError(NandoctorError):
    """Bad command-line usage or unreadable input (exit code 2)."""


class ConfigError(UsageError):
    """A profile or config file that does not parse or names unknown keys."""


class NonFiniteError(FloatingPointError):
    """A NaN/Inf was born and reached a loss, a gradient or a parameter (`nandoctor.guard`).

    Attributes say where: `op`, `module`, `phase`, `step`, `location` (file, line, code),
    `explanation` (why, from the op's inputs) and `reached`.
    """

    def __init__(self, message: str, **where) -> None:
        super().__init__(message)
        self.op = where.get("op")
        self.module = where.get("module")
        self.phase = where.get("phase")
        self.step = where.get("step")
        self.location = where.get("location")
        self.explanation = where.get("explanation")
        self.reached = where.get("reached")
