"""Checkpoint lists that never name a file that is gone: ``CheckpointList`` and what it stands on.

- ``files``: which files an entry of a status document lists, their recorded sizes, and which are
  missing. Below the store: opening a store uses it to name missing checkpoints in a warning.
- ``roots``: where a category's relative checkpoint paths are under (its ``checkpoint_root``, or
  ML-Agents' layout: the current directory), recorded and read the same way by every reader.
- ``checkpoint_list``: ``CheckpointList``, the public class, over a ``StatusStore``.
- ``entries``: a new entry checked, and its files read, before it is recorded.
- ``folders``: syncing an entry's files and the folders above them before the record; removing
  the files of dropped entries after it.
- ``usable``: whether a recorded entry can be resumed from, and the warning naming those passed over.

May import: the store and what is below it; never the edges (``_cli``, ``_testing``,
``_mlagents``, ``integrations``), which import this package.
"""
