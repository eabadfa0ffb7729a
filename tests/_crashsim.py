"""Record what a write does to the file system, and every state a power loss could leave.

Recording
---------
``Interposer`` replaces functions of the ``os`` module for the length of a ``with`` block and
shows a hook every call on a path inside one directory tree (the *root*) or on a descriptor
opened on such a path; every other call passes straight through. ``Recorder`` is the hook that
logs, in order, the operations that decide what a crash can leave:

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
write protocol is reorganized. And it checks itself: replaying the whole trace over the snapshot
taken before the call must give exactly what is on disk after it (names, bytes, permission bits,
hard links). A change made some other way (a builtin ``open``, an os function not listed here)
fails that check loudly instead of going unseen.

The crash model
---------------
A power loss after the first *k* operations of a trace, for every *k* from 0 (nothing done) to
the end (the call returned), may leave any state these rules allow:

1. Directory operations persist in program order: the disk holds a prefix of them. An ``fsync``
   of a directory makes every earlier operation on that directory durable, so the prefix reaches
   at least the last of them. (What a journaling file system such as ext4 gives for metadata;
   POSIX promises less.)
2. File data and permission bits do not follow the directory. A write, truncate or chmod of a
   file is durable once an ``fsync`` of that file followed it; each one that was not followed by
   one may be missing, independently of the others (so they may also appear reordered), and a
   write may be torn at ``BLOCK`` (512-byte sector) granularity: any subset of its blocks (every
   subset up to 6 blocks; beyond that every prefix and every one-block hole), the other blocks
   holding what was there before, or zeros where the file grew; or the file may end after the
   last block that made it; or the file may have grown to its new size with only zeros in the
   new part (size persisted, data not: what delayed allocation leaves).
3. Nothing else: durable data is not corrupted, a file's bytes come from no other file, the disk
   does not lie about fsync. The lock file has no content and is left out.

A file created by the trace starts with no bytes and the permission bits it was created with.

The checker
-----------
``check`` records one call, builds every state of the model (after removing duplicates),
materializes each one in a fresh directory and opens a ``StatusStore`` there: the *recovery*.
Recovery must give the document recovery gives from the state before the call (*old*) or the one
after it (*new*), and the new one for the state after the call returned; it must not meet a
damaged status file unless the old state had one; it must leave no temp file behind; bytes the
scenario says must survive (a damaged file being kept aside) must still exist under some name, and so
must the bytes of any damaged status file recovery met (kept aside, never overwritten);
and a status file holding the old or the new bytes must have the permission bits it had then.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shutil
import stat
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from _helpers import same

from trainstatus import StatusStore, TrainingStatusCorruptWarning, _names
from trainstatus._load import Corrupt, load_document

BLOCK = 512
ALL_SUBSETS_UP_TO = 6  # blocks in one write; beyond that, prefixes and one-block holes only

DIRECTORY_OPS = frozenset({"create", "mkdir", "rename", "link", "unlink"})
FILE_OPS = frozenset({"write", "truncate", "chmod"})


def temp_name_pattern(name: str) -> re.Pattern[str]:
    """The temp file names README documents: ``.<name>.trainstatus-<16 hex>.tmp``."""
    return re.compile(re.escape(f".{name}.trainstatus-") + r"[0-9a-f]{16}\.tmp")


def is_lock_name(rel: str) -> bool:
    """The lock file and filelock's probes: no content, left out of the model."""
    base = os.path.basename(rel)
    return base.endswith(".lock") or base.startswith(".filelock-")


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


