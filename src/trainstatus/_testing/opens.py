"""The builtin ``open``, seen by the power-loss recorder: file objects made of ``os`` calls.

``torch.save(obj, f)``, ``pickle.dump``, ``np.save`` and most trainers write their checkpoints
through the builtin ``open`` (``io.open``), whose file objects call the C library directly: an
``os`` interposer never sees their writes. While a recording is active, ``open`` and ``io.open``
are replaced by ``open_through``, which opens a file inside the recorded folder with ``os.open``
and returns a file object whose every read, write, seek, truncate and close is an ``os`` call
(``RawFile`` under a pure-Python buffer): the recorder sees them as it sees trainstatus' own.
``os.fsync(f.fileno())`` works as usual. Files outside the folder get the real ``open``.

The buffers are ``_pyio``'s rather than ``io``'s on purpose: numpy hands a real
``io.BufferedWriter`` to C code that writes to its descriptor directly (``ndarray.tofile``); given
another kind of file object, it calls ``write``.

What still goes unseen (a C extension writing on its own, a module that kept a reference to the
real ``open`` from before the recording, ``os.sendfile``) is caught by the audit hook
(``watch_opens``): an ``open`` for writing of a name inside the folder that did not come through
the interposer is reported, so the recording fails loudly instead of missing the file.
``sys.addaudithook`` cannot be removed: the hook is installed once and does nothing while no
recording watches.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import os
import stat
import sys
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["RawFile", "open_through", "watch_opens"]

_pyio: Any = importlib.import_module("_pyio")  # the pure-Python io (no type stubs)

_WRITING = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class RawFile(io.RawIOBase):
    """An unbuffered file on a descriptor whose every operation is a call of ``os_module``."""

    def __init__(self, os_module: Any, fd: int, name: Any, mode: str, *, closefd: bool = True) -> None:
        super().__init__()
        self._os = os_module
        self._fd = fd
        self._closefd = closefd
        self.name = name
        self.mode = mode

    def fileno(self) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed file")
        return self._fd

    def readable(self) -> bool:
        return "r" in self.mode or "+" in self.mode

    def writable(self) -> bool:
        return "r" not in self.mode or "+" in self.mode

    def seekable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._os.read(self.fileno(), len(view))
        view[: len(data)] = data
        return len(data)

    def write(self, data: Any) -> int:
        return int(self._os.write(self.fileno(), data))

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return int(self._os.lseek(self.fileno(), offset, whence))

    def tell(self) -> int:
        return self.seek(0, os.SEEK_CUR)

    def truncate(self, size: int | None = None) -> int:
        if size is None:
            size = self.tell()
        self._os.ftruncate(self.fileno(), size)
        return size

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
        finally:
            if self._closefd:
                self._os.close(self._fd)


def _flags(mode: str) -> int | None:
    """The ``os.open`` flags of an ``open`` mode, or None for one to leave to the real ``open``."""
    kinds = [c for c in mode if c in "rwxa"]
    if set(mode) - set("rwxabt+") or len(set(mode)) != len(mode) or len(kinds) != 1 or {"b", "t"} <= set(mode):
        return None
    flags = {"r": 0, "w": os.O_CREAT | os.O_TRUNC, "x": os.O_CREAT | os.O_EXCL, "a": os.O_CREAT | os.O_APPEND}[kinds[0]]
    if "+" in mode:
        flags |= os.O_RDWR
    elif kinds[0] != "r":
        flags |= os.O_WRONLY
    return flags | getattr(os, "O_CLOEXEC", 0)


def open_through(os_module: Any, real_open: Callable[..., Any], file: Any, mode: str = "r", buffering: int = -1,
                 encoding: str | None = None, errors: str | None = None, newline: str | None = None,
                 closefd: bool = True, opener: Callable[[str, int], int] | None = None) -> Any:
    """``open(file, ...)`` with every operation of the file an ``os_module`` call.

    Anything out of the ordinary (an ``opener``, an invalid mode or combination of arguments) is
    left to ``real_open``, which opens it or raises its usual error.
    """
    flags = _flags(mode) if isinstance(mode, str) else None
    binary = "b" in (mode if isinstance(mode, str) else "")
    if (flags is None or opener is not None or type(buffering) is not int
            or (binary and (encoding is not None or errors is not None or newline is not None or buffering == 1))
            or (not binary and buffering == 0) or (not closefd and not isinstance(file, int))):
        return real_open(file, mode, buffering, encoding, errors, newline, closefd, opener)
    if not binary:
        # What TextIOWrapper refuses (a newline= or encoding= it does not know, a wrong type) is
        # refused before the file is created or truncated, on a wrapper of nothing.
        io.TextIOWrapper(io.BytesIO(), "utf-8" if encoding is None else encoding, errors, newline)
    if isinstance(file, int):
        fd = file
    else:
        fd = os_module.open(file, flags, 0o666)
    try:
        if stat.S_ISDIR(os_module.fstat(fd).st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), file)
        if "a" in mode:
            os_module.lseek(fd, 0, os.SEEK_END)
        raw_mode = mode.replace("t", "").replace("b", "") + "b"
        raw = RawFile(os_module, fd, file, raw_mode, closefd=closefd)
    except BaseException:
        if not isinstance(file, int):
            os_module.close(fd)
        raise
    if buffering == 0:
        return raw
    size = buffering if buffering > 1 else io.DEFAULT_BUFFER_SIZE
    buffered: Any
    if "+" in mode:
        buffered = _pyio.BufferedRandom(raw, size)
    elif "r" in mode:
        buffered = _pyio.BufferedReader(raw, size)
    else:
        buffered = _pyio.BufferedWriter(raw, size)
    if binary:
        return buffered
    try:
        text = io.TextIOWrapper(buffered, encoding, errors, newline, line_buffering=buffering == 1)
    except BaseException:
        buffered.close()  # its descriptor now, as the real open does, not at some later GC
        raise
    text.mode = mode  # type: ignore[misc]  # as the real open sets it
    return text


_watchers: list[Callable[[Any, int], None]] = []
_installed = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _watchers and len(args) == 3 and not isinstance(args[0], int):
        flags = args[2] if isinstance(args[2], int) else 0
        if flags & _WRITING:
            for watcher in list(_watchers):
                watcher(args[0], flags)


@contextlib.contextmanager
def watch_opens(watcher: Callable[[Any, int], None]) -> Iterator[None]:
    """Tell ``watcher(path, flags)`` every ``open`` for writing (audit event) while active."""
    global _installed
    if not _installed:
        sys.addaudithook(_audit)
        _installed = True
    _watchers.append(watcher)
    try:
        yield
    finally:
        _watchers.remove(watcher)
