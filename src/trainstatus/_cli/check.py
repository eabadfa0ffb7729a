"""``trainstatus check``: validate a status file, and what lies beside it, without changing anything.

It reads the file's bytes directly: no store is opened, so a damaged file is not moved aside, no
lock is taken and no stale temp file is removed. Its findings, one line each (``_Report``): does
the file parse, names given twice, its format version, and beside a local file the lock and a
soft lease, temp files a killed writer left, copies kept aside and the history; with ``--files``,
the checkpoint files the entries list. The findings add up to the exit status: 0 sound, 1
warnings, 2 corrupt, unreadable or a name given more than once.

Imports ``base``, ``lock``, ``names`` and ``target`` of the command line, the loader and the codec;
the checkpoint module only for ``--files`` (``lazy_module``).
"""

from __future__ import annotations

import argparse
import os
import shlex
import warnings
from typing import TYPE_CHECKING

from .._storage import history as _history, filenames as _names
from .base import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_WARNINGS,
    _duplicate_problem,
    _cli_words,
    _Fail,
    _label,
    _plural,
    _read_bytes,
    _unreadable,
    _where,
    is_url,
    read_object,
)
from .._codec.values import decode
from .._load import STATUS_FORMAT_VERSION, Corrupt, Document, check_metadata, load_document
from .lock import _lock_state, _soft_lease_state
from .names import PROG
from .target import _bad_root, _copies, _faults_shown, _root, _shown_directory, _target, _where_to_look
from .._lazy import lazy_module

if TYPE_CHECKING:
    from .._checkpoints import files as _checkpoints
    from .._checkpoints.roots import Base
else:  # only check --files needs it: check reads alone
    _checkpoints = lazy_module("trainstatus._checkpoints.files")

__all__ = ["_cmd_check"]


_LEVELS = {"ok": EXIT_OK, "info": EXIT_OK, "warning": EXIT_WARNINGS, "problem": EXIT_ERROR,
           "corrupt": EXIT_ERROR, "error": EXIT_ERROR}


class _Report:
    """Findings of ``check``, one line each, and the exit status they add up to."""

    def __init__(self) -> None:
        self.status = EXIT_OK
        self.warnings = 0
        self.problems = 0

    def __call__(self, level: str, text: str) -> None:
        self.status = max(self.status, _LEVELS[level])
        self.warnings += level == "warning"
        self.problems += level == "problem"
        print(f"{level}: {text}")


def _temp_files(directory: str, name: str) -> list[tuple[str, int | None]]:
    pattern = _names.temp_pattern(name)
    found = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if pattern.fullmatch(entry.name):
                    try:
                        size: int | None = entry.stat(follow_symlinks=False).st_size
                    except OSError:
                        size = None
                    found.append((entry.name, size))
    except OSError:
        return []
    return sorted(found)


def _fold_folders(missing: list[tuple[str, str, str]]) -> list[tuple[str, str, str, int]]:
    """``(category, key, path, files folded in)``: each missing path, but those under a missing
    folder the same list names, counted into that folder's line instead. A checkpoint folder deleted
    whole (Transformers' ``checkpoint-500/``) is one finding, not one warning per file it held."""
    gone = {(category, key, os.path.normpath(path)) for category, key, path in missing}

    def folder_of(category: str, key: str, path: str) -> str | None:
        outermost = None
        child, parent = os.path.normpath(path), os.path.dirname(os.path.normpath(path))
        while parent and parent != child:  # up to "" (relative) or "/" (its own dirname)
            if (category, key, parent) in gone:
                outermost = parent
            child, parent = parent, os.path.dirname(parent)
        return outermost

    inside: dict[tuple[str, str, str], set[str]] = {}
    kept = []
    for category, key, path in missing:
        folder = folder_of(category, key, path)
        if folder is None:
            kept.append((category, key, path))
        else:
            inside.setdefault((category, key, folder), set()).add(os.path.normpath(path))
    return [(category, key, path, len(inside.get((category, key, os.path.normpath(path)), ())))
            for category, key, path in kept]


