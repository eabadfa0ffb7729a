"""The error and warning classes: hierarchy, context attributes, pickling, the ``warn`` helper."""

from __future__ import annotations

import copy
import errno
import pathlib
import pickle
import warnings

import pytest

import trainstatus
from trainstatus import (
    TrainingStatusBackendError,
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusCorruptError,
    TrainingStatusCorruptWarning,
    TrainingStatusDependencyError,
    TrainingStatusError,
    TrainingStatusConflictError,
    TrainingStatusHistoryWarning,
    TrainingStatusInUseError,
    TrainingStatusLockTimeout,
    TrainingStatusMissingWarning,
    TrainingStatusReadError,
    TrainingStatusTypeError,
    TrainingStatusUnfinishedWrite,
    TrainingStatusValueError,
    TrainingStatusVersionError,
    TrainingStatusVersionWarning,
    TrainingStatusWarning,
    TrainingStatusWriteError,
)
from trainstatus._errors import warn

CONTEXT = ("path", "category", "key", "found_version", "lock_file", "moved_to")

# class -> the built-in exception classes it must also be (besides Exception)
ERRORS = {
    TrainingStatusError: (),
    TrainingStatusReadError: (OSError,),
    TrainingStatusWriteError: (OSError,),
    TrainingStatusLockTimeout: (TimeoutError, OSError),
    TrainingStatusUnfinishedWrite: (TrainingStatusLockTimeout, TimeoutError, OSError),
    TrainingStatusConflictError: (TimeoutError, OSError),
    TrainingStatusCorruptError: (),
    TrainingStatusVersionError: (),
    TrainingStatusTypeError: (TypeError,),
    TrainingStatusValueError: (ValueError,),
    TrainingStatusCheckpointError: (OSError,),
    TrainingStatusDependencyError: (ImportError,),
    TrainingStatusBackendError: (),
    TrainingStatusInUseError: (),
}
WARNINGS = (
    TrainingStatusWarning,
    TrainingStatusMissingWarning,
    TrainingStatusVersionWarning,
    TrainingStatusCorruptWarning,
    TrainingStatusHistoryWarning,
    TrainingStatusCheckpointWarning,
)
ALL_CLASSES = (*ERRORS, *WARNINGS)
BUILTIN_BASES = (OSError, TimeoutError, TypeError, ValueError, ImportError)

FULL_CONTEXT = {
    "path": "/runs/r1/training_status.json",
    "category": "Walker",
    "key": "checkpoints",
    "found_version": "1.0.0",
    "lock_file": "/runs/r1/training_status.json.lock",
    "moved_to": "/runs/r1/training_status.json.corrupt-20240101T000000.000000Z",
}


def make(cls: type, message: str = "something went wrong", **context: object) -> BaseException:
    return cls(message, **context)


def assert_same(original: BaseException, copy_: BaseException) -> None:
    assert type(copy_) is type(original)
    assert str(copy_) == str(original)
    assert copy_.args == original.args
    for name in CONTEXT:
        assert getattr(copy_, name) == getattr(original, name), name
    if isinstance(original, TrainingStatusWriteError):
        assert copy_.errno == original.errno


# -- hierarchy ----------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", list(ERRORS), ids=lambda c: c.__name__)
def test_every_error_is_a_training_status_error(cls: type) -> None:
    assert issubclass(cls, TrainingStatusError)
    assert issubclass(cls, Exception)
    assert not issubclass(cls, Warning)
    for base in ERRORS[cls]:
        assert issubclass(cls, base), base
    # and no built-in base it was not meant to have
    for base in BUILTIN_BASES:
        if not any(issubclass(b, base) for b in ERRORS[cls]):
            assert not issubclass(cls, base), base


@pytest.mark.parametrize("cls", WARNINGS, ids=lambda c: c.__name__)
def test_every_warning_is_a_training_status_warning(cls: type) -> None:
    assert issubclass(cls, TrainingStatusWarning)
    assert issubclass(cls, UserWarning)
    assert not issubclass(cls, TrainingStatusError)


def test_catching_the_builtin_base_catches_the_error() -> None:
    with pytest.raises(OSError):
        raise TrainingStatusWriteError("disk full", errno=errno.ENOSPC)
    with pytest.raises(OSError):
        raise TrainingStatusReadError("cannot read")
    with pytest.raises(TimeoutError):
        raise TrainingStatusLockTimeout("lock busy")
    with pytest.raises(TrainingStatusLockTimeout):  # code that catches timeouts catches it too
        raise TrainingStatusUnfinishedWrite("handed over, not finished")
    with pytest.raises(TypeError):
        raise TrainingStatusTypeError("bad type")
    with pytest.raises(ValueError):
        raise TrainingStatusValueError("bad value")


