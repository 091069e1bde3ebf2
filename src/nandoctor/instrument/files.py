"""Re-runs write into a scratch folder: what the script creates or changes lands there instead.

A file the script writes at `/home/u/run/ckpt.pt` lands at `SCRATCH/home/u/run/ckpt.pt`;
reads of it later in the same run are served from there, while the user's existing files stay
readable and unchanged (appending to one copies it into the scratch folder first; deleting one
only hides it from this run). Python-level entry points are covered: `open`/`io.open` (so
`pathlib`, `numpy.save`, `logging`, `zipfile` too), the `os` functions that create, change,
move or remove paths, `tarfile`, and `torch.save`/`torch.load`, whose writer opens paths in C.
DataLoader workers started by fork inherit all of it.

Left alone: what the run itself creates in the system temp folder (tempfile, multiprocessing
and torch keep sockets, shared memory and compiled kernels there and reach them from C code
that cannot be redirected) - what already sat there when the run started, the working
directory and the script's folder are the user's and protected like any other file - caches
shared between runs (downloads, kernel caches), and `/dev`, `/proc`, `/sys`, `/run`. Native writers that
bypass Python (h5py, safetensors' Rust writer) and spawned workers are not covered.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import functools
import io
import os
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_SYSTEM_DIRS = ("/dev", "/proc", "/sys", "/run")


def _cache_dirs() -> list[str]:
    home = os.path.expanduser("~")
    dirs = [
        os.environ.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"),
        os.path.join(home, ".triton"),
        os.path.join(home, ".nv"),
        os.path.join(home, ".config", "matplotlib"),
    ]
    for name in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TORCH_HOME", "HF_HOME",
                 "MPLCONFIGDIR", "CUDA_CACHE_PATH"):  # fmt: skip
        if os.environ.get(name):
            dirs.append(os.environ[name])
    return dirs


# Shared caches that live in the temp folder across runs (compiled kernels, X sockets).
_SHARED_TEMP_PREFIXES = ("torchinductor_", ".triton", "triton", ".X11-unix", ".ICE-unix", "pymp-")


def _entries(folder: str) -> frozenset[str]:
    try:
        return frozenset(os.listdir(folder))
    except OSError:
        return frozenset()


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p.rstrip(os.sep) + os.sep) for p in prefixes)


class WriteRedirect:
    """The path mapping and the patched functions; `install()` / `remove()` swap them in and out."""

    def __init__(self, scratch_dir: str, keep: tuple[str, ...] = ()) -> None:
        self.scratch = os.path.abspath(scratch_dir)
        temp = tempfile.gettempdir()
        self._temp = tuple({os.path.abspath(temp), os.path.realpath(temp)})
        self._kept = tuple(
            os.path.abspath(p) for p in [self.scratch, *keep, *_SYSTEM_DIRS, *_cache_dirs()]
        )
        # What already sat in the temp folder belongs to the user (experiment folders, pytest's
        # tmp_path); what the run creates there (multiprocessing folders, sockets, mkdtemp) is
        # the runtime's own and is left alone.
        self._temp_at_start = _entries(temp)
        self._cwd = os.getcwd()
        self._protected_for: str | None = None  # the sys.argv[0] `_protected_roots` belong to
        self._protected_roots: tuple[str, ...] = ()
        self._deleted: set[str] = set()  # user paths the script removed: hidden from this run
        self._local = threading.local()  # our own file work must not be redirected again
        self._undo: list[Callable[[], None]] = []

    # ---- the mapping -------------------------------------------------------------------------
    def _absolute(self, path) -> str | None:
        """The absolute path of a redirected location, None for fds and kept locations."""
        if isinstance(path, int) or getattr(self._local, "busy", False):
            return None
        try:
            name = os.fsdecode(os.fspath(path))
        except TypeError:
            return None
        absolute = os.path.abspath(name)
        if _under(absolute, self._kept):
            return None
        if _under(absolute, self._temp) and not (
            _under(absolute, self._protected()) or self._existed_in_temp(absolute)
        ):
            return None
        return absolute

    def _existed_in_temp(self, absolute: str) -> bool:
        for root in self._temp:
            if _under(absolute, (root,)) and absolute != root:
                head = os.path.relpath(absolute, root).split(os.sep, 1)[0]
                return head in self._temp_at_start and not head.startswith(_SHARED_TEMP_PREFIXES)
        return False

    def _protected(self) -> tuple[str, ...]:
        """The user's own folders inside the temp folder: the working directory the run started
        in and the script's folder (a folder that holds the temp folder itself is not one)."""
        script = sys.argv[0] if sys.argv else ""
        if self._protected_for != script:
            roots = {self._cwd}
            if script.endswith(".py"):
                roots.add(os.path.dirname(os.path.abspath(script)))
            self._protected_roots = tuple(
                root for root in roots if not any(_under(t, (root,)) for t in self._temp)
            )
            self._protected_for = script
        return self._protected_roots

    def mirror(self, absolute: str) -> str:
        return self.scratch + absolute

    def _is_deleted(self, absolute: str) -> bool:
        return bool(self._deleted) and any(_under(absolute, (d,)) for d in self._deleted)

    def _real_exists(self, absolute: str) -> bool:
        with self._busy():
            return os.path.lexists(absolute) and not self._is_deleted(absolute)

    def for_read(self, path):
        """Where a read of `path` goes: the script's own copy if it wrote one, else the original."""
        absolute = self._absolute(path)
        if absolute is None:
            return path
        mirrored = self.mirror(absolute)
        with self._busy():
            if os.path.lexists(mirrored) or self._is_deleted(absolute):
                return mirrored
        return path

    def for_write(self, path, keep_content: bool):
        """Where a write to `path` goes; `keep_content` copies an existing user file first."""
        absolute = self._absolute(path)
        if absolute is None:
            return path
        mirrored = self.mirror(absolute)
        with self._busy():
            parent, real_parent = os.path.dirname(mirrored), os.path.dirname(absolute)
            if not os.path.isdir(parent) and (
                os.path.isdir(real_parent) and not self._is_deleted(real_parent)
            ):
                os.makedirs(parent, exist_ok=True)
            if keep_content and not os.path.lexists(mirrored) and self._real_exists(absolute):
                if os.path.isdir(absolute):
                    shutil.copytree(absolute, mirrored, symlinks=True)
                else:
                    shutil.copy2(absolute, mirrored)
        self._deleted.discard(absolute)
        return mirrored

    @contextlib.contextmanager
    def _busy(self):
        previous, self._local.busy = getattr(self._local, "busy", False), True
        try:
            yield
        finally:
            self._local.busy = previous

    # ---- patched functions -------------------------------------------------------------------
    def _open(self, original):
        def open_(file, mode="r", *args, **kwargs):
            if any(c in mode for c in "wax+"):
                target = self.for_write(file, keep_content="w" not in mode)
            else:
                target = self.for_read(file)
            try:
                return original(target, mode, *args, **kwargs)
            except OSError as error:
                if target is not file and error.filename == target:
                    error.filename = os.fspath(file)  # name the user's path, not ours
                raise

        return open_

    def _os_open(self, original):
        def os_open(path, flags, mode=0o777, *, dir_fd=None):
            if dir_fd is not None:
                return original(path, flags, mode, dir_fd=dir_fd)
            if flags & _WRITE_FLAGS:
                keep = not flags & os.O_TRUNC or bool(flags & os.O_EXCL)
                target = self.for_write(path, keep_content=keep)
            else:
                target = self.for_read(path)
            return original(target, flags, mode)

        return os_open

    def _reader(self, original):
        """stat, lstat and the like: look where a read would."""

        def read(path, *args, **kwargs):
            if kwargs.get("dir_fd") is not None:
                return original(path, *args, **kwargs)
            return original(self.for_read(path), *args, **kwargs)

        return read

    def _modifier(self, original):
        """utime, chmod, truncate: change a copy of the file, never the user's."""

        def modify(path, *args, **kwargs):
            if kwargs.get("dir_fd") is not None:
                return original(path, *args, **kwargs)
            return original(self.for_write(path, keep_content=True), *args, **kwargs)

        return modify

    def _mkdir(self, original):
        def mkdir(path, mode=0o777, *, dir_fd=None):
            absolute = None if dir_fd is not None else self._absolute(path)
            if absolute is None:
                return original(path, mode, dir_fd=dir_fd)
            if self._real_exists(absolute) and not os.path.lexists(self.mirror(absolute)):
                raise FileExistsError(17, "File exists", os.fspath(path))
            return original(self.for_write(path, keep_content=False), mode)

        return mkdir

    def _makedirs(self, original):
        def makedirs(name, mode=0o777, exist_ok=False):
            absolute = self._absolute(name)
            if absolute is None:
                return original(name, mode, exist_ok)
            mirrored = self.mirror(absolute)
            if os.path.lexists(mirrored) or self._real_exists(absolute):
                if exist_ok and (os.path.isdir(mirrored) or os.path.isdir(absolute)):
                    return None
                raise FileExistsError(17, "File exists", os.fspath(name))
            # The real folders above it exist (or are mirrored): create the rest in the scratch.
            with self._busy():
                return original(mirrored, mode, True)

        return makedirs

    def _linker(self, original):
        def link(src, dst, *args, **kwargs):
            if kwargs.get("dir_fd") is not None or kwargs.get("src_dir_fd") is not None:
                return original(src, dst, *args, **kwargs)
            return original(src, self.for_write(dst, keep_content=False), *args, **kwargs)

        return link

    def _remover(self, original):
        """remove, unlink, rmdir, shutil.rmtree: delete the script's copy, hide the user's."""

        def remove(path, *args, **kwargs):
            if kwargs.get("dir_fd") is not None:
                return original(path, *args, **kwargs)
            absolute = self._absolute(path)
            if absolute is None:
                return original(path, *args, **kwargs)
            mirrored = self.mirror(absolute)
            real = self._real_exists(absolute)
            if os.path.lexists(mirrored):
                original(mirrored, *args, **kwargs)
            elif not real:
                return original(mirrored, *args, **kwargs)  # raises as the real call would
            if real:
                self._deleted.add(absolute)
            return None

        return remove

    def _renamer(self, original):
        def rename(src, dst, *args, **kwargs):
            if kwargs.get("src_dir_fd") is not None or kwargs.get("dst_dir_fd") is not None:
                return original(src, dst, *args, **kwargs)
            source_abs, target_abs = self._absolute(src), self._absolute(dst)
            if source_abs is None and target_abs is None:
                return original(src, dst, *args, **kwargs)
            source = self.for_read(src)
            target = self.for_write(dst, keep_content=False)
            own = source_abs is None or source == self.mirror(source_abs)
            real_source = source_abs is not None and self._real_exists(source_abs)
            with self._busy():
                if own:
                    _move(source, target)
                elif os.path.isdir(source):
                    if os.path.isdir(target):
                        shutil.rmtree(target)
                    shutil.copytree(source, target, symlinks=True)
                else:
                    shutil.copy2(source, target, follow_symlinks=False)
            if real_source:
                self._deleted.add(source_abs)
            return None

        return rename

    def _listdir(self, original):
        def listdir(path="."):
            if isinstance(path, int):
                return original(path)
            absolute = self._absolute(path)
            if absolute is None:
                return original(path)
            mirrored = self.mirror(absolute)
            names: list[str] = []
            with self._busy():
                if os.path.isdir(mirrored):
                    names += original(mirrored)
                if os.path.isdir(absolute) and not self._is_deleted(absolute):
                    seen = set(names)
                    for name in original(absolute):
                        full = os.path.join(absolute, name)
                        if name not in seen and not self._is_deleted(full):
                            names.append(name)
                elif not os.path.isdir(mirrored):
                    return original(mirrored if self._is_deleted(absolute) else path)
            if isinstance(path, bytes):
                return [os.fsencode(n) for n in names]
            return names

        return listdir

    def _scandir(self, original):
        def scandir(path="."):
            if isinstance(path, int):
                return original(path)
            absolute = self._absolute(path)
            if absolute is None:
                return original(path)
            mirrored = self.mirror(absolute)
            with self._busy():
                has_mirror = os.path.isdir(mirrored)
                has_real = os.path.isdir(absolute) and not self._is_deleted(absolute)
            if not has_mirror:
                return original(path if has_real or not self._is_deleted(absolute) else mirrored)
            return _MergedScandir(self, original, mirrored, absolute if has_real else None)

        return scandir

    def _torch_save(self, original):
        def save(obj, f, *args, **kwargs):
            if isinstance(f, (str, bytes, os.PathLike)):
                f = self.for_write(f, keep_content=False)
            return original(obj, f, *args, **kwargs)

        return save

    def _torch_load(self, original):
        def load(f, *args, **kwargs):
            if isinstance(f, (str, bytes, os.PathLike)):
                f = self.for_read(f)
            return original(f, *args, **kwargs)

        return load

    # ---- install / remove --------------------------------------------------------------------
    def _patch(self, owner, name: str, make: Callable) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return
        # Keeps the original's attributes (`shutil.rmtree.avoids_symlink_attacks`).
        setattr(owner, name, functools.update_wrapper(make(original), original))
        self._undo.append(lambda: setattr(owner, name, original))

    def install(self) -> None:
        opener = self._open(builtins.open)
        for owner in (builtins, io):
            original = owner.open
            owner.open = opener
            self._undo.append(
                lambda owner=owner, original=original: setattr(owner, "open", original)
            )
        if "tarfile" in sys.modules:
            tarfile = sys.modules["tarfile"]
            self._patch(tarfile, "bltn_open", lambda original: opener)
        self._patch(os, "open", self._os_open)
        for name in ("stat", "lstat", "access"):
            self._patch(os, name, self._reader)
        for name in ("utime", "chmod", "truncate"):
            self._patch(os, name, self._modifier)
        for name in ("remove", "unlink", "rmdir"):
            self._patch(os, name, self._remover)
        for name in ("rename", "replace"):
            self._patch(os, name, self._renamer)
        for name in ("symlink", "link"):
            self._patch(os, name, self._linker)
        self._patch(os, "mkdir", self._mkdir)
        self._patch(os, "makedirs", self._makedirs)
        self._patch(os, "listdir", self._listdir)
        self._patch(os, "scandir", self._scandir)
        self._patch(shutil, "rmtree", self._remover)
        if "torch" in sys.modules:
            torch = sys.modules["torch"]
            self._patch(torch, "save", self._torch_save)
            self._patch(torch, "load", self._torch_load)
            self._patch(torch.serialization, "save", self._torch_save)
            self._patch(torch.serialization, "load", self._torch_load)
        # Python caches bytecode beside imported modules; a re-run leaves no such trace either.
        previous = sys.dont_write_bytecode
        sys.dont_write_bytecode = True
        self._undo.append(lambda: setattr(sys, "dont_write_bytecode", previous))

    def remove(self) -> None:
        while self._undo:
            self._undo.pop()()


