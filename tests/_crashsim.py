"""The store's own crash-state checker, on the public power-loss recorder of ``trainstatus.testing``.

The recorder (an ``os`` interposer that logs the operations deciding what a crash can leave, and
checks itself by replaying them), the crash model and the state enumerator are the public ones
(``trainstatus._testing.power``, documented in docs/testing.md, "Testing your trainer's crash recovery").
This module adds what is specific to the store: its verdict.

The checker
-----------
``check`` records one call with ``trainstatus.testing.power_losses``, which builds every state
of the model (after removing duplicates) and materializes each one in a fresh directory, where
this checker opens a ``StatusStore``: the *recovery*. Recovery must give the document recovery
gives from the state before the call (*old*) or the one after it (*new*), and the new one for the
state after the call returned; it must not meet a damaged status file unless the old state had
one; it must leave no temp file behind; bytes the scenario says must survive (a damaged file being
kept aside) must still exist under some name, and so must the bytes of any damaged status file
recovery met (kept aside, never overwritten); and a status file holding the old or the new bytes
must have the permission bits it had then.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _helpers import same

from trainstatus import StatusStore, TrainingStatusCorruptWarning
from trainstatus._storage import filenames as _names
from trainstatus._load import Corrupt, load_document
from trainstatus._testing.fs import FsState, is_lock_name, materialize, snapshot
from trainstatus._testing.power import (
    BLOCK,
    Call,
    Hook,
    IncompleteRecording,
    Interposer,
    Op,
    Recorder,
    crash_states,
    verify_recording,
)
from trainstatus.testing import PowerLoss, power_losses

__all__ = [
    "BLOCK", "Call", "FsState", "Hook", "IncompleteRecording", "Interposer", "Op", "Recorder", "Report",
    "Scenario", "Violation", "check", "crash_states", "is_lock_name", "materialize", "record", "snapshot",
    "temp_name_pattern", "verify_recording",
]


def temp_name_pattern(name: str) -> re.Pattern[str]:
    """The temp file names docs/guarantees.md documents: ``.<name>.trainstatus-<16 hex>.tmp``."""
    return re.compile(re.escape(f".{name}.trainstatus-") + r"[0-9a-f]{16}\.tmp")


# -- recovery and the verdict --------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """What opening a StatusStore on a state gives."""

    document: dict[str, Any] | None
    damaged: bool  # a TrainingStatusCorruptWarning: the status file was kept aside
    error: str | None
    leftovers: list[str]

    def same_document(self, other: Outcome) -> bool:
        return self.document is not None and other.document is not None and same(self.document, other.document)


def recover(directory: Path, target: str) -> Outcome:
    """Open a StatusStore on ``directory/target`` as the next run would, and report."""
    path = directory / target
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            store = StatusStore(path, durable=False, lock_timeout=10)
        except Exception as exc:  # noqa: BLE001 - any exception is a finding
            return Outcome(None, False, f"{type(exc).__name__}: {exc}", [])
        try:
            document = store.to_dict()
        finally:
            store.close()
    damaged = any(isinstance(w.message, TrainingStatusCorruptWarning) for w in caught)
    pattern = temp_name_pattern(os.path.basename(target))
    parent = path.parent
    leftovers = sorted(n for n in os.listdir(parent) if pattern.fullmatch(n)) if parent.is_dir() else []
    return Outcome(document, damaged, None, leftovers)


def _all_bytes(directory: Path) -> set[bytes]:
    found = set()
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            found.add(path.read_bytes())
    return found


@dataclasses.dataclass
class Violation:
    k: int  # crash after this many operations
    problem: str
    state: FsState

    def __str__(self) -> str:
        return f"crash after {self.k} operation(s): {self.problem}"


@dataclasses.dataclass
class Report:
    scenario: str
    ops: list[Op]
    states: int  # distinct crash states checked
    violations: list[Violation]
    damaged: int = 0  # states in which recovery met a damaged status file (and kept it aside)

    def kinds(self) -> set[str]:
        return {v.problem.split(":")[0] for v in self.violations}

    def summary(self, limit: int = 5) -> str:
        lines = [f"{self.scenario}: {self.states} states, {len(self.violations)} violation(s); trace:"]
        lines += [f"  {i}: {op}" for i, op in enumerate(self.ops)]
        lines += [f"  - {v}" for v in self.violations[:limit]]
        return "\n".join(lines)


# Violation kinds (the text before the first colon of ``Violation.problem``).
RAISED = "recovery raised"
DAMAGED = "damaged status file"
NEITHER = "neither old nor new"
LOST = "lost after set() returned"
LEFTOVER = "temp file left after recovery"
BYTES_LOST = "bytes that must survive are gone"
MODE = "wrong permission bits"
HISTORY_DAMAGED = "damaged version in the history"
HISTORY_LOST = "replaced version missing from the history after set() returned"


@dataclasses.dataclass
class Scenario:
    """One call to record: ``prepare(root)`` lays out the files and returns the call to make."""

    name: str
    target: str  # the status file, relative to the root
    prepare: Callable[[Path], Callable[[], None]]
    must_survive: tuple[bytes, ...] = ()  # bytes that must exist under some name in every state


def judge(k: int, final_k: int, state: FsState, outcome: Outcome, old: Outcome, new: Outcome,
          old_state: FsState, new_state: FsState, target: str, directory: Path,
          must_survive: tuple[bytes, ...]) -> list[str]:
    problems = []
    if outcome.error is not None:
        return [f"{RAISED}: {outcome.error}"]
    if outcome.damaged and not old.damaged:
        problems.append(f"{DAMAGED}: recovery kept aside a damaged file holding {state.content(target)!r:.120}")
    if outcome.same_document(new):
        pass
    elif outcome.same_document(old):
        if k == final_k and not old.same_document(new):
            problems.append(f"{LOST}: recovery gives the state before the call")
    elif not outcome.damaged or old.damaged:
        problems.append(f"{NEITHER}: recovery gives {outcome.document!r:.200}")
    if outcome.leftovers:
        problems.append(f"{LEFTOVER}: {outcome.leftovers}")
    damaged_bytes = (state.content(target),) if outcome.damaged and state.content(target) is not None else ()
    if must_survive or damaged_bytes:
        present = _all_bytes(directory)
        for blob in must_survive + damaged_bytes:  # a damaged file is kept aside, byte for byte
            if blob not in present:
                problems.append(f"{BYTES_LOST}: {blob!r:.80}")
    problems += _judge_history(k, final_k, state, old_state, new_state, target)
    content, mode = state.content(target), state.mode(target)
    for reference in (new_state, old_state):
        if content is not None and content == reference.content(target):
            if mode != reference.mode(target):
                problems.append(f"{MODE}: {target} holds the bytes of the "
                                f"{'new' if reference is new_state else 'old'} file with mode {mode:#o}, "
                                f"not {reference.mode(target):#o}")
            break
    return problems


def _history_of(state: FsState, target: str) -> dict[str, bytes]:
    """The versions of ``target`` kept in its history in ``state``: name -> bytes."""
    directory, name = os.path.split(target)
    pattern = _names.history_pattern(name)
    found = {}
    for rel in state.entries:
        if os.path.dirname(rel) == directory and pattern.fullmatch(os.path.basename(rel)):
            content = state.content(rel)
            if content is not None:
                found[rel] = content
    return found


def _parses(data: bytes) -> bool:
    try:
        load_document(data)
    except Corrupt:
        return False
    return True


def _judge_history(k: int, final_k: int, state: FsState, old_state: FsState, new_state: FsState,
                   target: str) -> list[str]:
    """Every kept version is whole; once the call returned, the version it replaced is kept."""
    problems = []
    history = _history_of(state, target)
    for rel, content in sorted(history.items()):
        if not _parses(content):
            problems.append(f"{HISTORY_DAMAGED}: {rel} holds {content!r:.80}")
    old = old_state.content(target)
    kept_after = _history_of(new_state, target)
    # Only where the real call kept it (history on, the old file whole): then a power loss after
    # the return must not lose it.
    if k == final_k and old is not None and old in kept_after.values() and old not in history.values():
        problems.append(f"{HISTORY_LOST}: {old!r:.80}")
    return problems


def record(scenario: Scenario, root: Path, watch: re.Pattern[str] | None = None) -> tuple[FsState, Recorder, FsState]:
    """Run the scenario's call in ``root`` under a Recorder; (state before, recorder, state after)."""
    root.mkdir(parents=True, exist_ok=True)
    call = scenario.prepare(root)
    initial = snapshot(root)
    recorder = Recorder(root, initial, watch=watch)
    with recorder:
        call()
    verify_recording(recorder, root)
    return initial, recorder, snapshot(root)


