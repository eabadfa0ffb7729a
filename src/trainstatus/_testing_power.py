"""Power loss: record what a run does to a folder, and every state a power loss could leave.

Recording
---------
``Interposer`` replaces functions of ``os`` for the length of a ``with`` block and shows a hook
every call on a path inside one directory tree (the *root*) or on a descriptor opened on such a
path; every other call passes straight through. ``Recorder`` is the hook that logs, in order, the
operations that decide what a power loss can leave:

    create   os.open(O_CREAT) of a name that did not exist      (directory operation)
    mkdir    os.mkdir                                           (directory operation)
    rename   os.replace / os.rename                             (directory operation)
    link     os.link                                            (directory operation)
    unlink   os.unlink / os.remove                              (directory operation)
    write    os.write / os.pwrite, at the descriptor's offset   (file data)
    truncate os.ftruncate / os.truncate / os.open(O_TRUNC)      (file data)
    chmod    os.fchmod / os.chmod                               (file attribute)
    fsync    os.fsync of a file (os.fdatasync: data only)
    dirsync  os.fsync of a directory

It works on os-level calls, not on trainstatus' step functions, so it keeps working when the
write protocol is reorganized. The builtin ``open`` inside the root is made of those calls while
recording (``_testing_open``). And it checks itself: replaying the whole trace over the snapshot
taken before the run must give exactly what is on disk after it (names, bytes, permission bits,
hard links), and no ``open`` for writing inside the root may have bypassed it (its audit event).
A change made some other way (C code's own writes, an os function not listed here) fails that
check loudly (``IncompleteRecording``) instead of going unseen.

The crash model
---------------
A power loss after the first *k* operations of a trace, for every *k* from 0 (nothing done) to
the end (the run returned), may leave any state these rules allow:

1. Each directory's operations persist in program order: the disk holds a prefix of them, for
   each directory independently of the others. An ``fsync`` of a directory makes the earlier
   operations on that directory durable, and those of no other directory: a new ``models/``
   folder's files may be lost although ``run_logs/`` was synced after them, and a folder's files
   are lost with its own entry (until its parent is synced). A rename or link between two
   directories belongs to both: it persists in both or in neither. A directory is followed
   through its renames. (POSIX promises no more; ext4's journal often gives more, but a test
   should not rely on it.)
2. File data and permission bits do not follow the directory. A write, truncate or chmod of a
   file is durable once an ``fsync`` of that file followed it; each one that was not followed by
   one may be missing, independently of the others (so they may also appear reordered), and a
   write may be torn at ``BLOCK`` (512-byte sector) granularity: any subset of its blocks (every
   subset up to 6 blocks; beyond that every prefix and every one-block hole), the other blocks
   holding what was there before, or zeros where the file grew; or the file may end after the
   last block that made it; or the file may have grown to its new size with only zeros in the
   new part (size persisted, data not: what delayed allocation leaves).
3. Nothing else: durable data is not corrupted, a file's bytes come from no other file, the disk
   does not lie about fsync. Lock files hold no content and are left out.

A file created by the trace starts with no bytes and the permission bits it was created with.
"""

from __future__ import annotations

import bisect
import builtins
import contextlib
import dataclasses
import io
import itertools
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

from . import _atomic, _storage
from ._testing_fs import FsState, is_lock_name, materialize, snapshot
from ._testing_kill import TrainingStatusTestError
from ._testing_open import open_through, watch_opens

__all__ = [
    "BLOCK",
    "Call",
    "Hook",
    "IncompleteRecording",
    "Interposer",
    "Op",
    "PowerLoss",
    "Recorder",
    "Recording",
    "crash_states",
    "power_losses",
    "record",
    "replay",
    "verify_recording",
    "write_outcomes",
]

BLOCK = 512
ALL_SUBSETS_UP_TO = 6  # blocks in one write; beyond that, prefixes and one-block holes only

DIRECTORY_OPS = frozenset({"create", "mkdir", "rename", "link", "unlink"})
FILE_OPS = frozenset({"write", "truncate", "chmod"})
_MISSING = object()


