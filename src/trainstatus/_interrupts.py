"""Signals (Ctrl-C) are held back while a store changes its state, and delivered right after.

Python runs a signal handler in the main thread, between two bytecodes of whatever it is
executing. A handler that raises (``KeyboardInterrupt`` from the default SIGINT handler, a
trainer's own SIGTERM handler raising ``SystemExit``) can therefore cut a store's bookkeeping in
half: a lock taken and never given back, a group-commit flag left set, a file renamed into place
while memory still holds the old document. No ``try``/``finally`` closes every such gap (the
exception can land between an ``acquire`` returning and the ``try`` that would release it).

So while the main thread runs a store's call (``enter`` ... ``leave``), every Python-level signal
handler is replaced by ``_handler``, which records the signal; ``leave`` restores the handlers and
then runs each recorded one, so the exception is raised once the call has finished, with memory and
file agreeing. Waits are the exception: waiting for a lock, for another thread's group write or
for a retry pause must stay interruptible (a ``lock_timeout`` may be minutes), so ``acquire``,
``wait`` and ``sleep`` let a signal through while they block, from points where the caller holds
nothing it would leak. A transaction's body is the user's code: ``hold`` keeps ``_handler``
installed across it, letting signals through at once, except in the transaction's own
``__enter__``/``__exit__`` frames (``BOUNDARIES``), where the body's end meets the commit.

Other threads never run signal handlers, so none of this applies to them: ``enter`` tells the
caller whether it is on the main thread. ``signal.getsignal``/``signal.signal`` wrap values into
enums (20 times slower than the ``_signal`` functions they call: 46 against 2.5 µs to look at every
signal); the C functions are used directly, and the ``signal`` module itself (and the enum it
imports: 2-3 ms of every start) is never imported here.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # the C module behind signal (no stub)
import functools
import operator
import os
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any, ParamSpec, TypeVar

__all__ = ["BOUNDARIES", "acquire", "deliver", "enter", "hold", "interruptible", "leave", "protected",
           "sleep", "state", "unhold"]

if TYPE_CHECKING:  # only in annotations, which are strings at run time
    _T = TypeVar("_T")
    _P = ParamSpec("_P")
# Every signal a Python handler can be installed for.
_CATCHABLE = tuple(sorted(int(s) for s in _signal.valid_signals() if s not in (_signal.SIGKILL, _signal.SIGSTOP)))


class _State:
    """The main thread's place in the protocol (only the main thread changes it)."""

    def __init__(self) -> None:
        self.depth = 0  # nested calls of a store in progress: signals are held back
        self.users = 0  # calls and open transactions that need ``_handler`` installed
        self.waiting = False  # blocked in ``acquire``/``wait``/``sleep``: a signal goes through
        # What _handler replaced, per signal, oldest first: kept after the handlers are put back,
        # so that a copy of _handler a caller saved and restores, or a handler that chains to it
        # (calls the handler it found), still reaches the one before.
        self.originals: dict[int, list[Callable[[int, FrameType | None], Any]]] = {}
        self.running: dict[int, int] = {}  # nesting of _handler per signal (a chain calling back)
        self.pending: list[tuple[int, FrameType | None]] = []
        self.forking_on_main = False
        # The handlers _install last found (one per _CATCHABLE signal) and the signals it put
        # _handler on: when the next call finds the very same handlers, it puts _handler on
        # those again without looking at each signal (61 of them: 17 of a small set's µs).
        self.found: tuple[Any, ...] = ()
        self.replaced: tuple[int, ...] = ()


state = _State()
# Code objects whose frames hold signals back even outside a call (see the module doc).
BOUNDARIES: set[CodeType] = set()


def _handler(signum: int, frame: FrameType | None) -> None:
    if state.waiting or (state.depth == 0 and (frame is None or frame.f_code not in BOUNDARIES)):
        waiting, state.waiting = state.waiting, False  # what the raise unwinds is held back again
        level = state.running.get(signum, 0)
        state.running[signum] = level + 1
        current = _signal.getsignal(signum)
        chain = state.originals.get(signum)
        # Not installed, but called: by the handler that replaced us, which chains to what it
        # found. That one has run already; stand for the one before it.
        skip = 1 if current is not _handler and chain and chain[-1] is current else 0
        try:
            _original(signum, level + skip)(signum, frame)
        finally:
            state.running[signum] = level
        state.waiting = waiting  # the handler returned (it set a flag): the wait goes on
    else:
        state.pending.append((signum, frame))


def _ignore(signum: int, frame: FrameType | None) -> None:
    pass


def _original(signum: int, level: int = 0) -> Callable[[int, FrameType | None], Any]:
    """The handler _handler stands for; ``level`` > 0 when a chained handler called back."""
    chain = state.originals.get(signum, [])
    if level < len(chain):
        return chain[-1 - level]
    return _signal.default_int_handler if signum == _signal.SIGINT else _ignore


def _run(signum: int, frame: FrameType | None) -> None:
    handler = _signal.getsignal(signum)
    if handler is _handler:
        handler = _original(signum)
    if callable(handler):
        handler(signum, frame)


