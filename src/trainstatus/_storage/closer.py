"""The background closer thread: closes replaced file versions' descriptors and prunes histories.

A write must not wait for what frees an inode (closing the last descriptor of a replaced version,
removing a history's oldest versions): ``_closer``, one per process, does that on a thread of its
own, started on first use and stopped at exit (see ``_Closer`` for why, and what is worth waking
it for). Its own module because that thread, its queues and its exit and fork hooks are one
concern, shared by the pin (``pin``) and the history's pruning (``keeper``). It imports the lock
package's descriptor helpers (``_lock.descriptor``) and the library's logger.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Hashable

from .._lock import descriptor as _descriptor
from .. import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log

__all__ = ["_closer"]

logger = logging.getLogger("trainstatus")


class _Closer:
    """Closes the descriptors of replaced file versions, and prunes histories, on a background thread.

    Closing the last descriptor of a replaced file frees its inode, which on ext4 costs 150 µs or
    more: about a seventh of a small durable write, half of a ``durable=False`` one (the bare
    protocol pays the same inside its rename). Those descriptors protect nothing once the new
    version is pinned, so no caller needs to wait for that. Removing a history's oldest versions
    frees inodes the same way, and no write needs to wait for it either.

    Waking the thread costs too (a futex and a switch each way, the GIL passed back and forth: a
    quarter of a small ``durable=False`` set), so a write hands over only what frees an inode:
    a replaced version the history keeps is closed by the writer itself (its inode lives on under
    the history's name, so closing is cheap), and a history is pruned in batches (``defer``).
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._queued: list[_descriptor.Descriptor] = []
        self._jobs: dict[Hashable, Callable[[], None]] = {}  # one per key: a later one replaces it
        self._deferred: dict[Hashable, Callable[[], None]] = {}  # run by ``flush`` or ``wait``
        self._busy = False  # the thread took work and has not finished it; guarded by _cond
        self._thread: threading.Thread | None = None

    def close(self, fds: list[_descriptor.Descriptor]) -> None:
        # pyfakefs answers a call made from this module's thread with the real os (it takes the
        # thread's frames for those of a module it must not patch): a fake descriptor closed there
        # would close whatever real file has its number (a test runner's capture file, say).
        # Those are closed here, now, by the os that opened them.
        fake = [d for d in fds if _opened_by_pyfakefs(d[1])]
        if fake:
            _descriptor.close_all(fake)
            fds = [d for d in fds if not _opened_by_pyfakefs(d[1])]
            if not fds:
                return
        with self._cond:
            self._queued.extend(fds)
            self._start()

    def later(self, key: Hashable, job: Callable[[], None]) -> None:
        """Run ``job`` on the thread soon; a job queued under the same ``key`` and not started yet
        is replaced (pruning twice in a row does nothing more than once), a deferred one too."""
        with self._cond:
            self._deferred.pop(key, None)
            self._jobs[key] = job
            self._start()

    def defer(self, key: Hashable, job: Callable[[], None]) -> None:
        """Keep ``job`` for the thread without waking it: it runs when a ``later`` or ``flush`` of
        the same key, or a ``wait``, comes (a later ``defer`` of the key replaces it)."""
        with self._cond:
            self._deferred[key] = job

    def flush(self, key: Hashable) -> None:
        """Run the job deferred under ``key``, if any, soon (a store closing)."""
        with self._cond:
            job = self._deferred.pop(key, None)
            if job is not None:
                self._jobs[key] = job
                self._start()

    def _start(self) -> None:  # with _cond held
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainstatus-closer", daemon=True)
            self._thread.start()
        self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queued and not self._jobs:
                    self._cond.wait()
                batch, self._queued = self._queued, []
                jobs, self._jobs = list(self._jobs.values()), {}
                self._busy = True
            try:
                _descriptor.close_all(batch)
                for job in jobs:
                    try:
                        job()
                    except Exception as exc:  # noqa: BLE001 - the thread must live on for the fds
                        # A history not pruned now is pruned after the next write.
                        logger.debug("background job failed: %s", exc)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> None:
        """Return once everything queued so far is done (tests counting descriptors or files, and
        the exit of the process), or after ``timeout`` s."""
        with self._cond:
            if self._deferred:
                self._jobs.update(self._deferred)
                self._deferred.clear()
                self._start()
            self._cond.wait_for(lambda: not (self._queued or self._jobs or self._busy), timeout)

    def after_fork_in_child(self) -> None:
        # Only the forking thread survives a fork: the closer is gone, and what it had taken is
        # lost (a few descriptors, copies of the parent's; a prune the next write queues again).
        # What was still queued is closed here.
        queued = self._queued
        self.__init__()  # type: ignore[misc]  # a fresh, unlocked state, as in a new process
        _descriptor.close_all(queued)


def _opened_by_pyfakefs(close: Callable[[int], None]) -> bool:
    return (getattr(close, "__module__", None) or "").startswith("pyfakefs.")


_closer = _Closer()
# Its thread is a daemon, stopped at exit: a short-lived process (the command line) would leave
# its prune undone, and the history one version longer on every run. A few ms at most.
atexit.register(_closer.wait, 5.0)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_closer.after_fork_in_child)
