"""Who holds a status file's lock, named for messages: a lock timeout's, and ``trainstatus check``'s.

For a ``flock``, the holders are read from ``/proc/locks`` (Linux) and named by their pid and
program; for the soft lock, by the pid and machine its lease marker names. Everything here is
read only once a message needs it (a lock timed out, ``check`` looks), never on a write's path,
and nothing creates, takes or removes a lock file. The library's errors (``path_lock``) and the
command line (``_cli.lock``) both name holders this way, so it lives here, below both.

The library's errors name a holder's program only (``python train.py ...``): they end up in logs
and trackers, and the holder may be another user's process, whose arguments (a ``--hf_token=``)
are not this one's to copy there. The command line tool shows the whole command line
(``full=True``): it answers a person at a shell, who can read ``/proc`` anyway.
"""

from __future__ import annotations

import os

__all__ = ["cmdline", "describe", "flock_holders", "holder_of_flock", "holder_of_lease", "marker_fields",
           "program", "program_of", "this_host"]

_CMDLINE_MAX = 1000
_MARKER_MAX = 4096  # filelock's lease marker is a few lines; more is not a marker


def _words(pid: int) -> list[str] | None:
    """The words of process ``pid``'s command line (None: gone, not readable, or a kernel thread)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    words = [w.decode("utf-8", "replace") for w in raw.split(b"\0") if w]
    return words or None  # none: a kernel thread, or a process on its way out


def _printable(text: str) -> str:
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= _CMDLINE_MAX else text[: _CMDLINE_MAX - 3] + "..."


def cmdline(pid: int) -> str | None:
    """The command line of process ``pid`` as one printable line (None: gone, or not readable)."""
    words = _words(pid)
    return None if words is None else _printable(" ".join(words))


def program(pid: int) -> str | None:
    """Process ``pid``'s program, as ``program_of`` names it (None: gone, or not readable)."""
    words = _words(pid)
    return None if words is None else _printable(program_of(words))


def program_of(words: list[str]) -> str:
    """A command line named by its program alone: the executable's base name and, for Python, the
    script's base name (or ``-m module``, or ``-c`` without its code); never a further argument,
    which may hold a secret, but "..." when there were more. ``python train.py ...``."""
    if len(words) == 1 and len(words[0].split()) > 1:
        words = words[0].split()  # a title set over the arguments (setproctitle): one string
    shown = [os.path.basename(words[0]) or words[0]]
    if shown[0].startswith(("python", "pypy")):
        shown += _python_program(words[1:])
    more = len(words) > len(shown) or shown[-1] == "-c"  # options skipped, arguments, -c's code
    return " ".join(shown) + (" ..." if more else "")


def _python_program(arguments: list[str]) -> list[str]:
    """What names the program in a Python interpreter's arguments: the script, ``-m module`` or
    ``-c`` (the interpreter's own options skipped, as ``python -u -X dev train.py`` does)."""
    i = 0
    while i < len(arguments):
        word = arguments[i]
        if word == "--":
            return [os.path.basename(arguments[i + 1]) or arguments[i + 1]] if i + 1 < len(arguments) else []
        if word == "-" or not word.startswith("-"):
            return [os.path.basename(word) or word]  # "-": the script is read from stdin
        if word.startswith("--"):
            i += 2 if word == "--check-hash-based-pycs" else 1  # the one long option with a value
            continue
        for j, letter in enumerate(word[1:], 1):  # a cluster of options, as in -uc or -Wdefault
            if letter == "c":
                return ["-c"]
            if letter == "m":
                module = word[j + 1:] or (arguments[i + 1] if i + 1 < len(arguments) else "")
                return ["-m", module] if module else []
            if letter in "WX":  # their value: the rest of the word, or the next one
                i += 0 if word[j + 1:] else 1
                break
        i += 1
    return []


def flock_holders(st: os.stat_result) -> list[int]:
    """Pids holding an exclusive ``flock`` on the file of ``st``, from /proc/locks (Linux; [] elsewhere)."""
    want = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    pids: list[int] = []
    for line in text.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; waiters have "->" after the number,
        # and the byte-range locks of the waiting list (OFDLCK) are not the lock itself.
        parts = line.split()
        if len(parts) < 6 or parts[1] != "FLOCK" or parts[3] != "WRITE":
            continue
        try:
            major, minor, inode = parts[5].split(":")
            found = (int(major, 16), int(minor, 16), int(inode))
            pid = int(parts[4])
        except ValueError:
            continue
        if found == want and pid > 0 and pid not in pids:  # 0: in another PID namespace
            pids.append(pid)
    return pids


def describe(pids: list[int], noun: str = "process", *, full: bool = False) -> str:
    """``"process 4242 (python train.py ...)"`` for each pid (``noun`` first), or "another process";
    with ``full``, each one's whole command line (``python train.py --resume``)."""
    if not pids:
        return "another process"
    described = []
    for pid in pids:
        line = cmdline(pid) if full else program(pid)
        described.append(f"{noun} {pid}" if line is None else f"{noun} {pid} ({line})")
    return ", ".join(described)


def holder_of_flock(lock_file: str, noun: str = "process", *, full: bool = False) -> str:
    """Who holds the ``flock`` on ``lock_file`` (see ``describe``); "another process" if unknown."""
    try:
        st = os.stat(lock_file)
    except OSError:
        return "another process"
    return describe(flock_holders(st), noun, full=full)


def marker_fields(raw: bytes) -> dict[str, str]:
    """The ``name=value`` lines of a soft lock's marker (filelock's: ``filelock/2``, then pid,
    host, mode, token, duration); {} for anything without that first line. A name given twice
    keeps its last value, as filelock reads it; a line without ``=`` is passed over."""
    lines = raw[:_MARKER_MAX].decode("utf-8", "replace").splitlines()
    if lines[:1] != ["filelock/2"]:
        return {}
    fields: dict[str, str] = {}
    for line in lines[1:]:
        name, equals, value = line.partition("=")
        if equals:
            fields[name] = value
    return fields


def this_host() -> str | None:
    """This machine as filelock names it in a marker (hostname and PID namespace), if it says."""
    try:
        from filelock._identity import host_name
    except ImportError:  # pragma: no cover - a filelock without it: no holder is taken for local
        return None
    name: str = host_name()
    return name


def holder_of_lease(lease_file: str) -> str:
    """Who a soft lock's marker names: ``"process 12 on node3"``, with its program when that
    machine is this one; "another process" when it names nobody (or cannot be read)."""
    try:
        with open(lease_file, "rb") as f:
            fields = marker_fields(f.read(_MARKER_MAX))
    except OSError:
        return "another process"
    pid, host = fields.get("pid", ""), fields.get("host", "")
    if not (pid.isascii() and pid.isdigit()):
        return "another process"
    if not host:
        return f"process {int(pid)}"
    shown = "".join(c if c.isprintable() and not c.isspace() else "?" for c in host)
    line = program(int(pid)) if host == this_host() else None
    return f"process {int(pid)} on {shown}" + ("" if line is None else f" ({line})")