class Interposer:
    """Route the os calls that touch ``root`` through ``hook`` while active (a context manager).

    Only calls from the thread that entered are shown; the hook's own os calls pass straight
    through. ``real`` holds the original functions.
    """

    def __init__(self, root: str | os.PathLike[str], hook: Hook) -> None:
        self.root = os.path.realpath(root)
        self.hook = hook
        self.real: dict[str, Callable[..., Any]] = {name: getattr(os, name) for name in PATCHED if hasattr(os, name)}
        self.fds: dict[int, str] = {}
        self._thread = threading.get_ident()
        self._busy = False
        self._saved: dict[str, Any] = {}

    def __enter__(self) -> Interposer:
        self._thread = threading.get_ident()
        for name, real in self.real.items():
            self._saved[name] = getattr(os, name)
            setattr(os, name, self._wrap(name, real))
        return self

    def __exit__(self, *exc: object) -> None:
        for name, saved in self._saved.items():
            setattr(os, name, saved)
        self._saved.clear()

    def inside(self, path: Any) -> str | None:
        """The absolute path if ``path`` (a path or a descriptor) is inside the root."""
        if isinstance(path, int):
            return self.fds.get(path)
        try:
            absolute = os.path.abspath(os.fsdecode(os.fspath(path)))
        except TypeError:
            return None
        if absolute == self.root or absolute.startswith(self.root + os.sep):
            return absolute
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
        def interposed(*args: Any, **kwargs: Any) -> Any:
            if self._busy or threading.get_ident() != self._thread:
                return real(*args, **kwargs)
            paths = self._paths(name, args, kwargs)
            if not paths:
                result = real(*args, **kwargs)
                if name == "open":
                    self.fds.pop(result, None)  # a number reused by an unrelated file
                return result
            call = Call(name, args, kwargs, paths)
            self._busy = True
            try:
                self.hook.before(call)
            finally:
                self._busy = False
            try:
                result = real(*args, **kwargs)
            finally:
                if name == "close" and args:
                    self.fds.pop(args[0], None)
            if name == "open":
                self.fds[result] = paths[0]
            self._busy = True
            try:
                self.hook.after(call, result)
            finally:
                self._busy = False
            return result

        interposed.__name__ = name
        return interposed


# -- file-system states --------------------------------------------------------------------------


@dataclasses.dataclass
class FsState:
    """A directory tree: relative name -> ("file", inode) | ("dir", 0) | ("symlink", target)."""

    entries: dict[str, tuple[str, Any]]
    files: dict[int, tuple[bytes, int]]  # inode -> (content, permission bits)

    def copy(self) -> FsState:
        return FsState(dict(self.entries), dict(self.files))

    def content(self, rel: str) -> bytes | None:
        entry = self.entries.get(rel)
        if entry is None or entry[0] != "file":
            return None
        return self.files[entry[1]][0]

    def mode(self, rel: str) -> int | None:
        entry = self.entries.get(rel)
        if entry is None or entry[0] != "file":
            return None
        return self.files[entry[1]][1]

    def key(self) -> tuple[Any, ...]:
        """Equal for states that look the same on disk (inode numbers renamed canonically)."""
        first_name: dict[int, str] = {}
        rows = []
        for rel in sorted(self.entries):
            kind, ref = self.entries[rel]
            if kind == "file":
                group = first_name.setdefault(ref, rel)
                content, mode = self.files[ref]
                rows.append((rel, kind, content, mode, group))
            else:
                rows.append((rel, kind, ref, 0, ""))
        return tuple(rows)


def snapshot(root: str | os.PathLike[str], ignore: Callable[[str], bool] = is_lock_name) -> FsState:
    """What is under ``root`` now (call it outside an ``Interposer``)."""
    root = os.fspath(root)
    entries: dict[str, tuple[str, Any]] = {}
    files: dict[int, tuple[bytes, int]] = {}
    inodes: dict[tuple[int, int], int] = {}
    for directory, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            full = os.path.join(directory, name)
            rel = os.path.relpath(full, root)
            if ignore(rel):
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                entries[rel] = ("symlink", os.readlink(full))
            elif stat.S_ISDIR(st.st_mode):
                entries[rel] = ("dir", 0)
            else:
                ident = inodes.setdefault((st.st_dev, st.st_ino), len(inodes) + 1)
                entries[rel] = ("file", ident)
                with open(full, "rb") as f:
                    files[ident] = (f.read(), stat.S_IMODE(st.st_mode))
    return FsState(entries, files)


