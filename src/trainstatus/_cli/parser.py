"""The command line's argparse parser: every command, its options and its help.

Built by ``_cli.main`` for every command line but a plain ``show PATH`` (which it reads itself, so
that printing a file does not pay for argparse). The commands themselves live in ``_cli.read``,
``write``, ``check``, ``corrupt`` (and ``_cli.history``, ``_cli.checkpoints``), imported once the
arguments are parsed: a mistyped option or ``--help`` answers without loading orjson, filelock or
the store (issue 13).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (5 ms of every command)
if TYPE_CHECKING:  # typing and collections.abc are not needed to answer --help
    from collections.abc import Callable, Sequence
    from typing import Any

from .names import CURRENT, DEFAULT_LOCK_TIMEOUT, LOCK_MODES, PROG, Command as _Command
from .._version import STATUS_FORMAT_VERSION, __version__

__all__ = ["_parser"]


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``, without importing shutil (see ``_Formatter``)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        try:
            columns = os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]  # None: caught, as shutil does
        except (AttributeError, ValueError, OSError):
            columns = 0
        columns = columns or 80
    return columns


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's formatter, told the terminal's width. argparse makes one for every
    ``add_argument`` (to check its metavar), and one left to find the width itself imports shutil,
    which imports bz2, lzma, zlib and fnmatch: several ms of every command, help or none."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _terminal_columns() - 2 if width is None else width)


_FORMATTER = _Formatter
_TOP_EPILOG = """\
commands that change the file (set, delete, restore, prune-missing, corrupt restore) take the lock
beside it and write atomically and durably, like a trainer's own writes; the others only read (history --prune
removes earlier versions kept beside the file, never the file).

exit status: 0 success (check: sound); 1 get/delete: the key is not set, check: warnings;
2 an error (missing, unreadable or damaged file, bad value, lock held too long, bad usage),
check: corrupt, unreadable or a name given more than once; 130 interrupted (Ctrl-C).

PATH is a local file, or for show, get, set, delete and check an object in an object store:
s3://bucket/key, gs://bucket/object, az://container/blob (abfs://container@account.dfs.core.windows.net/blob),
with --storage-option NAME=VALUE for its client (named as in s3fs, gcsfs, adlfs; without any, the SDK's
own environment applies).

example:
  trainstatus show results/run1/run_logs/training_status.json
