"""The ``trainstatus`` console script's entry point: Ctrl-C handled before anything is imported.

A top-level module, not ``trainstatus._cli.main``: importing that imports the ``trainstatus``
package first, and a Ctrl-C during any import before a handler is in place is a
``KeyboardInterrupt`` traceback (or, during ``import orjson``, a segfault: orjson's module setup
does not survive an exception raised inside it). So the handler comes first, with nothing but the
C signal module: one line on stderr and exit status 130, at once, with nothing written yet. Once the
command's modules are imported, ``trainstatus._cli.base.run`` puts Python's own handler back and
turns the ``KeyboardInterrupt`` into the same line and status (a store holds it back until a write
in progress is done); ``main`` does the same for one that lands where ``run`` cannot catch it.
"""

import _signal  # type: ignore[import-not-found]  # the C module behind signal: importing signal itself imports enum and re
import os


def _interrupted(signum: int, frame: object) -> None:
    os.write(2, b"trainstatus: interrupted\n")
    os._exit(130)  # nothing to unwind: no command has started


_interrupted.trainstatus_early = True  # type: ignore[attr-defined]  # _cli.base.run replaces it


def install() -> None:
    """Handle SIGINT with ``_interrupted``, unless it is ignored (a command started with ``nohup``)."""
    if _signal.getsignal(_signal.SIGINT) is not _signal.SIG_IGN:
        _signal.signal(_signal.SIGINT, _interrupted)


def main() -> int:
    """The console script: ``trainstatus._cli.main.main`` with Ctrl-C handled from the start."""
    install()
    try:
        from trainstatus._cli.main import main as run

        status = run()
        # Done, its output flushed: a Ctrl-C now would only turn the status into a traceback from
        # the interpreter's exit (or end it by the signal once Python restored the default action).
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    except KeyboardInterrupt:
        # A Ctrl-C that run() does not turn into its line itself: one that lands while it prints
        # an error, as it leaves catch_warnings(), or after it returned. No store is open by then
        # (each closes before the command returns), so nothing is left half done.
        _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
        import sys

        sys.stderr.write("trainstatus: interrupted\n")
        sys.stderr.flush()
        return 130
    return status
