"""The names every part of the command line shares, below all of them (so none imports another back).

``_cli.main`` (the entry), ``_cli.parser`` (the parser) and the command modules they load
(``_cli.base``, ``_cli``, ``_cli.read``, ``_cli.history``, ``_cli.checkpoints``) import these from
here; nothing is imported by this module, so ``trainstatus --help`` pays for nothing more.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from argparse import Namespace
    from collections.abc import Callable

PROG = "trainstatus"
DEFAULT_LOCK_TIMEOUT = 30.0
CURRENT = "current"  # diff/restore: the file itself, as opposed to a kept version
# _lock.path_lock.LOCK_MODES, spelled out so the parser does not import the locking module (a test checks
# that the two agree).
LOCK_MODES = ("flock", "soft")


class Command:
    """A command's function, named rather than imported: the module is loaded when it runs."""

    def __init__(self, module: str, function: str) -> None:
        self.module = module
        self.function = function

    def load(self) -> Callable[[Namespace], int]:
        """The function, its module imported (orjson with it, for all but show and get)."""
        import importlib

        if self.module != "read":
            # Here, under the console script's first handler: a Ctrl-C during orjson's setup would
            # end the process with a segfault; the codec would otherwise import it at first use.
            import orjson  # noqa: F401
        run: Callable[[Namespace], int] = getattr(importlib.import_module(f".{self.module}", __package__),
                                                  self.function)
        return run

    def __call__(self, args: Namespace) -> int:
        return self.load()(args)