# -- interposing on os ---------------------------------------------------------------------------

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
    os calls (``_testing_open``), and an ``open`` for writing that still bypasses them (C code)
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
        self._watch = contextlib.ExitStack()

    def __enter__(self) -> Interposer:
        self._thread = threading.get_ident()
        own = vars(self.os)
        for name, real in self.real.items():
            self._saved[name] = own.get(name, _MISSING)
            setattr(self.os, name, self._wrap(name, real))
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


# -- the trace -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Op:
    """One operation of a recording (``trainstatus.testing.Operation``); ``str(op)`` names it as
    ``Recording.operations`` does.

    ``kind`` is one of create, mkdir, rename, link, unlink (directory operations), write,
    truncate, chmod (file operations), fsync, fdatasync, dirsync; ``rel`` the name it concerns
    (relative to the recorded folder), ``dest`` a rename's or link's new name, ``inode`` the file
    (numbered within the recording), and ``offset``/``data``, ``size``, ``mode`` a write's,
    truncate's and chmod's (or create's) arguments.
    """

    kind: str
    rel: str = ""  # the name created/removed/renamed/linked from; the directory synced
    dest: str = ""  # rename and link: the new name
    directory: str = ""  # the directory whose entries a directory operation changes
    inode: int = -1  # file operations and create
    offset: int = 0
    data: bytes = b""
    size: int = 0  # truncate
    mode: int = 0  # chmod and create: the permission bits
    seen_mode: int | None = None  # the real permission bits of the file right after the operation

    def __str__(self) -> str:
        if self.kind == "write":
            return f"write(#{self.inode}, {len(self.data)} bytes at {self.offset})"
        if self.kind in ("rename", "link"):
            return f"{self.kind}({self.rel} -> {self.dest})"
        if self.kind in ("fsync", "fdatasync"):
            return f"{self.kind}(#{self.inode})"
        if self.kind == "chmod":
            return f"chmod(#{self.inode}, {self.mode:#o})"
        if self.kind == "truncate":
            return f"truncate(#{self.inode}, {self.size})"
        if self.kind == "create":
            return f"create({self.rel} as #{self.inode}, {self.mode:#o})"
        return f"{self.kind}({self.rel or '.'})"


def _parent(rel: str) -> str:
    return os.path.dirname(rel)


def apply_directory_op(state: FsState, op: Op) -> None:
    entries = state.entries
    if op.kind == "create":
        entries[op.rel] = ("file", op.inode)
        state.files.setdefault(op.inode, (b"", op.mode))
    elif op.kind == "mkdir":
        entries[op.rel] = ("dir", 0)
    elif op.kind == "rename":
        moved = {rel: entry for rel, entry in entries.items() if rel == op.rel or rel.startswith(op.rel + os.sep)}
        for rel in moved:
            del entries[rel]
        for rel in list(entries):
            if rel.startswith(op.dest + os.sep):
                del entries[rel]
        for rel, entry in moved.items():
            entries[op.dest + rel[len(op.rel):]] = entry
    elif op.kind == "link":
        entries[op.dest] = entries[op.rel]
    elif op.kind == "unlink":
        entries.pop(op.rel, None)
    else:  # pragma: no cover - a kind added to DIRECTORY_OPS without its meaning
        raise AssertionError(op.kind)


def _write_bytes(content: bytes, offset: int, data: bytes) -> bytes:
    if offset > len(content):
        content = content + bytes(offset - len(content))
    return content[:offset] + data + content[offset + len(data):]


def apply_file_op(content: bytes, mode: int, op: Op) -> tuple[bytes, int]:
    if op.kind == "write":
        return _write_bytes(content, op.offset, op.data), mode
    if op.kind == "truncate":
        return (content[: op.size] + bytes(max(0, op.size - len(content)))), mode
    if op.kind == "chmod":
        return content, op.mode
    raise AssertionError(op.kind)  # pragma: no cover


