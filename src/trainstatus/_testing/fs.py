"""Directory trees as values: take one (``snapshot``), lay one out (``materialize``), put one back.

Used by ``trainstatus.testing``: a simulated kill takes a snapshot at the kill and puts it back
once the exception has unwound (so the clean-up that ran on the way out leaves no trace), and the
power-loss enumerator builds states of this kind and materializes them for the user's check.

Everything goes through the ``os`` and ``open`` of this module, so under pyfakefs (which replaces
both in every loaded module) it works on the fake filesystem exactly as on a real one.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import stat
from collections.abc import Callable
from typing import Any

__all__ = ["FsState", "is_lock_name", "materialize", "restore", "snapshot"]


def is_lock_name(rel: str) -> bool:
    """The lock file, the soft lease and filelock's probes: left out of every state.

    They hold no document. A lock is released by the kernel when its holder dies, and a lease of
    a process that is in fact still running (the test's, after a simulated kill) must not be put
    back, or the restarted trainer would wait for it.
    """
    base = os.path.basename(rel)
    return base.endswith((".lock", ".softlock")) or base.startswith(".filelock-")


@dataclasses.dataclass
class FsState:
    """A directory tree: relative name -> ("file", inode) | ("dir", 0) | ("symlink", target).

    ``files`` maps each inode number (local to this state) to its (content, permission bits);
    two names with one inode are hard links of one file.
    """

    entries: dict[str, tuple[str, Any]]
    files: dict[int, tuple[bytes, int]]

    def copy(self) -> FsState:
        return FsState(dict(self.entries), dict(self.files))

    def content(self, rel: str) -> bytes | None:
        """The bytes of the file called ``rel``, or None if there is no such file."""
        entry = self.entries.get(rel)
        if entry is None or entry[0] != "file":
            return None
        return self.files[entry[1]][0]

    def mode(self, rel: str) -> int | None:
        """The permission bits of the file called ``rel``, or None if there is no such file."""
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
    """What is under ``root`` now (an empty state if ``root`` does not exist)."""
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
            try:
                st = os.lstat(full)
                if stat.S_ISLNK(st.st_mode):
                    entries[rel] = ("symlink", os.readlink(full))
                elif stat.S_ISDIR(st.st_mode):
                    entries[rel] = ("dir", 0)
                else:
                    with open(full, "rb") as f:
                        content = f.read()
                    ident = inodes.setdefault((st.st_dev, st.st_ino), len(inodes) + 1)
                    entries[rel] = ("file", ident)
                    files[ident] = (content, stat.S_IMODE(st.st_mode))
            except FileNotFoundError:  # removed while we looked: not part of this state
                continue
    return FsState(entries, files)


def _lay_out(state: FsState, directory: str, names: list[str], made: dict[int, str]) -> None:
    for rel in sorted(names):
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


def materialize(state: FsState, directory: str | os.PathLike[str]) -> None:
    """Lay ``state`` out in ``directory``, which must be empty or missing."""
    directory = os.fspath(directory)
    os.makedirs(directory, exist_ok=True)
    _lay_out(state, directory, list(state.entries), {})


def _remove(full: str) -> None:
    try:
        st = os.lstat(full)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(full)
    else:
        os.unlink(full)


def restore(state: FsState, root: str | os.PathLike[str]) -> bool:
    """Make ``root`` hold exactly ``state`` again (lock files aside); whether anything changed.

    Only what differs is touched: a name whose kind, bytes, permission bits or hard-link group
    changed is removed and laid out again (as a link to a name of its group that is still right,
    where there is one).
    """
    root = os.fspath(root)
    now = snapshot(root)
    wanted = {row[0]: row[1:] for row in state.key()}
    found = {row[0]: row[1:] for row in now.key()}
    if wanted == found:
        return False
    wrong = sorted(rel for rel in found if found[rel] != wanted.get(rel))
    # Deepest first, and nothing inside a directory already removed.
    removed: list[str] = []
    for rel in sorted(wrong, key=lambda r: r.count(os.sep), reverse=True):
        if not any(rel.startswith(gone + os.sep) for gone in removed):
            _remove(os.path.join(root, rel))
            removed.append(rel)
    missing = [rel for rel in state.entries if wanted[rel] != found.get(rel)
               or any(rel == gone or rel.startswith(gone + os.sep) for gone in removed)]
    made: dict[int, str] = {}
    for rel, (kind, ref) in state.entries.items():
        if kind == "file" and rel not in missing:
            made.setdefault(ref, os.path.join(root, rel))
    _lay_out(state, root, missing, made)
    return True
