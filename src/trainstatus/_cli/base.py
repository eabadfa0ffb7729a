"""What every ``trainstatus`` command shares: exit statuses, one-line errors and warnings, reading
a file's bytes, and ``run``, which runs the command ``_cli.main`` parsed.

The reading commands ``show`` and ``get`` (``_cli.read``) need nothing more than this and Python's
json, so that printing a small file costs little more than starting the interpreter; the other
commands live in ``_cli`` (and ``_cli.history``), which loads the store, the codec and orjson.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module behind signal, whose enums cost show 0.5 ms
import errno as errno_codes
import json
import os
import re
import stat
import sys
import warnings

from .names import PROG
from .._errors import TrainingStatusError, TrainingStatusLockTimeout, TrainingStatusUnfinishedWrite, TrainingStatusWarning
from .._load import DOWNGRADE_ADVICE, Duplicate
from .._remote.location import file_url_advice, object_store, url_scheme

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (5 ms of every command)
if TYPE_CHECKING:
    import argparse
    from typing import Any, TextIO

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NOT_SET", "EXIT_OK", "EXIT_WARNINGS", "URL_COMMANDS", "is_url",
           "read_object", "run", "storage_options"]

EXIT_OK = 0
EXIT_NOT_SET = 1  # get/delete of a key that is not set
EXIT_WARNINGS = 1  # check: sound, with warnings
EXIT_ERROR = 2  # check: corrupt or unreadable; every other command: an error
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT, as a shell reports a program SIGINT ended)

MISSING = object()  # the default of a lookup: no stored value is this object


class _Fail(Exception):
    """A user error: one line on stderr and the exit status ``code``."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def _json(value: Any, *, indent: int | None = None) -> str:
    """JSON text as Python's json writes it: NaN/Infinity literals, keys in their order."""
    return json.dumps(value, ensure_ascii=False, allow_nan=True, indent=indent)


def _label(name: str) -> str:
    """A category or key as shown: itself, or JSON-quoted when it would not read as one name.

    Quoted too: a name holding the separators of the output (``category/key``, ``key: value``) or
    starting with a quote, so that ``a/b`` as one key never reads as category ``a``, key ``b``.
    """
    if name and name.isprintable() and name.strip() == name and not any(c in name for c in '/:"'):
        return name
    return _json(name)


LONG_VALUE = 300  # characters of a value shown on one line before it is cut


def _cut(text: str, path: str, category: str, key: str) -> str:
    """A value's JSON as shown, cut after ``LONG_VALUE`` characters with how to get all of it."""
    if len(text) <= LONG_VALUE:
        return text
    import shlex  # here: only a long value needs it

    command = shlex.join([PROG, "get", path, category, key])
    return f"{text[:LONG_VALUE]}... (cut: {len(text):,} characters; `{command}` prints it whole)"


def _where(category: str, key: str) -> str:
    return f"{_label(category)}/{_label(key)}"


def _plural(count: int, word: str, words: str | None = None) -> str:
    return f"{count} {word if count == 1 else words or word + 's'}"


