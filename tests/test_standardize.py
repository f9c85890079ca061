"""A model's frame (``KMeansTransformer(normalization=Standardize())``): each task seen translated
to its mean and scaled to unit RMS spread, its centers mapped back. Exact k-means (``lloyd``) is
unchanged by it; a learned model becomes the same at every offset and scale; the fast path's plan
runs in the frame as the definition does."""

from __future__ import annotations

import pytest
import torch

import ktframe
from ktframe.core import reference
from ktframe.core.tasks import TaskDistribution
from ktframe.plugin import Standardize


def tasks(batch=4, n=60, d=3, k=3, seed=0):
    X, _ = TaskDistribution(std_range=(0.02, 0.3), scaling="none").draw(batch, n, d, k, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return X * 40 - 7  # far from the unit scale and the origin


def in_frame(X):
    mean = X.mean(dim=1, keepdim=True)
    return mean, (X - mean).square().sum(dim=-1).mean(dim=-1)[:, None, None].sqrt()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
def test_lloyd_in_the_frame_is_lloyd_to_rounding(fast) -> None:
    X = tasks()
    C0 = X[:, :3]
    model = ktframe.build_model("lloyd", d=3, k=3, n_layers=6, fast=fast, dtype=torch.float64)
    framed = ktframe.build_model("lloyd", d=3, k=3, n_layers=6, fast=fast, dtype=torch.float64)
    framed.normalization = Standardize()
    expected, got = model(X, C0), framed(X, C0)
    torch.testing.assert_close(got.trajectory, expected.trajectory, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.trajectory, reference.lloyd(X, C0, 6).trajectory, rtol=1e-12, atol=1e-12)
    assert torch.equal(got.labels, expected.labels) and torch.equal(got.n_iter, expected.n_iter)


def test_a_standardizing_learned_model_is_the_same_at_every_offset_and_scale_fast_or_plain() -> None:
    torch.manual_seed(0)
    options = dict(d=3, k=5, n_layers=1, any_k=True, dtype=torch.float64)
    fast = ktframe.build_model("learned", standardize=True, fast=True, **options).eval()
    plain = ktframe.build_model("learned", standardize=True, fast=False, **options).eval()
    unframed = ktframe.build_model("learned", fast=False, **options).eval()
    plain.load_state_dict(fast.state_dict())
    unframed.load_state_dict(fast.state_dict())
    assert fast.plan is not None and plain.plan is None and "Standardize()" in repr(fast)
    X = tasks()
    C0 = X[:, :4]
    with torch.no_grad():
        ours = fast(X, C0, n_steps=3, reembed=True)
        moved = fast(X * 7 + 3, C0 * 7 + 3, n_steps=3, reembed=True)
        definition = plain(X, C0, n_steps=3, reembed=True)
        mean, rms = in_frame(X)
        by_hand = unframed((X - mean) / rms, (C0 - mean) / rms, n_steps=3, reembed=True)
        without = unframed(X, C0, n_steps=3, reembed=True)
    torch.testing.assert_close(ours.trajectory, definition.trajectory)
    torch.testing.assert_close(ours.trajectory, by_hand.trajectory * rms.unsqueeze(1) + mean.unsqueeze(1))
    torch.testing.assert_close(moved.trajectory, ours.trajectory * 7 + 3)
    torch.testing.assert_close(ours.trajectory[:, 0], C0)
    assert not torch.allclose(without.centers, ours.centers, atol=1e-3)


def test_the_frame_adds_no_weights_so_checkpoints_load_either_way() -> None:
    torch.manual_seed(0)
    framed = ktframe.build_model("learned", d=3, k=4, n_layers=1, standardize=True)
    assert framed.state_dict().keys() == ktframe.build_model("learned", d=3, k=4, n_layers=1).state_dict().keys()


def test_a_task_of_one_repeated_point_is_only_moved() -> None:
    X = torch.full((1, 5, 2), 3.0, dtype=torch.float64)
    shift, scale = Standardize()(X)
    assert torch.equal(shift, X[:, :1]) and torch.equal(scale, torch.ones(1, 1, 1, dtype=torch.float64))