def _check_files(report: _Report, document: Document, path: str, root: str | None) -> None:
    """``check --files``: every file a checkpoint entry lists must exist and, where the entry
    recorded sizes, have its recorded size (a warning each if not, a missing folder's files counted in
    its one warning: ``_fold_folders``), relative paths under the folder
    each category records, else ``--root``, else the current directory (one line says which)."""
    categories = {c: {k: decode(e) for k, e in entries.items()} for c, entries in document.categories.items()}
    status_path = path if is_url(path) else os.path.abspath(path)
    counts: dict[str, int] = {}
    for category, _, paths in _checkpoints._listed(categories):
        counts[category] = counts.get(category, 0) + len(paths)
    rooted = [] if root is None else ["--root", root]
    found = _checkpoints.bases(categories, status_path, root)
    bases: dict[str, Base] = {}
    emptied: set[str] = set()
    unchecked = False
    for category, base in found.items():
        if not counts.get(category):
            continue
        if isinstance(base, ValueError):  # roots.BadRoot
            unchecked = True
            report("warning", f"the {_plural(counts[category], 'checkpoint file')} {_label(category)} lists were not "
                              f"checked: {_bad_root(path, category, base)}")
            continue
        bases[category] = base
        report("info", f"{_label(category)}: relative checkpoint paths are looked up under {base.shown()}, "
                       f"{base.why('given by --root')}")
        listed = categories[category].get(_checkpoints.CHECKPOINTS)
        faulty = _checkpoints.all_faulty(listed, base.folder)  # prune-missing would drop them all: it refuses
        if faulty:
            emptied.add(category)
            gone = _checkpoints.all_missing(listed, base.folder)
            shown = ", ".join(gone[:3]) + (f" (and {len(gone) - 3} more)" if len(gone) > 3 else "")
            command = shlex.join([PROG, "prune-missing", "--force", *rooted, path])
            what = (f"{_plural(len(gone), 'file')} and not one of them exists under {base.shown()}: {shown}" if gone
                    else f"{_plural(len(faulty), 'entry', 'entries')} and not one of them is whole under "
                         f"{base.shown()}: {_faults_shown(faulty)}")
            report("warning", f"{_where(category, _checkpoints.CHECKPOINTS)} lists {what}; {_where_to_look(base)}; if "
                              f"the checkpoints are really gone, `{command}` removes every entry")
    checked = {category: categories[category] for category in bases}
    missing = [(category, key, file_path)
               for category, key, file_path in _checkpoints.missing_files(checked, root, status_path=status_path)
               if not (category in emptied and key == _checkpoints.CHECKPOINTS)]
    changed = [(category, key, file_path, why)
               for category, key, file_path, why in _checkpoints.changed_files(checked, root, status_path=status_path)
               if not (category in emptied and key == _checkpoints.CHECKPOINTS)]

    def fix(category: str, key: str) -> str:
        if key == _checkpoints.FINAL_CHECKPOINT:
            return f"`{shlex.join([PROG, 'delete', path, category, key])}` removes it"
        return f"`{shlex.join([PROG, 'prune-missing', *rooted, path])}` removes such entries"

    for category, key, file_path, inside in _fold_folders(missing):
        what = (f"the folder {file_path} ({_plural(inside, 'file')} recorded in it)" if inside else file_path)
        report("warning", f"{_where(category, key)} lists {what}, which does not exist (under "
                          f"{bases[category].shown()}); a resume from it fails: put the "
                          f"{'folder' if inside else 'file'} back, or {fix(category, key)}")
    for category, key, _, why in changed:
        report("warning", f"{_where(category, key)}: {why} (under {bases[category].shown()}); the checkpoint was "
                          f"changed since it was recorded (truncated, overwritten) and a resume from it fails: put "
                          f"the file back, or {fix(category, key)}")
    if not missing and not changed and not emptied and not unchecked:
        folders = {base.shown() for base in bases.values()}
        where = "" if not folders else f", under {folders.pop()}" if len(folders) == 1 else f", under {len(folders)} folders"
        report("ok", f"every checkpoint file listed exists with its recorded size "
                     f"({_plural(sum(counts[c] for c in bases), 'file')}{where})")