def check(scenario: Scenario, workdir: Path, block: int = BLOCK) -> Report:
    """Record the scenario in ``workdir/record``, then judge every crash state of the model."""
    root = workdir / "record"
    root.mkdir(parents=True)
    call = scenario.prepare(root)
    scratch = workdir / "states"
    scratch.mkdir()
    references: dict[str, Outcome] = {}
    violations: list[Violation] = []
    damaged = [0]

    def reference(name: str, state: FsState) -> Outcome:
        if name not in references:
            directory = scratch / name
            materialize(state, directory)
            references[name] = recover(directory, scenario.target)
        return references[name]

    def judge_one(loss: PowerLoss) -> None:
        recording = loss.recording
        old = reference("old", recording.before)
        new = reference("new", recording.after)
        if new.error is not None or new.leftovers:
            raise AssertionError(f"{scenario.name}: the state after the call does not recover cleanly: {new}")
        directory = Path(loss.folder)
        outcome = recover(directory, scenario.target)
        damaged[0] += outcome.damaged
        for problem in judge(loss.done, len(recording.ops), loss.state, outcome, old, new, recording.before,
                             recording.after, scenario.target, directory, scenario.must_survive):
            violations.append(Violation(loss.done, problem, loss.state))

    recording = power_losses(call, judge_one, root=root, scratch=scratch, block=block)
    return Report(scenario.name, list(recording.ops), recording.states, violations, damaged[0])