def _read_bytes(path: str) -> bytes:
    """The whole file (symlinks followed), or ``OSError``; never blocks on a FIFO."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno_codes.EISDIR, "Is a directory", path)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno_codes.EINVAL, "not a regular file", path)
        chunks = []
        while chunk := os.read(fd, max(st.st_size + 1, 65536)):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _file_in_the_way(path: str) -> str | None:
    """The nearest folder above ``path`` that is a file (``a.json/x.json``), if one is."""
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        if os.path.lexists(parent):
            return None if os.path.isdir(parent) else parent
        above = os.path.dirname(parent)
        if above == parent:
            return None
        parent = above


def _missing(path: str) -> str:
    """Why there is no status file at ``path``: nothing there, or a file where a folder should be."""
    blocking = _file_in_the_way(path)
    if blocking is not None:
        return f"no status file at {path}: {blocking} is a file, not a directory"
    return f"no status file at {path}"


def _unreadable(path: str, exc: OSError) -> str:
    if isinstance(exc, (FileNotFoundError, NotADirectoryError)) and not os.path.isdir(path):
        return _missing(path)
    if isinstance(exc, IsADirectoryError):
        return f"cannot read {path}: it is a directory, not a status file"
    return f"cannot read {path}: {exc.strerror or exc}"


def _read_status(path: str) -> bytes:
    try:
        return _read_bytes(path)
    except OSError as exc:
        raise _Fail(_unreadable(path, exc)) from None


def _duplicate_problem(duplicate: Duplicate) -> str:
    return f"{duplicate}; edit the file so it appears once, with the value to keep"


# The commands that work on an object store's URL as on a local file; the others work with what
# lies beside a local file (its lock, history, copies kept aside).
URL_COMMANDS = ("show", "get", "set", "delete", "check")


def _check_location(args: argparse.Namespace) -> None:
    """Refuse a URL the command cannot open, before anything is read or created."""
    path = getattr(args, "path", "")
    if object_store(path) is not None:
        if args.command not in URL_COMMANDS:
            raise _Fail(
                f"{path}: {args.command} works on local files only (show, get, set, delete and check also "
                "work on s3://, gs:// and az:// URLs). Copy the object down and give its local path."
            )
        return
    if getattr(args, "storage_option", None):
        raise _Fail(f"--storage-option is for s3://, gs:// and az:// URLs; {path} is a local path, which takes none")
    scheme = url_scheme(path)
    if scheme is None:
        return
    if scheme.lower() == "file":
        advice = file_url_advice(path)
    else:
        advice = (f"copy the file down and give its local path, or, for a local directory named "
                  f"'{scheme}:', write ./{path}")
    raise _Fail(f"{path}: {scheme}:// URLs are not supported; the command line works on local files and "
                f"s3://, gs:// and az:// URLs. {advice[0].upper()}{advice[1:]}.")


def is_url(path: str) -> bool:
    return object_store(path) is not None


def storage_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """``--storage-option NAME=VALUE`` as a dict (None when none was given: the SDK's environment).

    A VALUE that is a JSON object, array, ``true``, ``false`` or ``null`` is read as JSON (``anon=true``,
    ``config_kwargs={"connect_timeout": 2}``); any other is the text itself (``project=123`` stays a string).
    """
    given = getattr(args, "storage_option", None)
    if not given:
        return None
    options: dict[str, Any] = {}
    for item in given:
        name, equals, text = item.partition("=")
        if not equals or not name:
            raise _Fail(f"--storage-option {item!r} is not NAME=VALUE (e.g. --storage-option endpoint_url=http://localhost:9000)")
        value: Any = text
        if text.strip()[:1] in ("{", "[") or text in ("true", "false", "null"):
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise _Fail(f"--storage-option {name}: {text!r} is not valid JSON ({exc}); quote it for the shell, as "
                            f"in --storage-option '{name}={{\"key\": 1}}'") from None
        options[name] = value
    return options


def read_object(args: argparse.Namespace) -> bytes:
    """The bytes of the object ``args.path`` names (an object store URL), or a one-line error."""
    from .._remote.backends import open_object_store

    storage = open_object_store(args.path, storage_options(args))
    try:
        data = storage.read()
    finally:
        storage.close()
    if data is None:
        raise _Fail(f"no status file at {args.path}")
    return data


# -- running a command ------------------------------------------------------------------------------


def _error(message: str) -> None:
    print(f"{PROG}: error: {message}", file=sys.stderr)


# What the library advises in Python, and the command line's way of doing it.
_PYTHON_ADVICE = {
    DOWNGRADE_ADVICE: "unless set or delete is given --allow-downgrade",
    "store it as a string (str(value)) instead": "pass --string to store VALUE as text instead",
}


def _cli_words(message: str) -> str:
    """A library message in the command line's style and words.

    The library writes sentences ("Could not save ...: Permission denied. ... then set the value
    again."); the command line's own messages follow ``trainstatus: error:`` as one line that starts
    in lower case and ends without a period, as argparse's do. Where the library names the Python
    way (a keyword, ``str(value)``) the command line's flag is named instead.
    """
    for python, command_line in _PYTHON_ADVICE.items():
        message = message.replace(python, command_line)
    # One line: a line break and the indentation around it become one space; spaces inside a
    # name (a category "a  b") are left as they are.
    message = re.sub(r"\s*\n\s*", " ", message)
    first = message.split(" ", 1)[0]
    if first[:1].isupper() and first[1:].islower() and first.isalpha():  # "Could", not "StatusStore(" or a path
        message = message[0].lower() + message[1:]
    return message[:-1] if message.endswith(".") and not message.endswith("..") else message



def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: TextIO | None = None, line: str | None = None) -> None:
    if issubclass(category, TrainingStatusWarning):
        text = str(message)
        print(f"{PROG}: warning: {_cli_words(text)}", file=sys.stderr)
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


_default_show_warning = warnings.showwarning


def _describe_os_error(exc: OSError) -> str:
    if isinstance(exc, TrainingStatusError):
        return str(exc)
    if exc.strerror and exc.filename:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def _python_sigint() -> None:
    """Put Python's SIGINT handler back in place of the console script's first one.

    ``_trainstatus_cli`` handles Ctrl-C from the start by exiting at once; from here on it raises
    ``KeyboardInterrupt`` instead, which a store holds back until a write in progress is done and
    ``run`` turns into the same one line. SIGALRM gets the handler that raises a Ctrl-C lost in a
    callback again (``_interrupt_again``): installed now, a store holds it back like SIGINT.
    """
    if getattr(_signal.getsignal(_signal.SIGINT), "trainstatus_early", False):
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        _signal.signal(_signal.SIGALRM, _alarm_interrupt)
        sys.unraisablehook = _interrupt_again


_pending = [False]  # a Ctrl-C _interrupt_again has yet to raise (its timer running)


def _interrupt_again(unraisable: Any) -> None:
    """``sys.unraisablehook``: a Ctrl-C that landed in a callback Python cannot raise from (a weakref
    callback of an import's module lock, in a command's lazy imports) is printed as "Exception
    ignored" and lost, and the command went on (CI saw it once in about 5,000 early interrupts). It
    is raised again a millisecond later, past the callback, by SIGALRM's handler, and ends the
    command as any Ctrl-C does; ``run`` says it if the command returned first. (Sending SIGINT again
    from here would raise it in this hook: ``os.kill`` and ``raise_signal`` run the handler before
    they return.)"""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and _signal.getsignal(_signal.SIGALRM) is _alarm_interrupt:
        _pending[0] = True
        _signal.setitimer(_signal.ITIMER_REAL, 0.001)
        return
    sys.__unraisablehook__(unraisable)


def _alarm_interrupt(signum: int, frame: Any) -> None:
    if _pending[0]:
        _pending[0] = False
        raise KeyboardInterrupt


def _disarm() -> bool:
    """Stop ``_interrupt_again``'s timer; True when it still had a Ctrl-C to raise."""
    pending, _pending[0] = _pending[0], False
    if pending:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
    return pending


def run(args: argparse.Namespace) -> int:
    """Run the command ``_cli.main.main`` parsed; return the exit status."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:  # a lone surrogate from a file prints as its \\u escape
            reconfigure(errors="backslashreplace")
    with warnings.catch_warnings():
        warnings.simplefilter("always", TrainingStatusWarning)
        warnings.showwarning = _show_warning
        try:
            _check_location(args)
            command = args.run
            load = getattr(command, "load", None)
            if load is not None:
                command = load()  # its imports (orjson's) under the console script's first handler
            _python_sigint()
            status: int = command(args)
            sys.stdout.flush()
            if _disarm():  # a Ctrl-C lost in a callback, the command done before it was raised again
                print(f"{PROG}: interrupted", file=sys.stderr)
                return EXIT_INTERRUPTED
            return status
        except _Fail as exc:
            _error(exc.message)
            return exc.code
        except TrainingStatusLockTimeout as exc:
            if isinstance(exc, TrainingStatusUnfinishedWrite):
                # Not "could not lock": its change was handed over, and may be in the file.
                _error(_cli_words(str(exc)))
            elif getattr(args, "lock", "flock") == "soft":
                # A soft lock's own message names the lease file and its holder (pid and host).
                _error(_cli_words(str(exc).replace("open the store with a longer lock_timeout=", "pass a longer --lock-timeout")))
            else:
                from .lock import _lock_timeout_message  # only once a lock timed out

                _error(_lock_timeout_message(exc, args.lock_timeout))
            return EXIT_ERROR
        except BrokenPipeError:
            # The reader went away (`trainstatus show ... | head`): stop quietly.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            return EXIT_ERROR
        except (TrainingStatusError, OSError) as exc:
            _error(_cli_words(_describe_os_error(exc) if isinstance(exc, OSError) else str(exc)))
            return EXIT_ERROR
        except KeyboardInterrupt:
            _disarm()
            print(f"{PROG}: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        finally:
            _disarm()  # an error said already: no Ctrl-C raised after run returned