class _MergedScandir:
    """`os.scandir` over the script's copy of a folder and then the user's original: entries
    of the copy win, entries the script removed are left out."""

    def __init__(self, redirect: WriteRedirect, original, mirrored: str, real: str | None):
        self._entries = self._merge(redirect, original, mirrored, real)

    @staticmethod
    def _merge(redirect: WriteRedirect, original, mirrored: str, real: str | None):
        names: set[str] = set()
        with original(mirrored) as entries:
            for entry in entries:
                names.add(entry.name)
                yield entry
        if real is None:
            return
        with original(real) as entries:
            for entry in entries:
                hidden = redirect._is_deleted(os.path.join(real, entry.name))
                if entry.name not in names and not hidden:
                    yield entry

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._entries)

    def close(self) -> None:
        self._entries.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _move(source: str, target: str) -> None:
    """`os.replace`, or copy-and-delete when the two sit on different file systems."""
    try:
        os.replace(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.move(source, target)


def redirect_writes(scratch_dir: str, keep: tuple[str, ...] = ()) -> WriteRedirect:
    """Send what the script writes from now on under `scratch_dir` (see the module docstring);
    `keep`: folders written as they are (nandoctor's own, e.g. where its events go)."""
    os.makedirs(scratch_dir, exist_ok=True)
    redirect = WriteRedirect(scratch_dir, keep)
    redirect.install()
    return redirect
