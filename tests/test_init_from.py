"""``model.init_from``: a run that starts from another run's trained weights (fine-tuning), with
a fresh optimiser, schedule and step count. Real ``ktframe fit`` runs of the TINY setting."""

from __future__ import annotations

from pathlib import Path

import torch
from test_training import fit, ok, one_line_error, summary

from ktframe.learning.checkpoint_io import model_weights, read_checkpoint


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return model_weights(read_checkpoint(checkpoint))


def test_a_run_starts_from_the_weights_of_another(tmp_path):
    ok(fit(tmp_path, "name=first", "trainer.max_steps=10", logger=None))
    trained = tmp_path / "runs" / "first" / "checkpoints" / "last.ckpt"
    # One step at a learning rate too small to move a weight: the run ends where it started.
    still = ["trainer.max_steps=1", "trainer.val_every=1", "optim.lr=1e-30", "trainer.seed=5"]
    ok(fit(tmp_path, "name=tuned", f"model.init_from={trained}", *still, logger=None))
    ok(fit(tmp_path, "name=fresh", *still, logger=None))
    start, tuned, fresh = (weights(tmp_path / "runs" / name / "checkpoints" / "last.ckpt") for name in ("first", "tuned", "fresh"))
    assert tuned.keys() == start.keys()
    assert all(torch.equal(tuned[key], start[key]) for key in start)
    assert not all(torch.equal(fresh[key], start[key]) for key in start)
    # A fresh step count: the tuned run took its one step, not 10 + 1.
    assert summary(tmp_path / "runs" / "tuned")["global_step"] == 1


def test_an_init_from_that_is_missing_or_does_not_fit_is_one_line(tmp_path):
    missing = tmp_path / "nowhere.ckpt"
    line = one_line_error(fit(tmp_path, f"model.init_from={missing}", logger=None))
    assert str(missing) in line, line
    assert not (tmp_path / "runs").exists()
    ok(fit(tmp_path, "name=d2", "trainer.max_steps=2", "trainer.val_every=2", logger=None))
    other = tmp_path / "runs" / "d2" / "checkpoints" / "last.ckpt"
    line = one_line_error(fit(tmp_path, "name=d3", "data.d=3", f"model.init_from={other}", logger=None))
    assert str(other) in line and "do not fit the model" in line, line
    assert not (tmp_path / "runs" / "d3").exists()
