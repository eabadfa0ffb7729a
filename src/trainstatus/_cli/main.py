"""The command line's entry point: parse the arguments, then run the command.

``trainstatus show PATH`` (and ``show --json PATH``), the command run most, is read here without
argparse: building the parser with every command's help and importing argparse (with gettext,
locale) was about half of what ``show`` costs over starting Python (issue 23). Any other command
line, ``show`` with any other option included, goes to argparse (``_cli.parser``), so its help,
usage and error messages are argparse's, unchanged; ``_plain_show`` accepts only command lines
argparse reads the same way (a test compares the two).
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

from .names import CURRENT, DEFAULT_LOCK_TIMEOUT, LOCK_MODES, PROG, Command

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (5 ms of every command)
if TYPE_CHECKING:
    from argparse import Namespace
    from collections.abc import Sequence

__all__ = ["CURRENT", "DEFAULT_LOCK_TIMEOUT", "LOCK_MODES", "PROG", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status (the console script exits with it)."""
    args = _plain_show(sys.argv[1:] if argv is None else argv)
    if args is None:
        from .parser import _parser

        args = _parser().parse_args(argv)
    from .base import run  # what every command shares; each loads its own module

    return run(args)


def _plain_show(argv: Sequence[str]) -> Namespace | None:
    """What argparse makes of ``show PATH``, ``show --json PATH`` or ``show PATH --json``; None for
    any other command line (argparse then reads it, and answers it if it is wrong).

    A PATH that starts with "-" is left to argparse, which reads some such arguments as options and
    some (``-``, ``-1``, ``-a b``) as a PATH.
    """
    if len(argv) not in (2, 3) or argv[0] != "show":
        return None
    rest = list(argv[1:])
    json = "--json" in rest
    if json:
        rest.remove("--json")
    if len(rest) != 1 or not rest[0] or rest[0].startswith("-"):
        return None
    # The attributes argparse sets for show, defaults included (a SimpleNamespace reads as one).
    args: Namespace = SimpleNamespace(  # type: ignore[assignment]
        command="show", storage_option=None, path=rest[0], json=json, run=Command("read", "_cmd_show"))
    return args
