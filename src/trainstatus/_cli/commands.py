"""The ``trainstatus`` command: look at, fix and check a status file from the shell.

This module holds every command but ``show`` and ``get`` (``_cli_read``, which need neither the
codec nor orjson) and ``history``/``diff``/``restore`` (``_cli_history``); ``_cli_base`` holds what
they share and ``run``.

Reading commands (``show``, ``get``, ``check``, ``corrupt list``) read the file's bytes directly
and change nothing: no store is opened, so a damaged file is not moved aside, no lock is taken and
no stale temp file is removed. Changing commands (``set``, ``delete``) go through a
``StatusStore``, so they are locked, atomic and durable like any trainer's write and safe while a
trainer runs. ``corrupt restore`` writes a kept-aside copy back byte for byte under the same lock
and with the same write protocol, keeping the file it replaces aside first; ``restore``
(``_cli_history``) does the same with a version from the history.

Output: results on stdout; errors as one line ``trainstatus: error: ...`` and library warnings as
one line ``trainstatus: warning: ...`` on stderr, never a traceback. Exit status: 0 success (a
sound file for ``check``); 1 ``get``/``delete`` of a key that is not set, or ``check`` found
warnings; 2 an error (missing, unreadable or damaged file, bad value, reserved category, lock held
too long, bad usage, a URL for PATH), or ``check`` found the file corrupt, unreadable or holding a
name twice in one object; 130 interrupted by Ctrl-C (one line, ``trainstatus: interrupted``).

Importing this module stays cheap: argparse, json and trainstatus itself, never numpy.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
import warnings
from typing import TYPE_CHECKING, Any

from .._storage import history as _history, filenames as _names
from .base import (
    EXIT_ERROR,
    EXIT_NOT_SET,
    EXIT_OK,
    EXIT_WARNINGS,
    LONG_VALUE,
    MISSING,
    _duplicate_problem,
    _cli_words,
    _cut,
    _Fail,
    _file_in_the_way,
    _json,
    _label,
    _missing,
    _plural,
    _read_bytes,
    _read_status,
    _unreadable,
    _where,
    is_url,
    read_object,
    run,
    storage_options,
)
from .._codec.values import decode
from .._errors import TrainingStatusValueError, TrainingStatusVersionError, TrainingStatusWarning
from .._load import METADATA, STATUS_FORMAT_VERSION, Corrupt, Document, check_metadata, find_duplicates, load_document
from .._storage.local import LocalFile
from .lock import _lock_state, _soft_lease_state
from .names import PROG
from .._lazy import lazy_module

if TYPE_CHECKING:
    from .._checkpoints import checkpoint_list as _checkpoints
    from .. import _store
else:  # only the commands that write (and check --files) need them: check reads alone
    _checkpoints = lazy_module("trainstatus._checkpoints.checkpoint_list")
    _store = lazy_module("trainstatus._store")

__all__ = ["run"]





# -- small helpers ----------------------------------------------------------------------------
















def _load(path: str) -> Document:
    """The parsed document, or a one-line error; changes nothing (a damaged file stays put)."""
    return _validated(path, _read_status(path))


def _validated(path: str, data: bytes) -> Document:
    try:
        document = load_document(data)
    except Corrupt as exc:
        raise _Fail(f"{path} is damaged: {exc.reason}; it was left as it is (`{PROG} check` tells more)") from None
    for duplicate in document.duplicates:
        warnings.warn(TrainingStatusWarning(f"{path}: {_duplicate_problem(duplicate)}", path=path), stacklevel=2)
    return document






def _target(path: str) -> tuple[str, str]:
    """(directory, name) of the file a store on ``path`` really writes (symlinks resolved)."""
    return os.path.split(os.path.realpath(path))


def _shown_directory(path: str, directory: str) -> str:
    """How to show files beside ``path``: under the directory as the user wrote it if it is the same."""
    given = os.path.dirname(path)
    if os.path.realpath(given or ".") == directory:
        return given
    return directory


# -- show, get --------------------------------------------------------------------------------












# -- set, delete --------------------------------------------------------------------------------


# Spellings of true/false/null and the non-finite floats that are not JSON's, lowercased: Python's
# (True, None, nan, inf) and their case variants. A careful user meant the value, not the word.
_PYTHON_SPELLINGS = {
    "true": "true", "false": "false", "none": "null", "null": "null",
    "nan": "NaN", "+nan": "NaN", "-nan": "NaN",
    "inf": "Infinity", "+inf": "Infinity", "infinity": "Infinity", "+infinity": "Infinity",
    "-inf": "-Infinity", "-infinity": "-Infinity",
}
# What JSON (with the NaN/Infinity literals Python's json and ML-Agents write) spells as itself.
_JSON_WORDS = {"true", "false", "null", "NaN", "Infinity", "-Infinity"}
_JSON_START = re.compile(r'\s*[\[{"0-9-]')


def _shown(text: str) -> str:
    """VALUE as an error shows it: a long one cut (it may be megabytes read from stdin)."""
    return text if len(text) <= 60 else text[:57] + "..."


def _fail_value(text: str, problem: str, remedy: str) -> _Fail:
    return _Fail(f"VALUE {_shown(text)!r} {problem}; nothing was changed. {remedy}")


class _OutOfRange(Exception):
    def __init__(self, number: str, kind: str, meant: str) -> None:
        self.number = number
        self.kind = kind
        self.meant = meant  # what to write if that is the value meant


def _finite(number: str) -> float:
    """A JSON number as a float, unless it is too large (read as Infinity) or too small (read as 0).

    The literals NaN, Infinity and -Infinity do not pass here (json's parse_constant takes them):
    written out, they are what the user meant.
    """
    value = float(number)
    if math.isinf(value):
        meant = "-Infinity" if value < 0 else "Infinity"
        raise _OutOfRange(number, f"too large for a float: it would be stored as {meant}", meant)
    mantissa = re.split("[eE]", number)[0]
    if value == 0 and re.search("[1-9]", mantissa):
        raise _OutOfRange(number, "too small for a float: it would be stored as 0", "0")
    return value


def _read_stdin() -> str:
    """VALUE ``-``: the value from standard input, without the newline that ends its last line."""
    data = sys.stdin.buffer.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _Fail(f"VALUE - (standard input) is not UTF-8 text: {exc.reason} at byte {exc.start}; "
                    "nothing was changed") from None
    return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def _parse_value(text: str) -> Any:
    """VALUE as JSON, or as the text itself when it cannot have been meant as JSON; see set's help."""
    word = text.strip()
    spelling = _PYTHON_SPELLINGS.get(word.lower())
    if spelling is not None and word not in _JSON_WORDS:
        raise _fail_value(text, f"is Python's spelling; JSON's is {spelling}",
                          f"Pass {spelling}, or pass --string to store the text {text!r}")
    try:
        value = json.loads(text, parse_float=_finite)
    except _OutOfRange as exc:
        held = "is" if exc.number == word else f"holds {exc.number},"
        raise _fail_value(text, f"{held} a number {exc.kind}",
                          f"Write {exc.meant} if that is what you mean, or pass --string to store the text as it "
                          "is") from None
    except RecursionError:
        raise _Fail("VALUE is nested too deeply to be stored") from None
    except json.JSONDecodeError as exc:
        error = exc
    else:
        # json keeps the last of a repeated key, as it does in a file; the user meant one of them.
        try:
            repeated = find_duplicates(text.encode("utf-8", "surrogatepass"))
        except Corrupt:  # parsed once, but the second parse's hook took the last levels of the stack
            raise _Fail("VALUE is nested too deeply to be stored") from None
        if repeated:
            first = repeated[0]
            times = "twice" if len(first.values) == 2 else f"{len(first.values)} times"
            raise _fail_value(
                text, f"gives the key {json.dumps(first.where[-1], ensure_ascii=False)} {times} in one "
                      f"object ({first.name}: {first.listed}), and JSON keeps only the last",
                "Give each key once",
            )
        return value
    number = _python_number(word)
    if number is not None:
        raise _fail_value(text, "is a number JSON does not write that way",
                          f"Write {number}, or pass --string to store the text {text!r}")
    if _JSON_START.match(text):
        at = f"column {error.colno}" if error.lineno == 1 else f"line {error.lineno} column {error.colno}"
        # json's "Unterminated string starting at" already ends with the preposition.
        at = at if error.msg.endswith(" at") else f"at {at}"
        raise _fail_value(text, f"looks like JSON but is not: {error.msg} {at}",
                          "Fix it, or pass --string to store the text as it is")
    return text  # plain text (a word, a file name): stored as the string it is


def _python_number(word: str) -> str | None:
    """The JSON spelling of a number Python reads in ``word`` (+5, .5, 1_000, 007), else None."""
    for kind in (int, float):
        try:
            number = kind(word)
        except ValueError:
            continue
        if isinstance(number, float) and not math.isfinite(number):
            return None  # 1e999 and the like: JSON reads them too, or the words above caught them
        return json.dumps(number)
    return None


def _open_store(args: argparse.Namespace) -> _store.StatusStore:
    if is_url(args.path):
        # No lock and no history there: each write is conditional on the version read.
        return _store.StatusStore(args.path, lock_timeout=args.lock_timeout, lock=args.lock,
                                  allow_downgrade=args.allow_downgrade, storage_options=storage_options(args))
    # This command does not know the history= of the trainers writing the file: it keeps as
    # many versions as it finds (at least the default), so an edit neither shrinks the count a
    # trainer keeps nor grows it.
    directory, name = _target(args.path)
    # At least as many as are there, so the count stays put instead of growing with each edit.
    history = max(_store.DEFAULT_HISTORY, len(_history.versions(directory, name)))
    return _store.StatusStore(args.path, lock_timeout=args.lock_timeout, lock=args.lock,
                       allow_downgrade=args.allow_downgrade, history=history)


def _newer_format(exc: TrainingStatusVersionError, args: argparse.Namespace) -> _Fail:
    """The store's refusal to rewrite a newer format, naming the flag rather than the keyword."""
    return _Fail(
        f"refusing to write {args.path}: it has format version {exc.found_version!r}, newer than the "
        f"{STATUS_FORMAT_VERSION!r} this trainstatus writes, and rewriting it would drop what this "
        "version does not understand; nothing was changed. Upgrade trainstatus, or pass "
        f"--allow-downgrade to rewrite it in format {STATUS_FORMAT_VERSION}"
    )


def _reserved(exc: TrainingStatusValueError, args: argparse.Namespace) -> _Fail | None:
    """The store's refusal of the ``metadata`` category, in command-line words."""
    if exc.category != METADATA or exc.key != args.key or args.category != METADATA:
        return None
    return _Fail(
        f"cannot change {_where(METADATA, args.key)} in {args.path}: the category {METADATA!r} is "
        "the metadata block, which trainstatus and the trainer write; nothing was changed"
    )


def _cmd_set(args: argparse.Namespace) -> int:
    # --string stores VALUE as it is, "-" included: to store the text "-", pass --string -.
    text = _read_stdin() if args.value == "-" and not args.string else args.value
    value = text if args.string else _parse_value(text)
    directory = None if is_url(args.path) else _target(args.path)[0]
    if directory is not None and not os.path.isdir(directory):
        blocking = _file_in_the_way(args.path)
        if blocking is not None:
            raise _Fail(f"cannot create {args.path}: {blocking} is a file, not a directory; nothing was changed")
        raise _Fail(
            f"cannot create {args.path}: the directory {directory} does not exist; "
            "create it first (mkdir -p)"
        )
    store = _open_store(args)
    try:
        with store.transaction():
            created = not _exists(store)
            old = store.get(args.category, args.key, MISSING)
            store.set(args.category, args.key, value)
    except TrainingStatusValueError as exc:
        raise _reserved(exc, args) or exc
    except TrainingStatusVersionError as exc:
        raise _newer_format(exc, args) from None
    finally:
        store.close()
    if created:
        print(f"created {args.path}")
    before = "(not set)" if old is MISSING else _cut_old(_json(old), args.path)
    print(f"{_where(args.category, args.key)}: {before} -> {_cut(_json(value), args.path, args.category, args.key)}")
    return EXIT_OK


def _cut_old(text: str, path: str, *, within: bool = False) -> str:
    """A replaced value as shown: cut like ``_cut``, pointing at the history that keeps it.

    ``within``: the text is shown inside parentheses already (no second pair for the note).
    """
    if len(text) <= LONG_VALUE:
        return text
    note = f"cut: {len(text):,} characters; `{PROG} diff {shlex.quote(path)}` shows it whole"
    return f"{text[:LONG_VALUE]}... {note}" if within else f"{text[:LONG_VALUE]}... ({note})"


def _exists(store: _store.StatusStore) -> bool:
    """Whether the store's document existed when it was last read (in a transaction: at its start)."""
    found = getattr(store._storage, "found", None)
    return bool(found()) if found is not None else os.path.exists(store.path)


def _cmd_delete(args: argparse.Namespace) -> int:
    if not is_url(args.path) and not os.path.exists(args.path):
        raise _Fail(_missing(args.path))
    store = _open_store(args)
    try:
        with store.transaction():
            if not _exists(store):
                raise _Fail(_missing(args.path))
            old = store.get(args.category, args.key, MISSING)
            removed = store.delete(args.category, args.key)
    except TrainingStatusValueError as exc:
        raise _reserved(exc, args) or exc
    except TrainingStatusVersionError as exc:
        raise _newer_format(exc, args) from None
    finally:
        store.close()
    if not removed:
        raise _Fail(
            f"{_where(args.category, args.key)} is not set in {args.path}; nothing was changed",
            EXIT_NOT_SET,
        )
    # The whole old value stays in the history: `trainstatus diff` shows it.
    print(f"deleted {_where(args.category, args.key)} (was {_cut_old(_json(old), args.path, within=True)})")
    return EXIT_OK


# -- check ----------------------------------------------------------------------------------------


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


def _copies(directory: str, name: str) -> list[str]:
    """Names of the copies of ``name`` kept aside in ``directory``, newest first."""
    pattern = _names.copy_pattern(name)
    found = []
    try:
        with os.scandir(directory) as it:
            for entry in it:
                match = pattern.fullmatch(entry.name)
                if match:
                    found.append((match.group(1), int(match.group(2) or 0), entry.name))
    except OSError:
        return []
    return [name for _, _, name in sorted(found, reverse=True)]


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


def _root(root: str | None) -> str | None:
    """``--root DIR``, which must be a directory: else every relative path would look missing."""
    if root is not None and not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "does not exist"
        raise _Fail(f"--root {root} {what}: give the directory the checkpoint paths listed in the file "
                    "are relative to (where mlagents-learn ran)")
    return root


def _check_files(report: _Report, document: Document, path: str, root: str | None) -> None:
    """``check --files``: every file a checkpoint entry lists must exist and, where the entry
    recorded sizes, have its recorded size (a warning each if not)."""
    categories = {c: {k: decode(e) for k, e in entries.items()} for c, entries in document.categories.items()}
    listed = sum(len(paths) for _, _, paths in _checkpoints._listed(categories))
    where = f"under {root}" if root is not None else "under the current directory"
    missing = _checkpoints.missing_files(categories, root)
    changed = _checkpoints.changed_files(categories, root)
    rooted = [] if root is None else ["--root", root]

    def fix(category: str, key: str) -> str:
        if key == _checkpoints.FINAL_CHECKPOINT:
            return f"`{shlex.join([PROG, 'delete', path, category, key])}` removes it"
        return f"`{shlex.join([PROG, 'prune-missing', *rooted, path])}` removes such entries"

    for category, key, file_path in missing:
        report("warning", f"{_where(category, key)} lists {file_path}, which does not exist ({where}); "
                          f"a resume from it fails: put the file back, or {fix(category, key)}")
    for category, key, _, why in changed:
        report("warning", f"{_where(category, key)}: {why} ({where}); the checkpoint was changed since it was "
                          f"recorded (truncated, overwritten) and a resume from it fails: put the file back, "
                          f"or {fix(category, key)}")
    if not missing and not changed:
        report("ok", f"every checkpoint file listed exists with its recorded size ({_plural(listed, 'file')}, "
                     f"{where})")


def _cmd_check(args: argparse.Namespace) -> int:
    if args.root is not None and not args.files:
        raise _Fail("--root is where --files looks for relative checkpoint paths: pass --files too")
    _root(args.root)
    path = args.path
    report = _Report()
    remote = is_url(path)
    directory, name = ("", "") if remote else _target(path)
    unreadable = False
    try:
        data = read_object(args) if remote else _read_bytes(path)
    except _Fail as exc:  # no such object
        report("error", exc.message)
        unreadable = True
    except OSError as exc:
        report("error", _cli_words(str(exc)) if remote else _unreadable(path, exc))
        unreadable = True
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
    else:
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


# -- corrupt list, corrupt restore -----------------------------------------------------------------


def _cmd_corrupt_list(args: argparse.Namespace) -> int:
    directory, name = _target(args.path)
    copies = _copies(directory, name)
    exists = os.path.lexists(args.path)
    if not copies:
        if not exists:
            raise _Fail(_missing(args.path))
        print(f"no copies of {args.path} are kept aside")
        return EXIT_OK
    shown = _shown_directory(args.path, directory)
    rows = []
    for copy in copies:
        full = os.path.join(directory, copy)
        try:
            data = _read_bytes(full)
        except OSError as exc:
            rows.append((os.path.join(shown, copy), "?", f"unreadable: {exc.strerror or exc}"))
            continue
        try:
            document = load_document(data)
        except Corrupt as exc:
            state = f"damaged: {exc.reason}"
        else:
            keys = sum(len(entries) for entries in document.categories.values())
            state = f"parses: {_plural(len(document.categories), 'category', 'categories')}, {_plural(keys, 'key')}"
        rows.append((os.path.join(shown, copy), f"{len(data)} bytes", state))
    name_width = max(len(row[0]) for row in rows)
    size_width = max(len(row[1]) for row in rows)
    for copy_path, size, state in rows:
        print(f"{copy_path:<{name_width}}  {size:>{size_width}}  {state}")
    if not exists:  # a store moved the damaged file aside and has not written since: not an error
        print(f"({_missing(args.path)} now; `{PROG} corrupt restore {args.path} COPY` puts a copy back)")
    return EXIT_OK


def _resolve_copy(path: str, copy: str) -> tuple[str, str]:
    """(full path, name) of the kept-aside copy ``copy`` of ``path``, or a one-line error."""
    directory, name = _target(path)
    candidate = copy if os.sep in copy else os.path.join(directory, copy)
    copy_name = os.path.basename(candidate)
    copy_directory = os.path.realpath(os.path.dirname(os.path.abspath(candidate)))
    if copy_directory != directory or not _names.copy_pattern(name).fullmatch(copy_name):
        raise _Fail(
            f"{copy} is not a copy of {path} kept aside (expected {_names.copy_stem(name)}.corrupt-<time> in "
            f"{directory}); `{PROG} corrupt list {path}` lists them"
        )
    return os.path.join(directory, copy_name), copy_name


def _cmd_corrupt_restore(args: argparse.Namespace) -> int:
    copy_path, copy_name = _resolve_copy(args.path, args.copy)
    try:
        data = _read_bytes(copy_path)
    except FileNotFoundError:
        raise _Fail(f"no kept-aside copy at {args.copy}") from None
    except OSError as exc:
        raise _Fail(_unreadable(args.copy, exc)) from None
    try:
        load_document(data)
    except Corrupt as exc:
        raise _Fail(
            f"cannot restore {args.copy}: it does not parse as a status document either "
            f"({exc.reason}); nothing was changed"
        ) from None
    directory, name = _target(args.path)
    shown = _shown_directory(args.path, directory)
    storage = LocalFile(os.path.abspath(args.path), durable=True, lock=args.lock)
    kept = None
    try:
        with storage.lock(args.lock_timeout, configured=args.lock_timeout):
            current = storage.read()  # also remembers its mode and owner for the new file
            if current is not None:
                kept = storage.keep_copy(current)
            storage.replace(data)  # temp file, fsync, rename, directory fsync (the link too)
            unkept = storage.take_warning()
            if unkept is not None:
                warnings.warn(unkept, stacklevel=1)
    finally:
        storage.close()
    if kept is not None:
        kept_shown = os.path.join(shown, os.path.basename(kept))
        print(f"kept the current {args.path} aside as {kept_shown}")
    print(f"restored {args.path} from {os.path.join(shown, copy_name)} ({_plural(len(data), 'byte')})")
    if kept is not None:
        print(f"to undo: {PROG} corrupt restore {args.path} {kept_shown}")
    return EXIT_OK


# -- the parser -----------------------------------------------------------------------------------

def _no_subcommand(args: argparse.Namespace) -> int:  # pragma: no cover - argparse requires one
    raise _Fail("a subcommand is required")


# -- main -------------------------------------------------------------------------------------------












