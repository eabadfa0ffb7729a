"""Interposing on ``os``: show a hook every call on a path inside one directory tree.

``Interposer`` replaces functions of ``os`` for the length of a ``with`` block and shows a hook
every call on a path inside one directory tree (the *root*) or on a descriptor opened on such a
path; every other call passes straight through. With ``builtin_open``, the builtin ``open`` inside
the root is made of those calls too (``_testing.opens``). The power-loss recorder
(``_testing.record``) is such a hook; so are the fault injectors of the test suite.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import io
import os
import pathlib
import threading
from collections.abc import Callable
from typing import Any

from .opens import open_through, watch_opens

__all__ = ["PATCHED", "Call", "Hook", "Interposer"]

_MISSING = object()


_PATH_FIRST = ("open", "stat", "lstat", "chmod", "chown", "unlink", "remove", "mkdir", "rmdir",
               "truncate", "scandir", "listdir", "readlink", "utime")
_FD_FIRST = ("close", "read", "write", "pwrite", "lseek", "fsync", "fdatasync", "ftruncate",
             "fchmod", "fchown", "fstat")
_TWO_PATHS = ("replace", "rename", "link", "symlink")
PATCHED = _PATH_FIRST + _FD_FIRST + _TWO_PATHS


@dataclasses.dataclass
class Call:
    """One os call on something inside the root."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    paths: tuple[str, ...]  # absolute paths involved (for a descriptor: what it was opened on)


class Hook:
    """What an ``Interposer`` tells. ``before`` may raise to make the call fail (fault injection)."""

    def before(self, call: Call) -> None:
        pass

    def after(self, call: Call, result: Any) -> None:
        pass

    def unseen(self, path: str) -> None:
        """``path`` was opened for writing by something the interposer does not see."""


