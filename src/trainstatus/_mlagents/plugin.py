"""The ML-Agents plugin: with trainstatus installed, ``mlagents-learn`` writes its status through.

ML-Agents' modules each did ``from mlagents.trainers.training_status import GlobalTrainingStatus``
long before any plugin runs, so replacing the name in that module would change nothing: the
plugin *routes the class object they all hold*, replacing its static methods (and its
``saved_state``) by trainstatus's drop-in, which is bound to the run's
``<results_dir>/<run_id>/run_logs/training_status.json``.

ML-Agents gives plugins two moments, both through entry points (registered unconditionally: only
ML-Agents reads these groups, so they cost nothing to anyone else):

- ``mlagents.trainer_type`` entry points are called (with no arguments) while ``mlagents-learn``
  parses its command line, before ``run_training`` reads the status of a ``--resume`` run.
  :func:`trainer_types` routes the class there, so that read is trainstatus's own (validation,
  damaged files kept aside, version warnings) instead of a bare ``json.load`` that crashes on a
  half-written file. It adds no trainer type.
- ``mlagents.stats_writer`` entry points are called with the run's ``RunOptions`` after that read
  and before the curriculum, the trainers and the ghost trainer touch the status.
  :func:`stats_writers` routes the class if the first moment did not happen (``run_training``
  called directly), and binds it: a fresh run at once (the file exists from that moment, so a kill
  a second later still resumes), a ``--resume`` run to the file just read. It returns no writer.

ML-Agents catches and logs every exception of a plugin and then goes on without it, which for this
plugin means: the status is saved at exit by ML-Agents, as before. So every refusal here (an
unsupported ML-Agents release, a bad ``TRAINSTATUS_MLAGENTS``) is an exception with a message that
says what to do; ML-Agents prints it with its traceback at ERROR level.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from .._storage import atomic as _atomic, filenames as _names
from .._checkpoints.folders import _fsync, remove_unlisted, sync_folders_above
from .._errors import TrainingStatusError
from .status import GlobalTrainingStatus, SavedStateView

__all__ = ["ENV_VAR", "STATUS_FILE_NAME", "SUPPORTED_RELEASES", "stats_writers", "trainer_types"]

ENV_VAR = "TRAINSTATUS_MLAGENTS"
STATUS_FILE_NAME = "training_status.json"  # learn.py's TRAINING_STATUS_FILE_NAME

# (major, minor) of the mlagents releases routed. 1.0 (release 21) and 1.1 (release 22) have the
# same training_status.py, checkpoint_manager.py and environment_parameter_manager.py, byte for
# byte, and every status change in them goes through set_parameter_state (the checkpoint manager
# sets the list back after changing it). Older releases are refused: some mutated the list that
# get_parameter_state returned and never set it back, which a write-through store (whose get
# returns a copy) would silently lose. Newer ones are refused until they are checked.
SUPPORTED_RELEASES = {(1, 0): "release 21", (1, 1): "release 22"}

_ON = ("", "1", "on", "true", "yes")
_OFF = ("0", "off", "false", "no")
_ROUTED = "_trainstatus_routed"  # set on ML-Agents' class once its methods are ours

_logger: logging.Logger | None = None


def trainer_types() -> tuple[dict[str, Any], dict[str, Any]]:
    """Entry point ``mlagents.trainer_type``: route the status before ``mlagents-learn`` reads it.

    Returns no trainer types and no trainer settings.
    """
    if _enabled():
        _route()
    return {}, {}


def stats_writers(run_options: Any) -> list[Any]:
    """Entry point ``mlagents.stats_writer``: bind ML-Agents' status to the run's file.

    Returns no stats writers.
    """
    if not _enabled():
        _log().info(
            "trainstatus: %s=%s, ML-Agents saves the training status itself, at exit.",
            ENV_VAR,
            os.environ.get(ENV_VAR),
        )
        return []
    _route()
    settings = run_options.checkpoint_settings
    path = os.path.join(settings.run_logs_dir, STATUS_FILE_NAME)
    if settings.resume:
        if not GlobalTrainingStatus._bound_to(path):
            # trainer_types did not run (run_training was called directly): ML-Agents read the file
            # with json.load; read it again through trainstatus, which validates it.
            _unbind_other_run()
            GlobalTrainingStatus.load_state(path)
    else:
        # A new run, --force, --initialize-from, --inference without --resume: ML-Agents starts
        # from an empty status and replaces the file at exit; this replaces it now.
        _unbind_other_run()
        GlobalTrainingStatus.start_fresh(path, overwrite=True)
        GlobalTrainingStatus.store().save()
    _log().info(
        "trainstatus: the training status is written through to %s: every change is on disk when "
        "ML-Agents' set_parameter_state returns (%s=off turns this off).",
        GlobalTrainingStatus.store().path,
        ENV_VAR,
    )
    return []


def enabled_from(value: str | None) -> bool:
    """What ``TRAINSTATUS_MLAGENTS=value`` means (unset means on)."""
    if value is None or value.strip().lower() in _ON:
        return True
    if value.strip().lower() in _OFF:
        return False
    raise TrainingStatusError(
        f"{ENV_VAR}={value!r} is neither on nor off, so the trainstatus plugin is not used for "
        f"this run and ML-Agents saves the training status only at exit. Set {ENV_VAR}=off to turn "
        "the plugin off, or unset it (or 1, on) to write the status through."
    )


def supported(version: str) -> bool:
    """Does the plugin route this ``mlagents`` version (``mlagents.trainers.__version__``)?"""
    parts = version.split(".")
    try:
        release = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return False
    return release in SUPPORTED_RELEASES


def _enabled() -> bool:
    return enabled_from(os.environ.get(ENV_VAR))


def _route() -> None:
    """Make ML-Agents' ``GlobalTrainingStatus`` class object use trainstatus's drop-in."""
    import mlagents.trainers
    from mlagents.trainers import training_status

    version = str(mlagents.trainers.__version__)
    if not supported(version):
        releases = " and ".join(f"{a}.{b} ({name})" for (a, b), name in SUPPORTED_RELEASES.items())
        raise TrainingStatusError(
            f"trainstatus does not route the training status of mlagents {version}: it supports "
            f"mlagents {releases}, whose checkpoint manager sets every list it changes back. "
            f"ML-Agents saves the status at exit, as without trainstatus. Use mlagents 1.1.0 to "
            f"write it through, or set {ENV_VAR}=off to silence this message."
        )
    native = training_status.GlobalTrainingStatus
    if getattr(native, _ROUTED, False):
        return
    # ML-Agents' own metadata block (its version, torch's), so that a resume with other versions
    # warns, as ML-Agents' load_state does.
    metadata = dict(training_status.StatusMetaData().to_dict())
    metadata.pop("stats_format_version", None)
    GlobalTrainingStatus._configure(metadata=metadata)
    # Values ML-Agents already holds that are not a loaded file's (nothing, in learn.py's order)
    # go to the drop-in before it is bound, which writes them at binding.
    for category, entries in list(native.saved_state.items()):
        if category != "metadata" and isinstance(entries, dict):
            for key, value in entries.items():
                GlobalTrainingStatus.set_parameter_state(category, key, value)
    native.load_state = staticmethod(_load_state)
    native.save_state = staticmethod(_save_state)
    native.set_parameter_state = staticmethod(GlobalTrainingStatus.set_parameter_state)
    native.get_parameter_state = staticmethod(GlobalTrainingStatus.get_parameter_state)
    native.saved_state = SavedStateView()
    _route_checkpoint_manager()
    _route_model_saver()
    setattr(native, _ROUTED, True)


def _route_checkpoint_manager() -> None:
    """Make ML-Agents' ``ModelCheckpointManager.add_checkpoint`` record before it deletes.

    ML-Agents deletes the files of the checkpoints beyond ``keep_checkpoints`` and only then sets
    the shortened list: a kill in between leaves a status naming files that are gone, which a
    ``--resume`` then tries to load. The same steps in the safe order: the new checkpoint's files
    are synced, the list (with the new one, without the dropped ones) is written through, and
    only then are the dropped checkpoints' files removed. A kill in between leaves a file no list
    names, never a listed file that is missing. Everything else is ML-Agents' own code.
    """
    import attr
    from mlagents.trainers.policy.checkpoint_manager import ModelCheckpointManager
    from mlagents.trainers.training_status import StatusType

    def add_checkpoint(cls: Any, behavior_name: str, new_checkpoint: Any, keep_checkpoints: int) -> None:
        new_checkpoint_dict = attr.asdict(new_checkpoint)
        _sync_files([new_checkpoint_dict["file_path"], *new_checkpoint_dict["auxillary_file_paths"]])
        checkpoints = cls.get_checkpoints(behavior_name)
        checkpoints.append(new_checkpoint_dict)
        dropped = []
        while len(checkpoints) > keep_checkpoints:  # ML-Agents' _cleanup_extra_checkpoints, deferred
            if keep_checkpoints <= 0 or len(checkpoints) == 0:
                break
            dropped.append(checkpoints.pop(0))
        GlobalTrainingStatus.set_parameter_state(behavior_name, StatusType.CHECKPOINTS, checkpoints)
        _remove_dropped(behavior_name, dropped)

    ModelCheckpointManager.add_checkpoint = classmethod(add_checkpoint)


def _remove_dropped(behavior_name: str, dropped: list[Any]) -> None:
    """ML-Agents' remove_checkpoint for the ``dropped`` entries of ``behavior_name``, once the list
    without them is written, for the files no entry still names: ML-Agents checkpoints twice at one
    step (the periodic save, then save_model at exit or Ctrl-C), so a dropped entry can name the
    files of one kept, or of the final checkpoint. Relative paths are ML-Agents', against the
    current directory: those of the behavior's kept entries too (its category given), even if it
    records a ``checkpoint_root`` (ML-Agents neither reads nor follows it)."""
    store = GlobalTrainingStatus.store()
    for checkpoint, reason in remove_unlisted(dropped, store.to_dict(), None, store.path, behavior_name):
        _log().warning("trainstatus: an old checkpoint of %s (steps %s) was dropped from the list, "
                       "but %s; remove it by hand", behavior_name, checkpoint.get("steps"), reason)


def _route_model_saver() -> None:
    """Make ``--resume`` load a whole model: ``checkpoint.pt`` replaced atomically, a listed one if not.

    ML-Agents' ``--resume`` loads ``<behavior>/checkpoint.pt``, which every checkpoint rewrites in
    place with ``torch.save``: a kill inside that write, or before the first checkpoint of the run,
    leaves a file torch cannot load (or none), and the resume crashes in ``torch.load``. Routed,
    ``checkpoint.pt`` is written to a temp file, synced and renamed over the old one; and a resume
    that still cannot load it (a run killed before its first checkpoint, a file damaged by hand)
    loads the ``.pt`` of the newest listed checkpoint whose file is there, or, with none, starts
    the model afresh, with a warning either way. Everything else is ML-Agents' own code.
    """
    from mlagents.trainers.policy.checkpoint_manager import ModelCheckpointManager

    try:
        from mlagents.trainers.model_saver import torch_model_saver
    except Exception as exc:  # noqa: BLE001 - whatever a broken torch raises on import
        # Without a torch that imports, ML-Agents saves and loads no model either: nothing to route.
        # (The status code alone runs without it: a trainer of one's own, the suite's light tests.)
        _log().debug("trainstatus: ML-Agents' model saver not routed: %s", exc)
        return

    saver = torch_model_saver.TorchModelSaver
    native_load = saver._load_model

    def save_checkpoint(self: Any, behavior_name: str, step: int) -> tuple[str, list[str]]:
        # ML-Agents' save_checkpoint, but for the atomic write of checkpoint.pt.
        if not os.path.exists(self.model_path):
            os.makedirs(self.model_path)
        checkpoint_path = os.path.join(self.model_path, f"{behavior_name}-{step}")
        state_dict = {name: module.state_dict() for name, module in self.modules.items()}
        pytorch_ckpt_path = f"{checkpoint_path}.pt"
        export_ckpt_path = f"{checkpoint_path}.onnx"
        torch_model_saver.torch.save(state_dict, pytorch_ckpt_path)
        _save_replacing(lambda path: torch_model_saver.torch.save(state_dict, path),
                        os.path.join(self.model_path, torch_model_saver.DEFAULT_CHECKPOINT_NAME))
        self.export(checkpoint_path, behavior_name)
        return export_ckpt_path, [pytorch_ckpt_path]

    def load_model(self: Any, load_path: str, policy: Any = None, reset_global_steps: bool = False) -> None:
        try:
            native_load(self, load_path, policy, reset_global_steps)
            return
        except Exception as exc:  # torch.load's errors for a missing or damaged file vary by release
            if not self.load or self.initialize_path is not None or not _torn_or_missing(exc):
                # --initialize-from names a file of the user's, and an error that is not about the
                # file (a CUDA-saved model on a CPU-only host, permissions, I/O): ML-Agents' error
                # stands, rather than a fresh model whose next save would replace a good file.
                raise
            failure = exc
        behavior = os.path.basename(os.path.normpath(self.model_path))
        for checkpoint in reversed(ModelCheckpointManager.get_checkpoints(behavior)):
            for path in checkpoint.get("auxillary_file_paths", []):
                if path.endswith(".pt") and os.path.exists(path):
                    _log().warning("trainstatus: %s could not be loaded (%s); resuming %s from its newest listed "
                                   "checkpoint, %s (steps %s)", load_path, failure, behavior, path,
                                   checkpoint.get("steps"))
                    try:
                        native_load(self, path, policy, reset_global_steps)
                    except Exception as again:
                        raise again from failure  # both files' errors in the traceback
                    return
        _log().warning("trainstatus: %s could not be loaded (%s) and no checkpoint of %s is listed: its model "
                       "starts afresh, at step 0 (its curriculum lessons are resumed)", load_path, failure, behavior)

    saver.save_checkpoint = save_checkpoint
    saver._load_model = load_model


def _torn_or_missing(exc: BaseException) -> bool:
    """Whether ``torch.load``'s ``exc`` says the file is missing or cut short (a kill inside its
    save), not that this machine cannot load a whole file."""
    import pickle
    import zipfile

    if isinstance(exc, (FileNotFoundError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile)):
        return True
    # torch's zip reader: "PytorchStreamReader failed reading zip archive: failed finding central
    # directory", "... failed reading file data/0: invalid header or archive is corrupted".
    return isinstance(exc, RuntimeError) and "PytorchStreamReader failed" in str(exc)


def _save_replacing(save: Any, target: str) -> None:
    """``save(path)`` to a temp file beside ``target``, synced, then renamed over ``target``.

    The temp files a kill left there before are removed first: they never became the target.
    """
    folder, name = os.path.split(target)
    stale = _names.temp_pattern(name)
    with contextlib.suppress(OSError):  # a folder that cannot be listed is left to the next save
        for left in os.listdir(folder):
            if stale.fullmatch(left):
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(folder, left))
    temp = os.path.join(folder, _names.temp_name(name, _atomic.token()))
    try:
        save(temp)
        _fsync(temp)
        _atomic.replace(temp, target)
    except BaseException:
        _atomic.discard_temp(-1, temp)
        raise
    with contextlib.suppress(OSError):  # some filesystems refuse a directory fsync
        _fsync(folder, directory=True)


def _sync_files(paths: list[str]) -> None:
    """fsync each file that exists, its directory and the folders above up to the status file's:
    a listed checkpoint survives a power loss.

    ML-Agents writes them without fsync; a missing one is left to ML-Agents, as before.
    """
    directories = set()
    for path in paths:
        try:
            _fsync(path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            _log().warning("trainstatus: could not sync checkpoint file %s: %s", path, exc)
        directories.add(os.path.dirname(os.path.abspath(path)))
    for directory in directories:
        # Some filesystems refuse a directory fsync; the files themselves are synced.
        with contextlib.suppress(OSError):
            _fsync(directory, directory=True)
    # ML-Agents makes results/<run>/<behavior>/ in a fresh run: that folder is an entry of the one
    # above it, lost with its checkpoints on a power loss until that one is synced too.
    try:
        sync_folders_above(directories, GlobalTrainingStatus.store().path)
    except OSError as exc:
        _log().warning("trainstatus: could not sync the folders above checkpoint files %s: %s",
                       ", ".join(sorted(directories)), exc)


def _load_state(path: str) -> None:
    """ML-Agents' ``load_state(path)`` (``--resume``): bind to ``path``, reading it through trainstatus."""
    if not GlobalTrainingStatus._bound_to(path):
        _unbind_other_run()
        GlobalTrainingStatus.load_state(path)


def _save_state(path: str) -> None:
    """ML-Agents' ``save_state(path)`` at exit: the bound file is rewritten as it stands."""
    GlobalTrainingStatus.save_state(path)


def _unbind_other_run() -> None:
    """Forget a status bound to another file (an earlier run in this process), keep the options."""
    if GlobalTrainingStatus._bound:
        options = dict(GlobalTrainingStatus._options)
        GlobalTrainingStatus.reset()
        GlobalTrainingStatus._configure(**options)


def _log() -> logging.Logger:
    """A logger ML-Agents prints (it configures its loggers itself; trainstatus never does)."""
    global _logger
    if _logger is None:
        from mlagents_envs.logging_util import get_logger

        _logger = get_logger("trainstatus.mlagents")
    return _logger
