"""The command line's ``prune-missing``: drop the checkpoint entries whose files are gone.

What ``check --files`` finds, fixed: the ``checkpoints`` list of each behavior loses the entries
whose main or auxiliary files are missing or not of their recorded size (``CheckpointList.prune_missing``, one locked, atomic and
durable write per list), so a resume never picks a checkpoint that cannot be loaded. A
``final_checkpoint`` naming a missing or changed file is reported, not removed: it is one value, which
``trainstatus delete`` removes when that is what the user wants.
"""

from __future__ import annotations

import argparse
import os
import shlex

from .._checkpoints.checkpoint_list import CheckpointList
from .._checkpoints.files import FINAL_CHECKPOINT, changed_files, missing_files
from .target import _open_store, _root
from .base import EXIT_OK, _Fail, _json, _missing, _plural, _where
from .names import PROG
from .._load import METADATA

__all__ = ["_cmd_prune_missing"]


def _cmd_prune_missing(args: argparse.Namespace) -> int:
    if not os.path.exists(args.path):
        raise _Fail(_missing(args.path))
    root = _root(args.root)
    store = _open_store(args)
    removed = 0
    try:
        for category in store.to_dict():
            if category == METADATA:
                continue
            for entry in CheckpointList(store, category, keep=None, root=root).prune_missing():
                removed += 1
                print(f"removed from {_where(category, 'checkpoints')}: step {_json(entry.get('steps'))}, "
                      f"{entry.get('file_path')}")
        finals = [(c, f"it lists {p}, which does not exist")
                  for c, k, p in missing_files(store.to_dict(), root) if k == FINAL_CHECKPOINT]
        finals += [(c, why) for c, k, _, why in changed_files(store.to_dict(), root) if k == FINAL_CHECKPOINT]
    finally:
        store.close()
    for category, problem in finals:
        command = shlex.join([PROG, "delete", args.path, category, FINAL_CHECKPOINT])
        print(f"kept {_where(category, FINAL_CHECKPOINT)}: {problem}; `{command}` removes it")
    if removed:
        print(f"{_plural(removed, 'checkpoint entry', 'checkpoint entries')} removed from {args.path}")
    else:
        print(f"nothing removed: every file a checkpoints list of {args.path} names exists with its recorded size")
    return EXIT_OK