class Interposer:
    """Route the os calls that touch ``root`` through ``hook`` while active (a context manager).

    Only calls from the thread that entered are shown, or with ``all_threads`` those of every
    thread (the history's pruning runs on a background thread), one at a time: a lock is held from
    ``before`` to ``after``, so the order of the hook's calls is the order the calls took effect
    in. The hook's own os calls pass straight through. ``real`` holds the original functions.

    The functions are replaced on the ``os`` this module sees, which is the one every trainstatus
    module sees: the real module, or under pyfakefs its fake one. With ``builtin_open``, the
    builtin ``open`` (and ``io.open``) of a file inside the root gives a file object made of those
    os calls (``_testing.opens``), and an ``open`` for writing that still bypasses them (C code)
    is told to ``hook.unseen``.
    """

    def __init__(self, root: str | os.PathLike[str], hook: Hook, *, all_threads: bool = False,
                 builtin_open: bool = False) -> None:
        self.os: Any = os
        self.all_threads = all_threads
        self._thread = threading.get_ident()
        self.root = self.os.path.realpath(root)
        self.hook = hook
        self.real: dict[str, Callable[..., Any]] = {name: getattr(self.os, name) for name in PATCHED
                                                     if hasattr(self.os, name)}
        self.fds: dict[int, str] = {}
        self._lock = threading.RLock()
        self._local = threading.local()
        self._saved: dict[str, Any] = {}
        self.builtin_open = builtin_open
        self._opens: list[tuple[Any, str, Any]] = []  # (module, name, saved) of the open replaced
        self._accessor: list[tuple[Any, str, Any]] = []  # (class, name, saved) of pathlib's functions replaced
        self._watch = contextlib.ExitStack()

    def __enter__(self) -> Interposer:
        self._thread = threading.get_ident()
        own = vars(self.os)
        real_open = vars(io).get("open")
        for name, real in self.real.items():
            self._saved[name] = own.get(name, _MISSING)
            setattr(self.os, name, self._wrap(name, real))
        # Python 3.10's pathlib calls os through pathlib._NormalAccessor, which bound io.open, os.mkdir,
        # os.unlink, os.replace... at import: Path.open, write_bytes, mkdir, unlink and replace would
        # bypass the replaced functions. Its bindings of the real ones are replaced too (3.11 has none).
        accessor = getattr(pathlib, "_NormalAccessor", None)
        if accessor is not None:
            bound = vars(accessor)
            for name, real in self.real.items():
                if bound.get(name) is real:
                    self._accessor.append((accessor, name, real))
                    setattr(accessor, name, staticmethod(self._wrap(name, real)))
            if self.builtin_open and real_open is not None and bound.get("open") is real_open:
                self._accessor.append((accessor, "open", real_open))
                setattr(accessor, "open", staticmethod(self._wrap_open(real_open)))
        if self.builtin_open:
            # The builtin open (pyfakefs' under pyfakefs) and the io module this module sees.
            for module in (builtins, io):
                saved = vars(module).get("open", _MISSING)
                self._opens.append((module, "open", saved))
                setattr(module, "open", self._wrap_open(module.open))
            self._watch.enter_context(watch_opens(self._audited))
        return self

    def __exit__(self, *exc: object) -> None:
        self._watch.close()
        for name, saved in self._saved.items():
            if saved is _MISSING:
                delattr(self.os, name)  # a method of pyfakefs' fake module class: shown again
            else:
                setattr(self.os, name, saved)
        self._saved.clear()
        for accessor, name, saved in reversed(self._accessor):
            setattr(accessor, name, saved)
        self._accessor.clear()
        for module, name, saved in reversed(self._opens):
            if saved is _MISSING:
                delattr(module, name)
            else:
                setattr(module, name, saved)
        self._opens.clear()

    def _shown(self) -> bool:
        """Whether an open of this thread, now, is one to show: not the hook's own, not made by an
        interposed call (its audit event), from a thread watched."""
        local = self._local
        return not (getattr(local, "busy", False) or getattr(local, "calling", False)) and (
            self.all_threads or threading.get_ident() == self._thread)

    def _wrap_open(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def open(file: Any, mode: str = "r", buffering: int = -1, encoding: str | None = None,  # noqa: A001
                 errors: str | None = None, newline: str | None = None, closefd: bool = True,
                 opener: Callable[[str, int], int] | None = None) -> Any:
            if not self._shown() or self.inside(file) is None:
                return real(file, mode, buffering, encoding, errors, newline, closefd, opener)
            return open_through(self.os, real, file, mode, buffering, encoding, errors, newline, closefd, opener)

        return open

    def _audited(self, path: Any, flags: int) -> None:
        if not self._shown():
            return
        inside = self.inside(path)
        if inside is not None:
            local = self._local
            local.busy = True
            try:
                self.hook.unseen(inside)
            finally:
                local.busy = False

    def inside(self, path: Any) -> str | None:
        """The absolute path if ``path`` (a path or a descriptor) is inside the root."""
        if isinstance(path, int):
            return self.fds.get(path)
        try:
            absolute = self.os.path.abspath(os.fsdecode(os.fspath(path)))
        except TypeError:
            return None
        if absolute == self.root or absolute.startswith(self.root + os.sep):
            return str(absolute)
        return None

    def _paths(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[str, ...]:
        if kwargs.get("dir_fd") is not None or kwargs.get("src_dir_fd") is not None:
            return ()  # not used by trainstatus; the self-check of a recording would catch it
        if name in _TWO_PATHS:
            found = [self.inside(p) for p in args[:2]]
            return tuple(p for p in found if p is not None)
        if not args:
            first = kwargs.get("path", kwargs.get("fd"))
            if first is None:
                return ()
        else:
            first = args[0]
        inside = self.inside(first)
        return () if inside is None else (inside,)

    def _wrap(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        local = self._local

        def interposed(*args: Any, **kwargs: Any) -> Any:
            if getattr(local, "busy", False) or not (self.all_threads or threading.get_ident() == self._thread):
                return real(*args, **kwargs)
            with self._lock:
                paths = self._paths(name, args, kwargs)
                if not paths:
                    result = real(*args, **kwargs)
                    if name == "open":
                        self.fds.pop(result, None)  # a number reused by an unrelated file
                    return result
                call = Call(name, args, kwargs, paths)
                local.busy = True
                try:
                    self.hook.before(call)
                finally:
                    local.busy = False
                local.calling = True  # its own audit event is no unseen open
                try:
                    result = real(*args, **kwargs)
                finally:
                    local.calling = False
                    if name == "close" and args:
                        self.fds.pop(args[0], None)
                if name == "open":
                    self.fds[result] = paths[0]
                local.busy = True
                try:
                    self.hook.after(call, result)
                finally:
                    local.busy = False
                return result

        interposed.__name__ = name
        return interposed