def _cmd_check(args: argparse.Namespace) -> int:
    if args.root is not None and not args.files:
        raise _Fail("--root is where --files looks for relative checkpoint paths: pass --files too")
    _root(args.root)
    path = args.path
    report = _Report()
    remote = is_url(path)
    directory, name = ("", "") if remote else _target(path)
    unreadable = directory_given = False
    try:
        data = read_object(args) if remote else _read_bytes(path)
    except _Fail as exc:  # no such object
        report("error", exc.message)
        unreadable = True
    except OSError as exc:
        report("error", _cli_words(str(exc)) if remote else _unreadable(path, exc))
        unreadable = True
        directory_given = isinstance(exc, IsADirectoryError)
    else:
        try:
            document = load_document(data)
        except Corrupt as exc:
            report("corrupt", exc.reason)
        else:
            keys = sum(len(entries) for entries in document.categories.values())
            report("ok", f"parses as a status document: {_plural(len(document.categories), 'category', 'categories')}, "
                         f"{_plural(keys, 'key')}, {_plural(len(data), 'byte')}")
            for duplicate in document.duplicates:
                report("problem", _duplicate_problem(duplicate))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                check_metadata(document.metadata, {}, location=path)
            for warning in caught:
                report("warning", _cli_words(str(warning.message)))
            if document.skipped:
                report("info", f"not read by this version (entries of the newer format): "
                               f"{', '.join(_label(name) for name in document.skipped)}")
            if not caught:
                report("ok", f"format version {STATUS_FORMAT_VERSION}")
            if args.files:
                _check_files(report, document, path, args.root)
    if args.files and (unreadable or report.status == EXIT_ERROR):
        report("info", "checkpoint files not checked (--files): the file is not a readable status document")
    if remote:
        report("info", "an object store takes no lock: each write is conditional on the version it read")
    elif not directory_given:  # a folder has no lock, temp files or history of its own: nothing is "ok"
        _check_beside(report, path, directory, name)
    return _verdict(report, path, unreadable)


def _check_beside(report: _Report, path: str, directory: str, name: str) -> None:
    """check's findings about what lies beside a local file: the lock, a lease, temp files, copies, history."""
    lock_file = os.path.join(directory, _names.lock_name(name))
    state, detail = _lock_state(lock_file)
    if state == "held":
        report("info", f"a write or a transaction is in progress: the lock is held by {detail}")
    elif state == "free":
        report("ok", f"the lock is free ({detail})")
    else:
        report("info", f"the lock state is unknown: {detail}")
    lease = _soft_lease_state(os.path.join(directory, _names.lease_name(name)))
    if lease is not None:
        level, finding = lease
        if level == "held":
            state = "held"
            report("info", f"a write or a transaction is in progress: {finding}")
        else:
            report(level, finding)

    shown = _shown_directory(path, directory)
    for temp, size in _temp_files(directory, name):
        temp_path = os.path.join(shown, temp)
        size_text = "" if size is None else f" ({_plural(size, 'byte')})"
        if state == "held":
            report("info", f"temp file {temp_path}{size_text}: probably the write in progress")
        else:
            report("warning", f"temp file {temp_path}{size_text} left by a killed writer; the next "
                              "store to open or write this file removes it")

    copies = _copies(directory, name)
    if copies:
        report("info", f"{_plural(len(copies), 'copy', 'copies')} kept aside "
                       f"(damaged, or replaced by a restore), newest {os.path.join(shown, copies[0])}; "
                       f"see `{PROG} corrupt list`")
    try:
        versions = _history.versions(directory, name)
    except OSError:  # an unreadable directory: the findings above say so already
        versions = []
    if versions:
        numbers = (f"number {versions[0].sequence}" if len(versions) == 1
                   else f"numbers {versions[0].sequence} to {versions[-1].sequence}")
        report("info", f"{_plural(len(versions), 'earlier version')} kept in the history ({numbers}); "
                       f"see `{PROG} history`")


def _verdict(report: _Report, path: str, unreadable: bool) -> int:
    if unreadable:
        verdict = "unreadable"
    elif report.problems:
        verdict = f"not sound: {_plural(report.problems, 'name')} given more than once"
    elif report.status == EXIT_ERROR:
        verdict = "corrupt"
    elif report.warnings:
        verdict = f"sound, with {_plural(report.warnings, 'warning')}"
    else:
        verdict = "sound"
    print(f"{path}: {verdict}")
    return report.status
