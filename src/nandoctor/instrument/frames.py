"""Find the user's frame on the Python stack: the first one that is not torch, stdlib or nandoctor."""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass
from types import FrameType

import torch

_NANDOCTOR_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_STDLIB_DIRS = tuple(
    {os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")}
)
_LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)

# co_filename -> its absolute path for user code, "" for library code. Caching keeps the walk at
# ~1.5 µs per call (string tests run once per file, not per op).
_user_file_of_name: dict[str, str] = {}


@dataclass(frozen=True)
class SourceLine:
    """A place in the user's code."""

    file: str
    line: int
    function: str

    def code(self) -> str:
        return linecache.getline(self.file, self.line).strip()

    def as_dict(self) -> dict:
        return {
            "file": self.file,
            "line": self.line,
            "function": self.function,
            "code": self.code(),
        }


def is_library_file(name: str) -> bool:
    """True for torch, the standard library, installed packages and nandoctor itself."""
    return (
        name.startswith((TORCH_DIR, _NANDOCTOR_DIR, "<frozen"))
        or name.startswith(_STDLIB_DIRS)
        or any(marker in name for marker in _LIBRARY_MARKERS)
    )


def user_file(code) -> str:
    """The absolute path of a code object's file when it is user code, else ""."""
    # Keyed by file name, not by code object: code objects compare equal across files when
    # their bytecode is the same (one helper function copied into two scripts).
    name = code.co_filename
    known = _user_file_of_name.get(name)
    if known is None:
        known = "" if is_library_file(name) else os.path.abspath(name)
        _user_file_of_name[name] = known
    return known


def find_user_frame(frame: FrameType | None = None) -> SourceLine | None:
    """The innermost frame of user code above `frame` (default: the caller), or None."""
    f = frame if frame is not None else sys._getframe(1)
    while f is not None:
        code = f.f_code
        path = user_file(code)
        if path:
            return SourceLine(path, f.f_lineno, code.co_name)
        f = f.f_back
    return None


def called_from_user_code(frame: FrameType | None = None) -> bool:
    """Whether the first caller above `frame` that is neither torch nor nandoctor is the user's
    code (`with torch.autocast(...)` in the script), not another library's (a framework that
    enters autocast for its precision option)."""
    f = frame if frame is not None else sys._getframe(1)
    while f is not None and f.f_code.co_filename.startswith((TORCH_DIR, _NANDOCTOR_DIR)):
        f = f.f_back
    return f is not None and not is_library_file(f.f_code.co_filename)


def find_construction_frame(instance: object) -> SourceLine | None:
    """The user line that constructed `instance`: the first user frame outside the `__init__`
    methods of the instance itself (a subclass defined in the script calls `super().__init__`)."""
    f = sys._getframe(1)
    while f is not None:
        path = user_file(f.f_code)
        if path and not (f.f_code.co_name == "__init__" and f.f_locals.get("self") is instance):
            return SourceLine(path, f.f_lineno, f.f_code.co_name)
        f = f.f_back
    return None