def materialize(state: FsState, directory: Path) -> None:
    """Lay ``state`` out in the empty directory ``directory``."""
    made: dict[int, str] = {}
    for rel in sorted(state.entries):
        kind, ref = state.entries[rel]
        full = os.path.join(directory, rel)
        if kind == "dir":
            os.makedirs(full, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if kind == "symlink":
            os.symlink(ref, full)
        elif ref in made:
            os.link(made[ref], full)
        else:
            content, mode = state.files[ref]
            with open(full, "wb") as f:
                f.write(content)
            os.chmod(full, mode)
            made[ref] = full


# -- the trace -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Op:
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
        self.interposer = Interposer(self.root, self)
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
        elif name in ("replace", "rename"):
            source, dest = (self._rel(os.path.abspath(os.fsdecode(os.fspath(a)))) for a in args[:2])
            self._emit(Op("rename", rel=source, dest=dest, directory=_parent(dest)))
        elif name == "link":
            source, dest = (self._rel(os.path.abspath(os.fsdecode(os.fspath(a)))) for a in args[:2])
            self._emit(Op("link", rel=source, dest=dest, directory=_parent(dest)))
        elif name in ("unlink", "remove"):
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


class IncompleteRecording(AssertionError):
    """The recorded trace does not explain what is on disk: something changed it unseen."""


def verify_recording(recorder: Recorder, root: str | os.PathLike[str]) -> None:
    """Replaying the trace must give exactly the real directory."""
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


def crash_states(initial: FsState, ops: list[Op], block: int = BLOCK) -> Iterator[tuple[int, FsState]]:
    """Every (k, state) the model allows for a power loss after the first k operations."""
    for k in range(len(ops) + 1):
        prefix = ops[:k]
        directory_ops = [i for i, op in enumerate(prefix) if op.kind in DIRECTORY_OPS]
        lower = 0
        for j, op in enumerate(prefix):
            if op.kind == "dirsync":
                for position, i in enumerate(directory_ops):
                    if i < j and prefix[i].directory == op.rel:
                        lower = max(lower, position + 1)
        for m in range(lower, len(directory_ops) + 1):
            names = FsState(dict(initial.entries), dict(initial.files))
            for i in directory_ops[:m]:
                apply_directory_op(names, prefix[i])
            reachable = sorted({ref for kind, ref in names.entries.values() if kind == "file"})
            choices = []
            for inode in reachable:
                file_ops = [(i, op) for i, op in enumerate(prefix) if op.inode == inode and op.kind in FILE_OPS]
                syncs = [i for i, op in enumerate(prefix) if op.inode == inode and op.kind == "fsync"]
                data_syncs = [i for i, op in enumerate(prefix) if op.inode == inode and op.kind == "fdatasync"]
                last_sync = max(syncs, default=-1)
                last_data_sync = max(data_syncs + syncs, default=-1)
                durable, volatile = [], []
                for i, op in file_ops:
                    limit = last_sync if op.kind == "chmod" else last_data_sync
                    (durable if i < limit else volatile).append(op)
                choices.append(_file_outcomes(names.files[inode], durable, volatile, block))
            for combination in itertools.product(*choices):
                state = FsState(dict(names.entries), dict(names.files))
                for inode, outcome in zip(reachable, combination):
                    state.files[inode] = outcome
                yield k, state


# -- recovery and the verdict --------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """What opening a StatusStore on a state gives."""

    document: dict[str, Any] | None
    damaged: bool  # a TrainingStatusCorruptWarning: the status file was kept aside
    error: str | None
    leftovers: list[str]

    def same_document(self, other: Outcome) -> bool:
        return self.document is not None and other.document is not None and same(self.document, other.document)


def recover(directory: Path, target: str) -> Outcome:
    """Open a StatusStore on ``directory/target`` as the next run would, and report."""
    path = directory / target
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            store = StatusStore(path, durable=False, lock_timeout=10)
        except Exception as exc:  # noqa: BLE001 - any exception is a finding
            return Outcome(None, False, f"{type(exc).__name__}: {exc}", [])
        try:
            document = store.to_dict()
        finally:
            store.close()
    damaged = any(isinstance(w.message, TrainingStatusCorruptWarning) for w in caught)
    pattern = temp_name_pattern(os.path.basename(target))
    parent = path.parent
    leftovers = sorted(n for n in os.listdir(parent) if pattern.fullmatch(n)) if parent.is_dir() else []
    return Outcome(document, damaged, None, leftovers)


def _all_bytes(directory: Path) -> set[bytes]:
    found = set()
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            found.add(path.read_bytes())
    return found


@dataclasses.dataclass
class Violation:
    k: int  # crash after this many operations
    problem: str
    state: FsState

    def __str__(self) -> str:
        return f"crash after {self.k} operation(s): {self.problem}"


@dataclasses.dataclass
class Report:
    scenario: str
    ops: list[Op]
    states: int  # distinct crash states checked
    violations: list[Violation]
    damaged: int = 0  # states in which recovery met a damaged status file (and kept it aside)

    def kinds(self) -> set[str]:
        return {v.problem.split(":")[0] for v in self.violations}

    def summary(self, limit: int = 5) -> str:
        lines = [f"{self.scenario}: {self.states} states, {len(self.violations)} violation(s); trace:"]
        lines += [f"  {i}: {op}" for i, op in enumerate(self.ops)]
        lines += [f"  - {v}" for v in self.violations[:limit]]
        return "\n".join(lines)


# Violation kinds (the text before the first colon of ``Violation.problem``).
RAISED = "recovery raised"
DAMAGED = "damaged status file"
NEITHER = "neither old nor new"
LOST = "lost after set() returned"
LEFTOVER = "temp file left after recovery"
BYTES_LOST = "bytes that must survive are gone"
MODE = "wrong permission bits"
HISTORY_DAMAGED = "damaged version in the history"
HISTORY_LOST = "replaced version missing from the history after set() returned"


@dataclasses.dataclass
class Scenario:
    """One call to record: ``prepare(root)`` lays out the files and returns the call to make."""

    name: str
    target: str  # the status file, relative to the root
    prepare: Callable[[Path], Callable[[], None]]
    must_survive: tuple[bytes, ...] = ()  # bytes that must exist under some name in every state


def judge(k: int, final_k: int, state: FsState, outcome: Outcome, old: Outcome, new: Outcome,
          old_state: FsState, new_state: FsState, target: str, directory: Path,
          must_survive: tuple[bytes, ...]) -> list[str]:
    problems = []
    if outcome.error is not None:
        return [f"{RAISED}: {outcome.error}"]
    if outcome.damaged and not old.damaged:
        problems.append(f"{DAMAGED}: recovery kept aside a damaged file holding {state.content(target)!r:.120}")
    if outcome.same_document(new):
        pass
    elif outcome.same_document(old):
        if k == final_k and not old.same_document(new):
            problems.append(f"{LOST}: recovery gives the state before the call")
    elif not outcome.damaged or old.damaged:
        problems.append(f"{NEITHER}: recovery gives {outcome.document!r:.200}")
    if outcome.leftovers:
        problems.append(f"{LEFTOVER}: {outcome.leftovers}")
    damaged_bytes = (state.content(target),) if outcome.damaged and state.content(target) is not None else ()
    if must_survive or damaged_bytes:
        present = _all_bytes(directory)
        for blob in must_survive + damaged_bytes:  # a damaged file is kept aside, byte for byte
            if blob not in present:
                problems.append(f"{BYTES_LOST}: {blob!r:.80}")
    problems += _judge_history(k, final_k, state, old_state, new_state, target)
    content, mode = state.content(target), state.mode(target)
    for reference in (new_state, old_state):
        if content is not None and content == reference.content(target):
            if mode != reference.mode(target):
                problems.append(f"{MODE}: {target} holds the bytes of the "
                                f"{'new' if reference is new_state else 'old'} file with mode {mode:#o}, "
                                f"not {reference.mode(target):#o}")
            break
    return problems


def _history_of(state: FsState, target: str) -> dict[str, bytes]:
    """The versions of ``target`` kept in its history in ``state``: name -> bytes."""
    directory, name = os.path.split(target)
    pattern = _names.history_pattern(name)
    found = {}
    for rel in state.entries:
        if os.path.dirname(rel) == directory and pattern.fullmatch(os.path.basename(rel)):
            content = state.content(rel)
            if content is not None:
                found[rel] = content
    return found


def _parses(data: bytes) -> bool:
    try:
        load_document(data)
    except Corrupt:
        return False
    return True


def _judge_history(k: int, final_k: int, state: FsState, old_state: FsState, new_state: FsState,
                   target: str) -> list[str]:
    """Every kept version is whole; once the call returned, the version it replaced is kept."""
    problems = []
    history = _history_of(state, target)
    for rel, content in sorted(history.items()):
        if not _parses(content):
            problems.append(f"{HISTORY_DAMAGED}: {rel} holds {content!r:.80}")
    old = old_state.content(target)
    kept_after = _history_of(new_state, target)
    # Only where the real call kept it (history on, the old file whole): then a power loss after
    # the return must not lose it.
    if k == final_k and old is not None and old in kept_after.values() and old not in history.values():
        problems.append(f"{HISTORY_LOST}: {old!r:.80}")
    return problems


def record(scenario: Scenario, root: Path, watch: re.Pattern[str] | None = None) -> tuple[FsState, Recorder, FsState]:
    """Run the scenario's call in ``root`` under a Recorder; (state before, recorder, state after)."""
    root.mkdir(parents=True, exist_ok=True)
    call = scenario.prepare(root)
    initial = snapshot(root)
    recorder = Recorder(root, initial, watch=watch)
    with recorder:
        call()
    verify_recording(recorder, root)
    return initial, recorder, snapshot(root)


def check(scenario: Scenario, workdir: Path, block: int = BLOCK) -> Report:
    """Record the scenario in ``workdir/record``, then judge every crash state of the model."""
    initial, recorder, final = record(scenario, workdir / "record")
    scratch = workdir / "states"
    scratch.mkdir()
    counter = itertools.count()

    def recovered(state: FsState) -> tuple[Outcome, Path]:
        directory = scratch / str(next(counter))
        directory.mkdir()
        materialize(state, directory)
        return recover(directory, scenario.target), directory

    old, old_dir = recovered(initial)
    new, new_dir = recovered(final)
    for directory in (old_dir, new_dir):
        shutil.rmtree(directory)
    if new.error is not None or new.leftovers:
        raise AssertionError(f"{scenario.name}: the state after the call does not recover cleanly: {new}")
    final_k = len(recorder.ops)
    seen: set[tuple[Any, ...]] = set()
    violations: list[Violation] = []
    damaged = 0
    for k, state in crash_states(initial, recorder.ops, block):
        must_be_new = k == final_k
        key = (must_be_new, state.key())
        if key in seen:
            continue
        seen.add(key)
        outcome, directory = recovered(state)
        damaged += outcome.damaged
        for problem in judge(k, final_k, state, outcome, old, new, initial, final, scenario.target,
                             directory, scenario.must_survive):
            violations.append(Violation(k, problem, state))
        shutil.rmtree(directory)
    return Report(scenario.name, recorder.ops, len(seen), violations, damaged)