def replay(initial: FsState, ops: list[Op]) -> FsState:
    """Every operation applied in full: what the disk holds once everything is durable."""
    state = initial.copy()
    for op in ops:
        if op.kind in DIRECTORY_OPS:
            apply_directory_op(state, op)
        elif op.kind in FILE_OPS:
            content, mode = state.files[op.inode]
            state.files[op.inode] = apply_file_op(content, mode, op)
    return state


class Recorder(Hook):
    """Log the operations of the crash model (see the module docstring) as they happen.

    ``live`` is the initial state with every operation so far applied; ``watch`` names files whose
    real permission bits are sampled after every operation into ``modes`` (one dict per op).
    """

    def __init__(self, interposer_root: str | os.PathLike[str], initial: FsState,
                 watch: re.Pattern[str] | None = None) -> None:
        self.root = os.path.realpath(interposer_root)
        self.live = initial.copy()
        self.ops: list[Op] = []
        self.modes: list[dict[str, int]] = []
        self.watch = watch
        self.interposer = Interposer(self.root, self, all_threads=True, builtin_open=True)
        self.unseen_names: list[str] = []  # opened for writing by code the interposer does not see
        self.unexplained: list[str] = []  # removed, renamed or linked, never seen made
        self._fd: dict[int, tuple[str, Any]] = {}  # fd -> ("file", inode) | ("dir", rel) | ("ignored", None)
        self._offset: dict[int, int] = {}
        self._existed: bool = False
        self._next_inode = max(initial.files, default=0) + 1000

    def __enter__(self) -> Recorder:
        self.interposer.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.interposer.__exit__(*exc)

    # helpers using the real functions (the hook runs with the interposer bypassed anyway)

    def _rel(self, absolute: str) -> str:
        rel = os.path.relpath(absolute, self.root)
        return "" if rel == "." else rel

    def _inode_of(self, rel: str) -> int | None:
        entry = self.live.entries.get(rel)
        return entry[1] if entry is not None and entry[0] == "file" else None

    def _real_mode(self, fd: int) -> int:
        return stat.S_IMODE(os.fstat(fd).st_mode)

    def _emit(self, op: Op) -> None:
        if op.kind in DIRECTORY_OPS:
            apply_directory_op(self.live, op)
        elif op.kind in FILE_OPS:
            content, mode = self.live.files[op.inode]
            self.live.files[op.inode] = apply_file_op(content, mode, op)
        self.ops.append(op)
        if self.watch is not None:
            sampled = {}
            for rel, (kind, _) in self.live.entries.items():
                if kind == "file" and self.watch.fullmatch(os.path.basename(rel)):
                    try:
                        sampled[rel] = stat.S_IMODE(os.lstat(os.path.join(self.root, rel)).st_mode)
                    except FileNotFoundError:
                        pass
            self.modes.append(sampled)

    # the hook

    def _known(self, rel: str) -> None:
        """A name the run removes or moves: one the recording must have seen made (or had before)."""
        if rel not in self.live.entries and rel not in self.unexplained:
            self.unexplained.append(rel)

    def unseen(self, path: str) -> None:
        rel = self._rel(path)
        if not is_lock_name(rel) and rel not in self.unseen_names:
            self.unseen_names.append(rel)

    def before(self, call: Call) -> None:
        if call.name == "open":
            self._existed = os.path.lexists(call.paths[0])

    def after(self, call: Call, result: Any) -> None:
        name, args, kwargs = call.name, call.args, call.kwargs
        rels = [self._rel(p) for p in call.paths]
        if any(is_lock_name(r) for r in rels):
            if name == "open":
                self._fd[result] = ("ignored", None)
            return
        if name == "open":
            self._opened(rels[0], args, kwargs, result)
        elif name == "close":
            self._fd.pop(args[0], None)
            self._offset.pop(args[0], None)
        elif name in ("write", "pwrite"):
            target = self._fd.get(args[0])
            if target is None or target[0] != "file":
                return
            data = bytes(args[1])[:result]
            offset = args[2] if name == "pwrite" else self._offset.get(args[0], 0)
            if name == "write":
                self._offset[args[0]] = offset + result
            self._emit(Op("write", inode=target[1], offset=offset, data=data, seen_mode=self._real_mode(args[0])))
        elif name == "lseek":
            self._offset[args[0]] = result
        elif name in ("fsync", "fdatasync"):
            target = self._fd.get(args[0])
            if target is None or target[0] == "ignored":
                return
            if target[0] == "dir":
                self._emit(Op("dirsync", rel=target[1]))
            else:
                self._emit(Op(name, inode=target[1]))
        elif name == "ftruncate":
            target = self._fd.get(args[0])
            if target is not None and target[0] == "file":
                self._emit(Op("truncate", inode=target[1], size=args[1]))
        elif name == "truncate":
            inode = self._inode_of(rels[0])
            if inode is not None:
                self._emit(Op("truncate", inode=inode, size=args[1]))
        elif name == "fchmod":
            target = self._fd.get(args[0])
            if target is not None and target[0] == "file":
                self._emit(Op("chmod", inode=target[1], mode=stat.S_IMODE(args[1]), seen_mode=self._real_mode(args[0])))
        elif name == "chmod":
            inode = self._inode_of(rels[0])
            if inode is not None:
                self._emit(Op("chmod", inode=inode, mode=stat.S_IMODE(args[1])))
        elif name in ("replace", "rename", "link"):
            source, dest = (self._rel(os.path.abspath(os.fsdecode(os.fspath(a)))) for a in args[:2])
            self._known(source)
            self._emit(Op("link" if name == "link" else "rename", rel=source, dest=dest, directory=_parent(dest)))
        elif name in ("unlink", "remove"):
            self._known(rels[0])
            self._emit(Op("unlink", rel=rels[0], directory=_parent(rels[0])))
        elif name == "mkdir":
            self._emit(Op("mkdir", rel=rels[0], directory=_parent(rels[0])))
        # reads, stats, scandir, chown: nothing a crash model needs

    def _opened(self, rel: str, args: tuple[Any, ...], kwargs: dict[str, Any], fd: int) -> None:
        flags = args[1] if len(args) > 1 else kwargs.get("flags", 0)
        if flags & getattr(os, "O_TMPFILE", 0) == getattr(os, "O_TMPFILE", -1):
            self._fd[fd] = ("ignored", None)
            return
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            self._fd[fd] = ("dir", rel)
            return
        self._offset[fd] = 0
        if not self._existed:
            inode = self._next_inode
            self._next_inode += 1
            self._emit(Op("create", rel=rel, directory=_parent(rel), inode=inode, mode=stat.S_IMODE(st.st_mode),
                          seen_mode=stat.S_IMODE(st.st_mode)))
        else:
            inode = self._inode_of(rel)  # type: ignore[assignment]
            if inode is None:
                self._fd[fd] = ("ignored", None)
                return
            if flags & os.O_TRUNC and flags & (os.O_WRONLY | os.O_RDWR):
                self._emit(Op("truncate", inode=inode, size=0))
        self._fd[fd] = ("file", inode)