def _on_main_thread() -> bool:
    return threading.get_ident() == threading.main_thread().ident


def _install() -> None:
    # Idempotent, and safe to leave half done: a handler already ours is skipped, and ours lets
    # every signal through while no call is in progress.
    found = tuple(map(_signal.getsignal, _CATCHABLE))
    if len(found) == len(state.found) and all(map(operator.is_, found, state.found)):
        for signum in state.replaced:  # what the loop below would do, knowing its answers
            try:
                _signal.signal(signum, _handler)
            except (ValueError, OSError):  # not the main interpreter: nothing to hold back
                pass
        return
    replaced = []
    for signum, current in zip(_CATCHABLE, found):
        if current is not _handler and callable(current):
            chain = state.originals.setdefault(signum, [])
            if not chain or chain[-1] is not current:
                chain.append(current)
            try:
                _signal.signal(signum, _handler)
                replaced.append(signum)
            except (ValueError, OSError):  # not the main interpreter: nothing to hold back
                chain.pop()
    state.found, state.replaced = found, tuple(replaced)


def _uninstall() -> None:
    for signum, chain in state.originals.items():
        if chain and _signal.getsignal(signum) is _handler:
            _signal.signal(signum, chain[-1])


def deliver() -> None:
    """Run the handlers of the signals held back; the first exception one raised is raised."""
    pending, state.pending = state.pending, []
    error: BaseException | None = None
    for signum, frame in pending:
        try:
            _run(signum, frame)
        except BaseException as exc:  # noqa: BLE001 - raised below, once every handler ran
            if error is None:
                error = exc
    if error is not None:
        try:
            raise error
        finally:
            del error


def enter() -> bool:
    """Start a store's call: hold signals back; whether this is the main thread (pass to ``leave``)."""
    if not _on_main_thread():
        return False
    if state.depth == 0:
        _install()  # again at every outermost call: a transaction's body may have replaced ours
    state.depth += 1; state.users += 1  # noqa: E702 - one line: no signal is handled in between
    return True


def leave() -> None:
    """End a store's call (main thread only): restore the handlers, then run the held-back ones."""
    state.depth -= 1; state.users -= 1  # noqa: E702 - one line: no signal is handled in between
    if not state.users: _uninstall()  # noqa: E701
    if state.pending and not state.depth: deliver()  # noqa: E701


def protected(function: Callable[_P, _T]) -> Callable[_P, _T]:
    """``function`` as one store call: signals held back from its first line to its last."""
    @functools.wraps(function)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        main = enter()
        try:
            return function(*args, **kwargs)
        finally:
            if main:
                leave()
    return call


def hold() -> None:
    """Keep ``_handler`` installed after this call ends (a transaction's body; main thread only)."""
    state.users += 1


def unhold() -> None:
    """Undo ``hold`` (inside the call that ends the transaction; main thread only)."""
    state.users -= 1


def _wait(call: Callable[[], _T]) -> _T:
    """``call()`` with signals let through, in the main thread inside a call; plain otherwise."""
    if not _on_main_thread():
        return call()
    if state.pending:
        deliver()  # held back until this wait: a safe point to raise
    if not state.depth:
        return call()
    state.waiting = True
    try:
        return call()
    finally:
        state.waiting = False


def acquire(lock: Any, timeout: float | None) -> bool:
    """``lock.acquire`` (a Lock or an RLock), interruptible; never leaves it taken on an exception."""
    if hasattr(lock, "_is_owned") and lock._is_owned():
        return bool(lock.acquire())  # reentrant: no wait
    try:
        return _wait(lambda: bool(lock.acquire(True, -1 if timeout is None else timeout)))
    except BaseException:
        # The signal may have been handled right after the acquire returned.
        if hasattr(lock, "_is_owned") and lock._is_owned():
            lock.release()
        raise


def sleep(seconds: float) -> None:
    """``time.sleep``, interruptible."""
    _wait(lambda: time.sleep(seconds))


class interruptible:
    """A block (a network request) during which signals go through, as in a wait."""

    def __enter__(self) -> None:
        self._active = bool(state.depth) and _on_main_thread()
        if self._active:
            if state.pending:
                deliver()
            state.waiting = True

    def __exit__(self, *exc_info: object) -> None:
        if self._active:
            state.waiting = False


def _before_fork() -> None:
    state.forking_on_main = _on_main_thread()


def _after_fork_in_child() -> None:
    # Forked from another thread while the main thread was in a call: the child's main thread is
    # the forking one, which is in no call; it starts afresh. Forked from the main thread, the
    # child goes on with the same stack, which will leave what it entered.
    if state.forking_on_main:
        return
    try:
        _uninstall()
    except (ValueError, OSError):  # pragma: no cover - not the main interpreter
        pass
    state.__init__()  # type: ignore[misc]


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


# Their frames move the protocol from one state to another: a signal there waits for the end of
# the call (``enter`` runs before the call's depth counts it, ``leave`` after).
BOUNDARIES.update(f.__code__ for f in (enter, leave, _install, _uninstall))
