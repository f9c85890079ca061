"""What a run writes into its checkpoints holds paths relative to its run folder, not the absolute
paths of the machine it ran on: a run folder can be copied, committed or moved and read as it was.

- :func:`stored_config`: the config the checkpoints (and the loggers' hyperparameters) keep, its
  ``root``, ``resume`` and ``model.init_from`` relative to the run folder.
- :class:`RunCheckpoint`: Lightning's ``ModelCheckpoint``, whose state in a checkpoint (its folder,
  the best and last checkpoints' paths) is relative to the run folder and read back against the
  run folder where the checkpoint now is, so that a moved run resumes knowing its best score.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

# The keys of ModelCheckpoint.state_dict() that hold one path each ("" or None: none yet).
_PATHS = ("dirpath", "best_model_path", "kth_best_model_path", "last_model_path")


def relative(path: str | Path, run_dir: str | Path) -> str:
    """``path`` relative to the run folder ``run_dir``, with forward slashes."""
    return Path(os.path.relpath(path, run_dir)).as_posix()


def stored_config(config: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """``config`` with its paths relative to ``run_dir`` (``resume=auto`` is no path)."""
    config["root"] = relative(config["root"], run_dir)
    if config.get("resume") not in (None, "auto"):
        config["resume"] = relative(config["resume"], run_dir)
    model = config.get("model") or {}
    if model.get("init_from"):
        model["init_from"] = relative(model["init_from"], run_dir)
    return config


class RunCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` (its ``dirpath`` the run folder's ``checkpoints/``) whose saved state
    names its paths relative to the run folder. A state saved with absolute paths (an older
    checkpoint) is read as Lightning reads it. A resumed run's ``checkpoints/`` holds its own
    checkpoints: Lightning's warning that the folder is not empty is held back."""

    def setup(self, trainer, pl_module, stage: str) -> None:
        # A fit into a folder holding another run is refused before the Trainer starts
        # (folders.own_run_folder), so files here are this run's own, resumed. Lightning has no
        # argument for this warning, only the warnings module (its "Warnings" page); the filter
        # lasts for this call alone.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty", category=UserWarning)
            super().setup(trainer, pl_module, stage)

    def _run(self) -> Path:
        return Path(self.dirpath).parent

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        run = self._run()
        state.update({key: relative(state[key], run) for key in _PATHS if state.get(key)})
        state["best_k_models"] = {relative(path, run): score for path, score in state["best_k_models"].items()}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        run = self._run()
        absolute = lambda path: path if not path or os.path.isabs(path) else str(run / path)  # noqa: E731
        state = {**state_dict, **{key: absolute(state_dict[key]) for key in _PATHS if key in state_dict}}
        if "best_k_models" in state_dict:
            state["best_k_models"] = {absolute(path): score for path, score in state_dict["best_k_models"].items()}
        super().load_state_dict(state)