class IncompleteRecording(TrainingStatusTestError):
    """The recorded trace does not explain what is on disk: something changed it unseen."""


def verify_recording(recorder: Recorder, root: str | os.PathLike[str]) -> None:
    """Replaying the trace must give exactly the real directory, and nothing may have been
    written unseen (even a file removed again)."""
    if recorder.unseen_names:
        raise IncompleteRecording(
            f"{', '.join(recorder.unseen_names)} in {os.fspath(root)} {'was' if len(recorder.unseen_names) == 1 else 'were'} "
            "opened for writing by code the recorder does not see (a C extension writing to a file "
            "name itself, as torch.save(obj, 'name') does, or a module that kept the builtin open from "
            "before the recording), so the power-loss states would miss those writes. Give such code "
            "a file object (torch.save(obj, f) with f = open(name, 'wb')), or write outside the folder.")
    if recorder.unexplained:
        raise IncompleteRecording(
            f"{', '.join(recorder.unexplained)} in {os.fspath(root)} {'was' if len(recorder.unexplained) == 1 else 'were'} "
            "removed, renamed or linked by the run but never seen made: something the recorder does not "
            "see made it (C code writing on its own, os.symlink, pathlib under pyfakefs), so the "
            "power-loss states would miss it while it existed. Make it with open() or os calls, or "
            f"outside the folder; trace: {[str(op) for op in recorder.ops]}")
    real = snapshot(root)
    if recorder.live.key() != real.key():
        recorded = {row[0]: row[1:] for row in recorder.live.key()}
        found = {row[0]: row[1:] for row in real.key()}
        differences = sorted(set(recorded) ^ set(found)) + sorted(
            rel for rel in set(recorded) & set(found) if recorded[rel] != found[rel])
        raise IncompleteRecording(
            f"the recorded operations do not explain the directory after the call; differing names: "
            f"{differences}; trace: {[str(op) for op in recorder.ops]}")


