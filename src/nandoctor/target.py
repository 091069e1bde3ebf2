"""The target: the user's script and its arguments, checked before anything runs."""

from __future__ import annotations

import os
from dataclasses import dataclass

from nandoctor.errors import UsageError


@dataclass(frozen=True)
class Target:
    script: str  # as the user wrote it: sys.argv[0] and __file__ keep that spelling
    args: tuple[str, ...] = ()
    nproc_per_node: int = 1  # > 1: launched as `torchrun --nproc-per-node N script`

    @property
    def absolute_script(self) -> str:
        return os.path.abspath(self.script)


def load_target(
    script: str, args: list[str] | tuple[str, ...] = (), nproc_per_node: int = 1
) -> Target:
    """Check that `script` is a readable Python file that compiles, or raise UsageError."""
    if nproc_per_node < 1:
        raise UsageError(f"--nproc-per-node must be at least 1, not {nproc_per_node}")
    if not os.path.exists(script):
        raise UsageError(f"script not found: {script}")
    if os.path.isdir(script):
        raise UsageError(f"{script} is a directory: give the training script inside it")
    try:
        with open(script, "rb") as file:
            source = file.read()
    except OSError as error:
        raise UsageError(f"cannot read {script}: {error.strerror}") from None
    if b"\0" in source:
        raise UsageError(f"{script} is not a Python source file (it contains binary data)")
    try:
        compile(source, script, "exec", dont_inherit=True)
    except SyntaxError as error:
        raise UsageError(
            f"{script} has a syntax error at line {error.lineno}: {error.msg}"
        ) from None
    except ValueError as error:
        raise UsageError(f"{script} is not a Python source file: {error}") from None
    return Target(script=script, args=tuple(args), nproc_per_node=nproc_per_node)
