"""The names every part of the command line shares, below all of them (so none imports another back).

``_cli_main`` (the parser) and the command modules it loads (``_cli_base``, ``_cli``,
``_cli_read``, ``_cli_history``, ``_cli_checkpoints``) import these from here; nothing is
imported by this module, so ``trainstatus --help`` pays for nothing more.
"""

from __future__ import annotations

PROG = "trainstatus"
DEFAULT_LOCK_TIMEOUT = 30.0
CURRENT = "current"  # diff/restore: the file itself, as opposed to a kept version
# _locking.LOCK_MODES, spelled out so the parser does not import the locking module (a test checks
# that the two agree).
LOCK_MODES = ("flock", "soft")