# -- enumerating crash states --------------------------------------------------------------------


def _blocks(offset: int, length: int, block: int) -> list[tuple[int, int]]:
    """The write's range cut at multiples of ``block``: (start, end) file offsets."""
    cuts, start, end = [], offset, offset + length
    while start < end:
        stop = min(end, (start // block + 1) * block)
        cuts.append((start, stop))
        start = stop
    return cuts


def _torn(content: bytes, op: Op, applied: tuple[int, ...], blocks: list[tuple[int, int]], grow_to: int) -> bytes:
    out = bytearray(content)
    if len(out) < grow_to:
        out.extend(bytes(grow_to - len(out)))
    for i in applied:
        start, stop = blocks[i]
        out[start:stop] = op.data[start - op.offset: stop - op.offset]
    return bytes(out)


def write_outcomes(content: bytes, op: Op, block: int = BLOCK) -> list[bytes]:
    """What an unsynced write may have left of ``content`` (rule 2 of the model)."""
    end = op.offset + len(op.data)
    outcomes = [content, _write_bytes(content, op.offset, op.data)]
    if end > len(content):
        outcomes.append(content + bytes(end - len(content)))  # size persisted, data not
    blocks = _blocks(op.offset, len(op.data), block)
    n = len(blocks)
    if n >= 2:
        if n <= ALL_SUBSETS_UP_TO:
            subsets = [s for r in range(1, n) for s in itertools.combinations(range(n), r)]
        else:
            subsets = [tuple(range(j)) for j in range(1, n)] + [tuple(i for i in range(n) if i != hole) for hole in range(n)]
        for subset in subsets:
            outcomes.append(_torn(content, op, subset, blocks, max(len(content), end)))
            last = blocks[max(subset)][1]
            if subset == tuple(range(len(subset))) and last < end and last > len(content):
                outcomes.append(_torn(content, op, subset, blocks, last)[: max(len(content), last)])
    return outcomes


def _file_outcomes(base: tuple[bytes, int], durable: list[Op], volatile: list[Op], block: int) -> list[tuple[bytes, int]]:
    content, mode = base
    for op in durable:
        content, mode = apply_file_op(content, mode, op)
    results = {(content, mode)}
    for op in volatile:
        grown = set()
        for content, mode in results:
            if op.kind == "write":
                for outcome in write_outcomes(content, op, block):
                    grown.add((outcome, mode))
            else:
                grown.add((content, mode))
                grown.add(apply_file_op(content, mode, op))
        results = grown
    return sorted(results)


def _directories_of(initial: FsState, ops: list[Op]) -> list[tuple[int, ...]]:
    """For each operation, the directories (by identity) whose entries it changes or, for a
    ``dirsync``, the one it syncs; () for file operations.

    A directory is followed through renames, so an fsync of ``final`` covers what was done in it
    while it was still called ``tmp``. A rename or a link belongs to both directories it touches.
    """
    fresh = itertools.count()
    ids = {rel: next(fresh) for rel, (kind, _) in [("", ("dir", 0)), *initial.entries.items()] if kind == "dir"}

    def of(rel: str) -> int:
        if rel not in ids:  # a directory neither there before nor made by the trace: its own
            ids[rel] = next(fresh)
        return ids[rel]

    result: list[tuple[int, ...]] = []
    for op in ops:
        if op.kind == "dirsync":
            result.append((of(op.rel),))
        elif op.kind in ("rename", "link"):
            result.append(tuple(sorted({of(_parent(op.rel)), of(_parent(op.dest))})))
            if op.kind == "rename" and op.rel in ids:  # a directory: its tree keeps its identities
                for rel in [r for r in ids if r == op.dest or r.startswith(op.dest + os.sep)]:
                    del ids[rel]
                for rel in [r for r in ids if r == op.rel or r.startswith(op.rel + os.sep)]:
                    ids[op.dest + rel[len(op.rel):]] = ids.pop(rel)
        elif op.kind in DIRECTORY_OPS:
            result.append((of(_parent(op.rel)),))
            if op.kind == "mkdir":
                ids[op.rel] = next(fresh)
        else:
            result.append(())
    return result


def _durable_directory_ops(prefix: list[Op], directories: list[tuple[int, ...]]) -> Iterator[list[int]]:
    """Every set of the prefix's directory operations a power loss may leave (rule 1), in order.

    Each directory keeps a prefix of its own operations (at least up to its last ``dirsync``);
    an operation that belongs to two directories (a rename) is in both prefixes or in neither.
    """
    chains: dict[int, list[int]] = {}
    for i, op in enumerate(prefix):
        if op.kind in DIRECTORY_OPS:
            for d in directories[i]:
                chains.setdefault(d, []).append(i)
    lower = dict.fromkeys(chains, 0)
    for j, op in enumerate(prefix):
        if op.kind == "dirsync" and directories[j][0] in chains:
            chain = chains[directories[j][0]]
            lower[directories[j][0]] = max(lower[directories[j][0]], sum(1 for i in chain if i < j))
    order = sorted(chains)
    for lengths in itertools.product(*(range(lower[d], len(chains[d]) + 1) for d in order)):
        kept: dict[int, int] = {}  # operation -> how many of its directories keep it
        for d, length in zip(order, lengths):
            for i in chains[d][:length]:
                kept[i] = kept.get(i, 0) + 1
        if all(count == len(directories[i]) for i, count in kept.items()):
            yield sorted(kept)


def _unreachable(entries: dict[str, tuple[str, Any]]) -> list[str]:
    """Names whose directory is not there (made in a directory whose own entry was lost)."""
    def reachable(rel: str) -> bool:
        parent = _parent(rel)
        return parent == "" or (entries.get(parent, ("",))[0] == "dir" and reachable(parent))
    return [rel for rel in entries if not reachable(rel)]


def crash_states(initial: FsState, ops: list[Op], block: int = BLOCK) -> Iterator[tuple[int, FsState]]:
    """Every (k, state) the model allows for a power loss after the first k operations."""
    directories = _directories_of(initial, ops)
    for k in range(len(ops) + 1):
        prefix = ops[:k]
        for durable_ops in _durable_directory_ops(prefix, directories):
            names = FsState(dict(initial.entries), dict(initial.files))
            for i in durable_ops:
                apply_directory_op(names, prefix[i])
            for rel in _unreachable(names.entries):
                del names.entries[rel]
            reachable = sorted({ref for kind, ref in names.entries.values() if kind == "file"})
            choices = []
            for inode in reachable:
                file_ops = [(i, op) for i, op in enumerate(prefix) if op.inode == inode and op.kind in FILE_OPS]
                syncs = [i for i, op in enumerate(prefix) if op.inode == inode and op.kind == "fsync"]
                data_syncs = [i for i, op in enumerate(prefix) if op.inode == inode and op.kind == "fdatasync"]
                last_sync = max(syncs, default=-1)
                last_data_sync = max(data_syncs + syncs, default=-1)
                durable: list[Op] = []
                volatile: list[Op] = []
                for i, op in file_ops:
                    limit = last_sync if op.kind == "chmod" else last_data_sync
                    (durable if i < limit else volatile).append(op)
                choices.append(_file_outcomes(names.files[inode], durable, volatile, block))
            for combination in itertools.product(*choices):
                state = FsState(dict(names.entries), dict(names.files))
                for inode, outcome in zip(reachable, combination):
                    state.files[inode] = outcome
                yield k, state


# -- the public face: record a run, hand each state to a check -----------------------------------


@dataclasses.dataclass(frozen=True)
class Recording:
    """One recorded run: the folder before and after it, and the operations in between.

    ``operations`` describes each operation, in order, as one of (names relative to the folder,
    ``#n`` a file by its inode, as the file may be renamed; ``.`` the folder itself)::

        create(name as #n, 0o600)    a new file made (os.open with O_CREAT, open(name, "w"))
        mkdir(name)                  a new directory
        rename(old -> new)           os.replace / os.rename
        link(old -> new)             os.link: a second name for the file
        unlink(name)                 os.unlink / os.remove
        write(#n, 512 bytes at 0)    os.write / os.pwrite, or a write of a file open() made
        truncate(#n, 0)              os.ftruncate / os.truncate, or an existing file opened with "w"
        chmod(#n, 0o644)             os.fchmod / os.chmod: the permission bits
        fsync(#n)                    os.fsync of a file: its data and bits are durable
        fdatasync(#n)                os.fdatasync: its data only
        dirsync(name)                os.fsync of a directory: its entries are durable

    ``ops`` holds them as ``Op`` objects (``kind``, ``rel``, ``dest``, ...). ``status_writes``
    lists the status writes that returned during the run (a ``set``, a transaction's end, a
    ``CheckpointList.add``: each acknowledged to the trainer), in the order they returned, as
    (status file name, number of operations done when it returned). ``states`` is the number of
    distinct power-loss states ``power_losses`` checked.
    """

    before: FsState
    after: FsState
    ops: tuple[Op, ...]
    states: int = 0
    status_writes: tuple[tuple[str, int], ...] = ()

    @property
    def operations(self) -> tuple[str, ...]:
        return tuple(str(op) for op in self.ops)


@dataclasses.dataclass(frozen=True)
class PowerLoss:
    """One state a power loss could leave, laid out in ``folder`` for the check.

    ``done`` operations of the run had happened (``returned``: all of them, the run had returned);
    ``acknowledged`` status writes had returned by then, the first ones of
    ``recording.status_writes``: what the restarted trainer must find is at least what those
    wrote. ``state`` is the same tree as a value (``content(name)``, ``mode(name)``,
    ``entries``), names relative to the folder. ``folder`` is removed once the check returns.
    ``str(loss)`` says all this in a line, for an assertion's message.
    """

    folder: str
    done: int
    state: FsState
    recording: Recording

    @property
    def returned(self) -> bool:
        """Whether the run had returned: every operation done."""
        return self.done == len(self.recording.ops)

    @property
    def acknowledged(self) -> int:
        """How many status writes had returned (to the trainer) before the power loss."""
        return sum(1 for _, done in self.recording.status_writes if done <= self.done)

    def __str__(self) -> str:
        ops, writes, count = self.recording.ops, self.recording.status_writes, self.acknowledged
        if self.returned:
            when = f"after all {len(ops)} operations (the run had returned)"
        else:
            last = f"; the last: {ops[self.done - 1]}" if self.done else ""
            when = f"after {self.done} of {len(ops)} operations{last}"
        if not writes:
            acknowledged = "the run made no status write"
        elif count == 0:
            acknowledged = f"none of its {len(writes)} status writes acknowledged"
        else:
            acknowledged = (f"status writes 1 to {count} of {len(writes)} acknowledged" if count > 1
                            else f"status write 1 of {len(writes)} acknowledged") + f" (the last of {writes[count - 1][0]})"
        return f"power loss {when}; {acknowledged}; laid out in {self.folder}"


def record(run: Callable[[], object], root: str | os.PathLike[str],
           watch: re.Pattern[str] | None = None) -> tuple[Recording, Recorder]:
    """Run ``run()`` with every os operation in ``root`` recorded; check the recording explains it.

    Background work the run queued (history pruning) is waited for inside the recording, so its
    operations are part of it. The status writes that return are noted with the number of
    operations done by then (through the write protocol's observer, chained to any other).
    """
    folder = os.path.abspath(os.fspath(root))
    os.makedirs(folder, exist_ok=True)
    initial = snapshot(folder)
    recorder = Recorder(folder, initial, watch=watch)
    writes: list[tuple[str, int]] = []
    previous = _atomic.observer

    def observe(point: str, target: str, temp: str, fd: int) -> None:
        if point == "returned":
            real = os.path.realpath(target)
            if real.startswith(recorder.root + os.sep):
                writes.append((os.path.relpath(real, recorder.root), len(recorder.ops)))
        if previous is not None:
            previous(point, target, temp, fd)

    _atomic.observer = observe
    try:
        with recorder:
            try:
                run()
            finally:
                _storage._closer.wait()
    finally:
        _atomic.observer = previous
    verify_recording(recorder, folder)
    return Recording(initial, snapshot(folder), tuple(recorder.ops), status_writes=tuple(writes)), recorder


def power_losses(run: Callable[[], object], check: Callable[[PowerLoss], object], *,
                 root: str | os.PathLike[str], scratch: str | os.PathLike[str] | None = None,
                 block: int = BLOCK) -> Recording:
    """Run ``run()`` in ``root`` once, recorded; then ``check`` every state a power loss could leave.

    Each distinct state (the crash model: "Power loss" in docs/testing.md) is laid out in a
    fresh folder under ``scratch`` (default: a new temporary directory, removed at the end) with
    the names it has under ``root``; ``check(loss)`` should open the store there
    (``os.path.join(loss.folder, "run_logs", "training_status.json")``), as the restarted trainer
    would, and assert what it recovers: at least what the ``loss.acknowledged`` status writes that
    had returned wrote, everything once ``loss.returned``. States equal on disk are checked once
    for each number of writes acknowledged (one more time for the state after the run returned).
    Returns the ``Recording``, with the number of states; its ``operations`` name what was done.
    An exception from ``check`` gets ``str(loss)`` as a note (Python 3.11+), saying which state failed.

    The builtin ``open`` is recorded too (files inside ``root`` get file objects made of ``os``
    calls while recording), so checkpoints written with ``pickle.dump``, ``np.save`` or
    ``torch.save(obj, f)`` are in the model. Raises ``IncompleteRecording`` if the run changed the
    folder in a way the recorder did not see (C code writing to a file name on its own, as
    ``torch.save(obj, "name")`` does): the states would be missing those changes. Give such code a
    file object, or make those files outside ``root``.
    """
    recording, _ = record(run, root)
    base = tempfile.mkdtemp(prefix="trainstatus-power-", dir=None if scratch is None else os.fspath(scratch))
    counter = itertools.count()
    seen: set[tuple[Any, ...]] = set()
    final = len(recording.ops)
    returns = [done for _, done in recording.status_writes]
    try:
        for k, state in crash_states(recording.before, list(recording.ops), block):
            # The same state with more writes acknowledged asks more of the check: checked again.
            key = (bisect.bisect_right(returns, k), k == final, state.key())
            if key in seen:
                continue
            seen.add(key)
            folder = os.path.join(base, str(next(counter)))
            materialize(state, folder)
            loss = PowerLoss(folder, k, state, recording)
            try:
                check(loss)
            except BaseException as exc:
                if hasattr(exc, "add_note"):  # Python 3.11+: pytest shows it under the failure
                    exc.add_note(str(loss))
                raise
            finally:
                shutil.rmtree(folder, ignore_errors=True)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return dataclasses.replace(recording, states=len(seen))
