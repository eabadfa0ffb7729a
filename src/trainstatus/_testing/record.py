"""The trace of a run: the operations that decide what a power loss can leave, as they happen.

``Recorder`` is the ``_testing.interpose`` hook that logs, in order, the
operations that decide what a power loss can leave:

    create   os.open(O_CREAT) of a name that did not exist      (directory operation)
    mkdir    os.mkdir                                           (directory operation)
    rename   os.replace / os.rename                             (directory operation)
    link     os.link                                            (directory operation)
    unlink   os.unlink / os.remove                              (directory operation)
    write    os.write / os.pwrite, at the descriptor's offset   (file data; O_APPEND: at the end)
    truncate os.ftruncate / os.truncate / os.open(O_TRUNC)      (file data)
    chmod    os.fchmod / os.chmod                               (file attribute)
    fsync    os.fsync of a file (os.fdatasync: data only)
    dirsync  os.fsync of a directory

It works on os-level calls, not on trainstatus' step functions, so it keeps working when the
write protocol is reorganized. The builtin ``open`` inside the root is made of those calls while
recording (``_testing.opens``). And it checks itself: replaying the whole trace over the snapshot
taken before the run must give exactly what is on disk after it (names, bytes, permission bits,
hard links), and no ``open`` for writing inside the root may have bypassed it (its audit event).
A change made some other way (C code's own writes, an os function not listed here) fails that
check loudly (``IncompleteRecording``) instead of going unseen.
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import sys
from typing import Any

from .fs import FsState, is_lock_name, snapshot
from .interpose import Call, Hook, Interposer
from .points import TrainingStatusTestError

__all__ = [
    "DIRECTORY_OPS",
    "FILE_OPS",
    "IncompleteRecording",
    "Op",
    "Recorder",
    "apply_directory_op",
    "apply_file_op",
    "parent_of",
    "replay",
    "verify_recording",
    "write_bytes",
]

DIRECTORY_OPS = frozenset({"create", "mkdir", "rename", "link", "unlink"})
FILE_OPS = frozenset({"write", "truncate", "chmod"})


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


def parent_of(rel: str) -> str:
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


def write_bytes(content: bytes, offset: int, data: bytes) -> bytes:
    if offset > len(content):
        content = content + bytes(offset - len(content))
    return content[:offset] + data + content[offset + len(data):]


def apply_file_op(content: bytes, mode: int, op: Op) -> tuple[bytes, int]:
    if op.kind == "write":
        return write_bytes(content, op.offset, op.data), mode
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
        self._append: set[int] = set()  # descriptors opened with O_APPEND: every write goes to the end
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
            self._append.discard(args[0])
        elif name in ("write", "pwrite"):
            target = self._fd.get(args[0])
            if target is None or target[0] != "file":
                return
            data = bytes(args[1])[:result]
            if args[0] in self._append and (name == "write" or sys.platform == "linux"):
                # At the end, wherever the offset is (Linux's pwrite too): another descriptor may have appended.
                offset = len(self.live.files[target[1]][0])
            else:
                offset = args[2] if name == "pwrite" else self._offset.get(args[0], 0)
            if name == "write":
                self._offset[args[0]] = offset + result
            self._emit(Op("write", inode=target[1], offset=offset, data=data, seen_mode=self._real_mode(args[0])))
        elif name == "read":
            if args[0] in self._offset:  # a read moves the offset the next write goes to
                self._offset[args[0]] += len(result)
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
            self._emit(Op("link" if name == "link" else "rename", rel=source, dest=dest, directory=parent_of(dest)))
        elif name in ("unlink", "remove"):
            self._known(rels[0])
            self._emit(Op("unlink", rel=rels[0], directory=parent_of(rels[0])))
        elif name == "mkdir":
            self._emit(Op("mkdir", rel=rels[0], directory=parent_of(rels[0])))
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
        if flags & os.O_APPEND:
            self._append.add(fd)
        if not self._existed:
            inode = self._next_inode
            self._next_inode += 1
            self._emit(Op("create", rel=rel, directory=parent_of(rel), inode=inode, mode=stat.S_IMODE(st.st_mode),
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


# Python 3.10's pathlib reaches os through pathlib._NormalAccessor, whose bindings the recording
# replaces too (``_testing.interpose``); that is tested with a stand-in of the accessor only, so on
# 3.10 every message names pathlib as a possible cause.
_PATHLIB_ACCESSOR = sys.version_info < (3, 11)


def _incomplete(message: str) -> IncompleteRecording:
    if _PATHLIB_ACCESSOR:
        message += ("" if message.endswith(".") else ".") + (
            " On Python 3.10, pathlib's Path methods (open, write_bytes, mkdir, unlink, replace) reach os through "
            "pathlib._NormalAccessor, which the recording patches; if pathlib made that change, make it with "
            "open() and os calls instead, or run the test on Python 3.11 or later.")
    return IncompleteRecording(message)


def verify_recording(recorder: Recorder, root: str | os.PathLike[str]) -> None:
    """Replaying the trace must give exactly the real directory, and nothing may have been
    written unseen (even a file removed again)."""
    if recorder.unseen_names:
        raise _incomplete(
            f"{', '.join(recorder.unseen_names)} in {os.fspath(root)} {'was' if len(recorder.unseen_names) == 1 else 'were'} "
            "opened for writing by code the recorder does not see (a C extension writing to a file "
            "name itself, as torch.save(obj, 'name') does, or a module that kept the builtin open from "
            "before the recording), so the power-loss states would miss those writes. Give such code "
            "a file object (torch.save(obj, f) with f = open(name, 'wb')), or write outside the folder.")
    if recorder.unexplained:
        raise _incomplete(
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
        raise _incomplete(
            f"the recorded operations do not explain the directory after the call; differing names: "
            f"{differences}; trace: {[str(op) for op in recorder.ops]}")