# -- attributes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_message_and_context_attributes(cls: type) -> None:
    exc = make(cls, "the message", **FULL_CONTEXT)
    assert str(exc) == "the message"
    assert exc.args == ("the message",)
    for name, value in FULL_CONTEXT.items():
        assert getattr(exc, name) == value


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_context_attributes_default_to_none(cls: type) -> None:
    exc = make(cls, "bare")
    for name in CONTEXT:
        assert getattr(exc, name) is None, name
    assert str(exc) == "bare"


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_path_like_context_becomes_str(cls: type) -> None:
    exc = make(cls, "m", path=pathlib.Path("/a/b.json"), moved_to=pathlib.PurePosixPath("/a/b.json.corrupt-1"))
    assert exc.path == "/a/b.json" and type(exc.path) is str
    assert exc.moved_to == "/a/b.json.corrupt-1" and type(exc.moved_to) is str


def test_write_error_carries_errno() -> None:
    exc = TrainingStatusWriteError("disk full", errno=errno.ENOSPC, path="/x.json")
    assert exc.errno == errno.ENOSPC
    assert exc.path == "/x.json"
    assert str(exc) == "disk full"
    assert TrainingStatusWriteError("no errno").errno is None


def test_oserror_subclasses_keep_the_message_as_str() -> None:
    # OSError formats "[Errno n] ..." when given (errno, strerror); ours must stay the plain message.
    for cls in (TrainingStatusReadError, TrainingStatusWriteError, TrainingStatusLockTimeout, TrainingStatusConflictError):
        assert str(cls("plain words", path="/p")) == "plain words"


# -- pickling -----------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_pickle_round_trip_keeps_message_class_and_context(cls: type, protocol: int) -> None:
    extra = {"errno": errno.EIO} if cls is TrainingStatusWriteError else {}
    for context in (FULL_CONTEXT, {}, {"path": "/only/path.json"}):
        original = make(cls, "pickled message: with 'quotes' and ünïcode", **context, **extra)
        restored = pickle.loads(pickle.dumps(original, protocol=protocol))
        assert_same(original, restored)


def test_write_error_pickles_errno_none_and_set() -> None:
    for value in (None, errno.ENOSPC, errno.EROFS):
        original = TrainingStatusWriteError("w", errno=value, path="/p")
        restored = pickle.loads(pickle.dumps(original))
        assert restored.errno == value
        assert isinstance(restored, OSError)


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_copy_uses_the_same_reduction(cls: type) -> None:
    original = make(cls, "copied", **FULL_CONTEXT)
    assert_same(original, copy.copy(original))
    assert_same(original, copy.deepcopy(original))


def test_pickle_of_a_raised_error_keeps_context() -> None:
    try:
        raise TrainingStatusLockTimeout("timed out", path="/p.json", lock_file="/p.json.lock")
    except TrainingStatusLockTimeout as exc:
        restored = pickle.loads(pickle.dumps(exc))
    assert isinstance(restored, TimeoutError)
    assert restored.lock_file == "/p.json.lock"
    assert str(restored) == "timed out"


# -- unknown context ----------------------------------------------------------------------------


@pytest.mark.parametrize("cls", ALL_CLASSES, ids=lambda c: c.__name__)
def test_unknown_context_keyword_raises_type_error(cls: type) -> None:
    with pytest.raises(TypeError) as info:
        cls("m", path="/p", colour="red", size=3)
    assert str(info.value) == "unexpected context ['colour', 'size']"
    assert type(info.value) is TypeError  # a plain TypeError: no half-built instance escapes


def test_errno_is_not_a_context_keyword_of_other_errors() -> None:
    with pytest.raises(TypeError, match=r"^unexpected context \['errno'\]$"):
        TrainingStatusReadError("m", errno=5)


# -- warn() -------------------------------------------------------------------------------------


def test_warn_points_at_the_caller_outside_the_package() -> None:
    with pytest.warns(TrainingStatusVersionWarning) as record:
        warn(TrainingStatusVersionWarning("direct", path="/p"))
    assert len(record) == 1
    assert record[0].filename == __file__
    assert record[0].message.path == "/p"
    assert str(record[0].message) == "direct"


def test_a_warning_from_an_integration_s_subpackage_points_at_the_caller(tmp_path: pathlib.Path) -> None:
    # integrations/_shared/choice.py, two folders below the package: its frames are the package's
    # too (a warning pointed inside it when only integrations/ itself was recognised).
    from trainstatus.integrations._shared.choice import Words, warn_passed_over

    words = Words(left="They stay.", fresh="The run starts over.", elsewhere="save elsewhere")
    with pytest.warns(TrainingStatusCheckpointWarning) as record:
        warn_passed_over(None, [({}, "gone")], str(tmp_path / "s.json"), "c", str(tmp_path), words)
    assert [entry.filename for entry in record] == [__file__]


def test_public_names_are_the_same_objects() -> None:
    for cls in ALL_CLASSES:
        assert getattr(trainstatus, cls.__name__) is cls
