"""The command line's ``prune-missing``: drop the checkpoint entries whose files are gone.

What ``check --files`` finds, fixed: the ``checkpoints`` list of each behavior loses the entries
whose main or auxiliary files are missing or not of their recorded size (``CheckpointList.prune_missing``, one locked, atomic and
durable write per list), so a resume never picks a checkpoint that cannot be loaded. A
``final_checkpoint`` naming a missing or changed file is reported, not removed: it is one value, which
``trainstatus delete`` removes when that is what the user wants.

Relative paths are looked up under the folder each category records (``checkpoint_root``), else
under ``--root``, else the current directory (ML-Agents' layout). A list of which not one entry is
whole there (not one file exists, or files of those names have other sizes: another run's) was
most likely read against the wrong folder: pruning would empty it, so the command refuses, naming
the folder and what to check, and changes nothing unless given ``--force``.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any

from .._checkpoints.checkpoint_list import CheckpointList
from .._checkpoints.files import (CHECKPOINTS, FINAL_CHECKPOINT, all_faulty, all_missing, bases, changed_files,
                                  missing_files)
from .._checkpoints.roots import BadRoot
from .._store import StatusStore
from .target import _bad_root, _faults_shown, _open_store, _root, _where_to_look
from .base import EXIT_OK, _Fail, _json, _missing, _plural, _where
from .names import PROG

__all__ = ["_cmd_prune_missing"]


def _cmd_prune_missing(args: argparse.Namespace) -> int:
    if not os.path.exists(args.path):
        raise _Fail(_missing(args.path))
    root = _root(args.root)
    store = _open_store(args)
    try:
        # One transaction: the lists are judged and pruned on the same reading of the file.
        removed = store.run_transaction(lambda store: _prune(store, args, root))
        document = store.to_dict()
        finals = [(c, f"it lists {p}, which does not exist")
                  for c, k, p in missing_files(document, root, status_path=store.path) if k == FINAL_CHECKPOINT]
        finals += [(c, why) for c, k, _, why in changed_files(document, root, status_path=store.path)
                   if k == FINAL_CHECKPOINT]
    finally:
        store.close()
    for category, entry in removed:
        print(f"removed from {_where(category, CHECKPOINTS)}: step {_json(entry.get('steps'))}, {entry.get('file_path')}")
    for category, problem in finals:
        command = shlex.join([PROG, "delete", args.path, category, FINAL_CHECKPOINT])
        print(f"kept {_where(category, FINAL_CHECKPOINT)}: {problem}; `{command}` removes it")
    if removed:
        print(f"{_plural(len(removed), 'checkpoint entry', 'checkpoint entries')} removed from {args.path}")
    else:
        print(f"nothing removed: every file a checkpoints list of {args.path} names exists with its recorded size")
    return EXIT_OK


def _prune(store: StatusStore, args: argparse.Namespace, root: str | None) -> list[tuple[str, dict[str, Any]]]:
    """The transaction's body: refuse (``_Fail``, nothing written) when a category's folder cannot
    be used or, without ``--force``, when pruning would drop every checkpoint of a list (read
    against the wrong folder, it would be emptied); else prune each list under its folder."""
    document = store.to_dict()
    refused: list[str] = []
    folders: dict[str, str | None] = {}
    force = shlex.join([PROG, "prune-missing", "--force", *([] if root is None else ["--root", root]), args.path])
    for category, found in bases(document, store.path, root).items():
        keys = document[category]
        if isinstance(found, BadRoot):
            if keys.get(CHECKPOINTS):
                refused.append(_bad_root(args.path, category, found))
            continue
        folders[category] = found.folder
        faulty = [] if args.force else all_faulty(keys.get(CHECKPOINTS), found.folder)
        if faulty:  # pruning would drop every checkpoint: most likely the wrong folder, so no guess
            gone = all_missing(keys.get(CHECKPOINTS), found.folder)
            where, why = _where(category, CHECKPOINTS), found.why("given by --root")
            what = (f"not one of the {_plural(len(gone), 'file')} {where} lists exists under {found.shown()} ({why})"
                    if gone else  # files of those names are there, of other sizes: another run's checkpoint-N?
                    f"not one of the {_plural(len(faulty), 'entry', 'entries')} {where} lists is whole under "
                    f"{found.shown()} ({why}; {_faults_shown(faulty)})")
            refused.append(f"{what}, and pruning would empty the list: {_where_to_look(found)}; if the checkpoints "
                           f"are really gone, `{force}` removes their entries")
    if refused:
        raise _Fail(f"refused to prune {args.path}; nothing was changed: {'; '.join(refused)}")
    removed: list[tuple[str, dict[str, Any]]] = []
    for category, folder in folders.items():
        # root=: the folder found above (recorded, --root or None: the current directory).
        removed += [(category, entry) for entry in CheckpointList(store, category, keep=None, root=folder).prune_missing()]
    return removed
