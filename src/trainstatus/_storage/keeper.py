"""``_Keeper``: what a local file's writes keep in its history, and when its oldest versions go.

``history`` says how versions are laid out beside the file and finds, lists and removes them;
this is one writer's bookkeeping on top: the number the version a write replaces gets (known
from its own last write, looked up after another writer's), keeping it just before the rename,
and handing the removal of the versions pushed out to the background closer thread, in batches.
Its own module because that state and its rules are one concern, apart from reading, locking and
replacing the file (``local.LocalFile``, which holds one keeper and calls it from ``replace``). It
imports the write protocol (``atomic``), the history layout (``history``, ``filenames``), the
closer (``closer``) and the errors.
"""

from __future__ import annotations

import errno as errno_codes
import os

from . import atomic as _atomic, history as _history, filenames as _names
from .closer import _closer
from .._errors import TrainingStatusHistoryWarning

__all__ = ["PRUNE_BATCH", "_Keeper"]

# How many versions pushed out of a history are removed at once (see _Keeper.written): up to
# that many more than history= may be there between two prunes.
PRUNE_BATCH = 8


class _Keeper:
    """The history bookkeeping of one ``LocalFile`` (``target``, kept by ``keep`` versions)."""

    def __init__(self, target: str, location: str, keep: int, *, durable: bool) -> None:
        self._target = target
        self._directory, self._name = os.path.split(target)
        self._location = location  # the path as given, for messages
        self._durable = durable
        self.keep = keep  # versions kept; 0: none
        # The number the version now in the file gets in the history, and whether it is kept
        # already; None: find out from the directory (after a read: another writer's version).
        self.slot: tuple[int, bool] | None = None
        self._prune_all = True  # the next prune lists the directory (see written)
        # [done, queued] for the prunes of this store's history (see written): every version
        # numbered up to ``done`` is gone (set by the prune that removed them, on the closer
        # thread: a cell, so that no job holds a reference to this object; None: not known), and
        # ``queued`` is the newest number a prune was queued for.
        self._pruned: list[int] = [0, 0]
        self._prune_known = False
        # A version number known to be kept (the one our last write's version gets from the next
        # writer), for next_slot to look up from after another process wrote; None: list.
        self._known: int | None = None
        self.unkept: TrainingStatusHistoryWarning | None = None  # reported once the write is in

    def keep_previous(self, made: list[str], version: tuple[int, int, int, int] | None) -> int | None:
        """Keep the version about to be replaced (``version``) in the history; its number, or
        None if not kept.

        A failure here never fails the write: the new version matters more than an old one. The
        name given is appended to ``made`` (not when the version was kept already).
        """
        assert version is not None
        kept = self._directory
        try:
            for _ in range(2):
                if self.slot is None:
                    after, self._known = self._known, None
                    self.slot = _history.next_slot(self._directory, self._name, version[:2], after)
                    if after is None:
                        self._prune_all = True  # numbers found by a listing: the next prune lists too
                sequence, done = self.slot
                if done:
                    return sequence
                kept = os.path.join(self._directory, _names.history_name(self._name, sequence))
                try:
                    _atomic.keep_previous(self._target, kept, durable=self._durable)
                except FileExistsError:
                    self.slot = None  # taken by a writer that did not tell us: look again
                    continue
                made.append(kept)
                self.slot = (sequence, True)
                return sequence
            raise FileExistsError(errno_codes.EEXIST, "the next version number was taken twice", kept)
        except FileNotFoundError:
            return None  # removed meanwhile: nothing to keep
        except OSError as exc:
            self.slot = self._known = None
            self.unkept = (TrainingStatusHistoryWarning(
                f"Could not keep the version of {self._location} that this write replaces in its "
                f"history ({kept}): {exc.strerror or exc}. The write goes on; that version is "
                "not kept. Free some space or check the directory's permissions, or open the "
                "store with history=0 to stop keeping versions.",
                path=self._location,
            ))
        return None

    def written(self, kept: int | None) -> None:
        """After a write replaced the file: the new version's slot; old versions pruned later.

        A version that could not be kept is reported by the store (``take_warning``) once the new
        file is in place and in its memory: a warning turned into an error (``-W error``) then
        cannot undo the write or leave memory behind the file.
        """
        if not self.keep:
            return
        if kept is None:
            self.slot = None
            return
        self.slot = (kept + 1, False)
        self._known = kept  # kept a moment ago: a reload's next_slot looks up from here
        directory, name, keep = self._directory, self._name, self.keep
        last = kept - keep  # the newest number to go
        if last <= 0:
            return
        # Each write pushes one version out; removing it at once meant waking the closer thread
        # at every write (issue 23). The versions pushed out are removed PRUNE_BATCH at a time, by
        # number, from the first one not removed yet: no listing of the directory, and no unlink
        # of a number that cannot be there. The directory is listed instead when the numbers came
        # from a listing (the first write of a store, or one after another writer's: versions
        # another history= left may be there), when the numbers are not known, and every 64th
        # write. Versions another writer added in between have numbers in that range too.
        cell = self._pruned
        if self._prune_all or kept % 64 == 0 or not self._prune_known or last - max(cell) > 2 * PRUNE_BATCH + keep:
            self._prune_all, self._prune_known = False, True
            cell[1] = last

            def listing() -> None:
                oldest = _history.prune(directory, name, keep)
                cell[0] = last if oldest is None else max(last, oldest - 1)

            _closer.later((directory, name), listing)
            return

        def batch() -> None:
            # The range is taken when the job runs (jobs run one after the other): one queued
            # before and replaced by this one, or one that ran meanwhile, is covered.
            done = cell[0]
            if last > done and not _history.prune_range(directory, name, done + 1, last):
                _history.prune(directory, name, keep)  # the newest to go was not there: list
            cell[0] = max(cell[0], last)

        if last - max(cell) >= PRUNE_BATCH:
            cell[1] = last
            _closer.later((directory, name), batch)
        else:
            _closer.defer((directory, name), batch)  # replaced by the next write's, or run by wait()

    def close(self) -> None:
        _closer.flush((self._directory, self._name))  # a batch of versions still to go