"""


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, not {text!r}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, not {text!r}")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse's parser, which also says how to pass a VALUE that starts with "-".

    argparse takes such a VALUE (``-x``, ``-Infinity``, ``-1e5``; only plain negative numbers such as
    ``-3`` pass) for an option and then reports VALUE as missing, which sends the user looking in the
    wrong place.
    """

    _given: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> Any:  # argparse's own is NoReturn; it exits here too
        if "required: " in message and "VALUE" in message.split("required: ", 1)[1]:
            dashed = next((arg for arg in self._given if arg.startswith("-") and arg != "--"
                           and arg.split("=", 1)[0] not in self._option_string_actions), None)
            if dashed is not None:
                rest = [arg for arg in self._given if arg is not dashed]
                example = shlex.join([*self.prog.split(), *rest, "--", dashed])
                message = f"VALUE {dashed!r} starts with '-': pass it after --, as in: {example}"
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Look at, fix and check a trainstatus / ML-Agents training_status.json.",
        epilog=_TOP_EPILOG,
        formatter_class=_FORMATTER,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)

    locking = argparse.ArgumentParser(add_help=False, formatter_class=_FORMATTER)
    locking.add_argument(
        "--lock-timeout", type=_seconds, default=DEFAULT_LOCK_TIMEOUT, metavar="SECONDS",
        help=f"wait at most this long for the lock (default {DEFAULT_LOCK_TIMEOUT:g}) when a "
             "trainer is writing or in a transaction",
    )
    locking.add_argument(
        "--lock", choices=LOCK_MODES, default="flock",
        help="how writers exclude each other: flock (the default), or soft for a file on NFS or "
             "another shared filesystem that trainers on several machines open with lock=\"soft\"",
    )

    remote = argparse.ArgumentParser(add_help=False, formatter_class=_FORMATTER)
    remote.add_argument(
        "--storage-option", action="append", metavar="NAME=VALUE",
        help="for an s3://, gs:// or az:// PATH: an option of its client, named as in s3fs, gcsfs or adlfs "
             "(endpoint_url=http://localhost:9000, token=anon, connection_string=...); repeat for several. "
             "A VALUE that is a JSON object or array, true, false or null is read as JSON",
    )

    writing = argparse.ArgumentParser(add_help=False, formatter_class=_FORMATTER)
    writing.add_argument(
        "--allow-downgrade", action="store_true",
        help=f"rewrite a file of a newer format version in format {STATUS_FORMAT_VERSION}, dropping "
             "what this trainstatus does not understand (without it such a file is never written)",
    )

    def command(name: str, run: Callable[[argparse.Namespace], int], help: str, epilog: str,
                parents: Sequence[argparse.ArgumentParser] = (), on: Any = commands) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = on.add_parser(
            name, help=help, description=help[0].upper() + help[1:] + ".", epilog=epilog,
            formatter_class=_FORMATTER, parents=list(parents),
        )
        sub.set_defaults(run=run)
        return sub

    show = command("show", _Command("read", "_cmd_show"), "print the file grouped by category, metadata first", """\
checkpoint lists (lists of objects with "steps" and "file_path") are summarised: how many,
the newest step and its file. A value longer than 300 characters is cut, with the `get` command
that prints it whole. A name holding /, : or " is shown JSON-quoted ("a/b" is one name). Reads
only; warns about the format version like a store would.

examples:
  trainstatus show results/run1/run_logs/training_status.json
  trainstatus show --json results/run1/run_logs/training_status.json | jq .Walker.final_checkpoint
  trainstatus show gs://my-bucket/run1/run_logs/training_status.json
""", parents=[remote])
    show.add_argument("path", metavar="PATH", help="the status file (or an s3://, gs://, az:// URL)")
    show.add_argument("--json", action="store_true",
                      help="the whole document as JSON (NaN/Infinity as Python's json writes them; "
                           "categories in file order, metadata last)")

    get = command("get", _Command("read", "_cmd_get"), "print one value as JSON", """\
exit status 1 (with a message on stderr) when the key is not set. The metadata block reads as
category "metadata".

examples:
  trainstatus get results/run1/run_logs/training_status.json wall_height lesson_num
  trainstatus get results/run1/run_logs/training_status.json metadata stats_format_version
  trainstatus get s3://my-bucket/run1/run_logs/training_status.json wall_height lesson_num \\
      --storage-option endpoint_url=http://localhost:9000
""", parents=[remote])
    get.add_argument("path", metavar="PATH", help="the status file (or an s3://, gs://, az:// URL)")
    get.add_argument("category", metavar="CATEGORY", help="a behavior or parameter name")
    get.add_argument("key", metavar="KEY")
    get.add_argument("--compact", action="store_true", help="on one line, without indentation")

    set_ = command("set", _Command("write", "_cmd_set"), "store one value (locked, atomic, durable)", """\
how VALUE is read:
  - as JSON: 3, -2.5, true, false, null, "text", [1, 2], {"steps": 10}, and NaN, Infinity,
    -Infinity as Python's json and ML-Agents write them. An object may not give a key twice.
  - a VALUE that starts with [, {, ", a digit or - (after spaces) must be valid JSON: if it is
    not, nothing is written and the error says where it fails. A number too large for a float
    (1e400) or too small (1e-400) is an error too: write Infinity or 0 if that is what you mean.
  - Python's spellings (True, None, nan, inf and other cases of them) and numbers JSON does not
    write that way (+5, .5, 1_000, 007) are errors naming the JSON spelling.
  - any other text (hello, Walker-500000.onnx, an empty string) is stored as that string.
  - --string stores VALUE as the string it is, whatever it looks like.
  - VALUE - reads the value from standard input (read as above; the newline that ends its last
    line is dropped): for values longer than a command line takes (about 128 KB). With --string,
    - is the text "-" itself: --string - stores "-".
A VALUE that starts with "-" (other than a plain negative number such as -3) goes after --.
The file is created when absent (its directory must exist). Prints the old and new value.
A file of a newer format version is not rewritten unless --allow-downgrade is given.

examples:
  trainstatus set results/run1/run_logs/training_status.json wall_height lesson_num 2
  trainstatus set results/run1/run_logs/training_status.json Walker note --string True
  trainstatus set results/run1/run_logs/training_status.json SoccerTwos elo -- -Infinity
  jq -c .Walker.checkpoints old.json | trainstatus set results/run1/run_logs/training_status.json Walker checkpoints -
""", parents=[locking, writing, remote])
    set_.add_argument("path", metavar="PATH", help="the status file (or an s3://, gs://, az:// URL)")
    set_.add_argument("category", metavar="CATEGORY", help="a behavior or parameter name ('metadata' is reserved)")
    set_.add_argument("key", metavar="KEY")
    set_.add_argument("value", metavar="VALUE", help="JSON, or plain text (see below); - reads it from standard input (not with --string)")
    set_.add_argument("--string", action="store_true", help="store VALUE as a string, never as JSON")

    delete = command("delete", _Command("write", "_cmd_delete"), "remove one key (locked, atomic, durable)", """\
a category whose last key goes is removed too. Exit status 1 (and nothing written) when the key
is not set. A file of a newer format version is not rewritten unless --allow-downgrade is given.

example:
  trainstatus delete results/run1/run_logs/training_status.json Walker final_checkpoint
""", parents=[locking, writing, remote])
    delete.add_argument("path", metavar="PATH", help="the status file (or an s3://, gs://, az:// URL)")
    delete.add_argument("category", metavar="CATEGORY", help="a behavior or parameter name")
    delete.add_argument("key", metavar="KEY")

    check = command("check", _Command("check", "_cmd_check"), "validate the file without changing anything", """\
one line per finding: whether the file parses as a status document, any name given twice in one
object (a key or a category: only the last is read, and a write keeps only it), its format
version and metadata, whether the lock (or a soft lock's lease: holder, host, age) is held right
now, temp files or leases left by a killed writer, copies kept aside. Nothing is moved, created or
locked for longer than an instant.

--files also checks that every checkpoint file listed (checkpoints lists and final_checkpoint
entries, main and auxiliary files, the files of a checkpoint folder) exists, with the size recorded
in the entry where it has one. Relative paths are looked up under the folder the behavior records
(checkpoint_root, which trainstatus's lists and integrations write), else under --root DIR, else
the current directory (ML-Agents' layout: where mlagents-learn ran); one line per behavior says which.

exit status: 0 sound, 1 warnings, 2 corrupt, unreadable, or a name given more than once.

examples:
  trainstatus check results/run1/run_logs/training_status.json
  trainstatus check --files results/run1/run_logs/training_status.json
  trainstatus check az://my-container/run1/run_logs/training_status.json --storage-option account_name=myaccount
""", parents=[remote])
    check.add_argument("path", metavar="PATH", help="the status file (or an s3://, gs://, az:// URL)")
    check.add_argument("--files", action="store_true",
                       help="also check that every file a checkpoints list or final_checkpoint names "
                            "exists with its recorded size (a warning for each missing or changed one)")
    check.add_argument("--root", metavar="DIR",
                       help="with --files: the directory relative file paths are under, for the behaviors "
                            "that record none (default: the current directory, as mlagents-learn resolves them)")

    prune = command("prune-missing", _Command("checkpoints", "_cmd_prune_missing"),
                    "drop the checkpoint entries whose files are gone (locked, atomic, durable)", """\
each behavior's checkpoints list loses the entries whose main or auxiliary file is missing or not
of its recorded size (what `check --files` warns about), so that a resume never picks a checkpoint
that cannot be loaded; the files of the entries kept are not touched. A final_checkpoint naming a
missing or changed file is reported,
not removed (`trainstatus delete PATH CATEGORY final_checkpoint` removes it). Relative paths are
looked up as `check --files` does. When not one file of a list exists there, which is what a wrong
folder looks like, it refuses and changes nothing, naming the folder; --force prunes anyway.

example:
  trainstatus prune-missing --root ~/ml-agents results/run1/run_logs/training_status.json
""", parents=[locking, writing])
    prune.add_argument("path", metavar="PATH", help="the status file")
    prune.add_argument("--root", metavar="DIR",
                       help="the directory relative file paths are under, for the behaviors that record none "
                            "(default: the current directory, as mlagents-learn resolves them)")
    prune.add_argument("--force", action="store_true",
                       help="prune a list even when not one of its files exists (which empties it)")

    corrupt = command("corrupt", _Command("corrupt", "_no_subcommand"), "list or restore copies kept aside", """\
a store that finds its file damaged keeps it, byte for byte, as <file>.corrupt-<UTC time> and
starts from the newest intact version in its history (empty without one); corrupt restore also
keeps the file it replaces under such a name.

examples:
  trainstatus corrupt list results/run1/run_logs/training_status.json
  trainstatus corrupt restore results/run1/run_logs/training_status.json \\
      results/run1/run_logs/training_status.json.corrupt-20250101T120000.000000Z
""")
    corrupt_commands = corrupt.add_subparsers(dest="corrupt_command", metavar="COMMAND", required=True)
    listing = command("list", _Command("corrupt", "_cmd_corrupt_list"), "list the copies kept aside, newest first", """\
each with its size and whether it parses as a status document (only those can be restored).

example:
  trainstatus corrupt list results/run1/run_logs/training_status.json
""", on=corrupt_commands)
    listing.add_argument("path", metavar="PATH", help="the status file")
    restore = command("restore", _Command("corrupt", "_cmd_corrupt_restore"), "put a copy kept aside back in place", """\
only a copy that parses as a status document is restored, byte for byte, under the lock with the
atomic write protocol. The current file, if any, is first kept aside under a new
<file>.corrupt-<UTC time> name, so nothing is lost and the restore can be undone the same way.
The copy itself stays where it is.

example:
  trainstatus corrupt restore results/run1/run_logs/training_status.json \\
      training_status.json.corrupt-20250101T120000.000000Z
""", parents=[locking], on=corrupt_commands)
    restore.add_argument("path", metavar="PATH", help="the status file")
    restore.add_argument("copy", metavar="COPY",
                         help="the copy, as `corrupt list` prints it or by its name alone")

    _history_commands(command, locking)
    return parser


def _history_commands(command: Callable[..., argparse.ArgumentParser], locking: argparse.ArgumentParser) -> None:
    """Add ``history``, ``diff`` and ``restore`` (run by ``_cli.history``)."""
    history = command("history", _Command("history", "_cmd_history"), "list the earlier versions kept beside the file", """\
a store keeps the version each write replaces as .<file>.history-<n> beside the file (the newest
20 by default; StatusStore(..., history=N), history=0 for none). One line per version, newest
first: its number, when it was written, its size and which keys changed from the version before.
Reads only, unless --prune is given.

On disk the history costs up to as many times the file's size as versions are kept (about 21
times the file with the default 20, the file included). --prune --keep N removes all but the
newest N versions now (--keep 0: all of them); trainers keep their own history= count from then on.

examples:
  trainstatus history results/run1/run_logs/training_status.json
  trainstatus history results/run1/run_logs/training_status.json --prune --keep 2
""")
    history.add_argument("path", metavar="PATH", help="the status file")
    history.add_argument("--prune", action="store_true",
                         help="remove the oldest versions, keeping the newest --keep N (to free space)")
    history.add_argument("--keep", type=_count, metavar="N",
                         help="with --prune: how many of the newest versions to keep (0: none)")

    diff = command("diff", _Command("history", "_cmd_diff"), "compare two versions key by key", """\
OLD and NEW are version numbers from `trainstatus history`, or "current" (the file itself).
Without them: the newest kept version against the file. Lines: + key added, - key removed,
~ key changed (old -> new). Exit status 0 when they are the same, 1 when they differ, 2 on error.

examples:
  trainstatus diff results/run1/run_logs/training_status.json
  trainstatus diff results/run1/run_logs/training_status.json 12 14
  trainstatus diff --json results/run1/run_logs/training_status.json 12
""")
    diff.add_argument("path", metavar="PATH", help="the status file")
    diff.add_argument("old", metavar="OLD", nargs="?", help="a version number (default: the newest kept)")
    diff.add_argument("new", metavar="NEW", nargs="?", help=f"a version number or {CURRENT} (default)")
    diff.add_argument("--json", action="store_true",
                      help="a JSON list of {change, category, key, old, new} for scripts")

    restore = command("restore", _Command("history", "_cmd_restore"), "put an earlier version back (locked, atomic, durable)", """\
the version's bytes replace the file under the lock with the atomic write protocol, and the
version replaced is kept in the history like any other write's, so a restore can be undone by
restoring that one (the command prints how). A running trainer sees the restored file at its next
write, as another writer's change: its own later changes go on top, key by key.

example:
  trainstatus restore results/run1/run_logs/training_status.json 12
""", parents=[locking])
    restore.add_argument("path", metavar="PATH", help="the status file")
    restore.add_argument("version", metavar="VERSION", help="a version number from `trainstatus history`")
