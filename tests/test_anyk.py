"""One model for every k up to a maximum: index slots (``SlotIndex``), the ``any_k`` option of the
``lloyd`` and ``learned`` variants, and training on tasks of many k and n (``data.k_range``,
``data.n_range``)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf
from test_training import fit, ok, one_line_error

import ktframe
from ktframe.components.embeddings import OneHot, SlotIndex
from ktframe.core import reference
from ktframe.core.errors import InputError
from ktframe.learning.config import load_config
from ktframe.learning.data import draw, draw_step
from ktframe.learning.module import model_from_config


def tasks(k: int, seed: int = 0, B: int = 4, n: int = 48, d: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.randn(B, n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return X, X[:, :k].clone()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "plain"])
@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("k", [1, 2, 5, 8])
def test_lloyd_over_eight_slots_equals_lloyd_built_for_k(k: int, mode: str, fast: bool) -> None:
    # The padded model leaves the slots a task does not use at 0 in every token: the same
    # iterations as the model built for k, bit for bit, whichever slots the centers are given.
    X, C0 = tasks(k, seed=k)
    padded = ktframe.build_model("lloyd", d=3, k=8, n_layers=7, any_k=True, fast=fast, dtype=torch.float64)
    exact = ktframe.build_model("lloyd", d=3, k=k, n_layers=7, fast=fast, dtype=torch.float64)
    padded.train(mode == "train")
    torch.manual_seed(k)
    with torch.no_grad():
        ours, theirs = padded(X, C0), exact(X, C0)
    assert torch.equal(ours.trajectory, theirs.trajectory)
    assert torch.equal(ours.n_iter, theirs.n_iter)
    torch.testing.assert_close(ours.centers, reference.lloyd(X, C0, 7).centers, rtol=0, atol=1e-12)
    assert torch.equal(ours.assignments, reference.assign(X, ours.centers))


def test_slots_are_the_first_ones_in_eval_and_a_random_distinct_subset_in_training() -> None:
    embedding = SlotIndex(6).eval()
    C = torch.randn(500, 4, 2)
    slots = embedding.slots(500, 4, C.device)
    assert torch.equal(slots, torch.arange(4).expand(500, 4))
    embedding.train()
    torch.manual_seed(0)
    drawn = embedding.slots(500, 4, C.device)
    assert all(len(set(row.tolist())) == 4 for row in drawn)  # a center per slot
    assert int(drawn.min()) == 0 and int(drawn.max()) == 5
    counts = torch.bincount(drawn.flatten(), minlength=6).float()
    assert counts.min() > 0.8 * counts.mean()  # every slot used about as often (4/6 of tasks each)
    tokens = embedding.centers(C)
    assert tokens.shape == (500, 4, 2 + 6 + 1)
    assert torch.equal(tokens[..., :2], C)
    assert torch.equal(tokens[..., 2:8].sum(-1), torch.ones(500, 4))  # one-hot
    assert torch.all(tokens[..., -1] == 4 / 6)  # the task's k
    plain = SlotIndex(6, k_feature=False)
    assert plain.width(2, 6) == OneHot().width(2, 6) and not OneHot.any_k and SlotIndex.any_k


def test_an_any_k_model_takes_up_to_its_k_centers_and_says_so_beyond() -> None:
    model = ktframe.build_model("learned", d=3, k=5, n_layers=1, any_k=True)
    X, _ = tasks(1)
    for k in (1, 3, 5):
        assert model(X.float(), X[:, :k].float()).centers.shape == (4, k, 3)
    with pytest.raises(InputError, match=r"C0 holds 6 centers per task but the model takes 1 to 5"):
        model(X.float(), X[:, :6].float())
    one_k = ktframe.build_model("learned", d=3, k=5, n_layers=1)
    with pytest.raises(InputError, match=r"C0 must have shape \(4, 5, 3\)"):
        one_k(X.float(), X[:, :3].float())
    with pytest.raises(InputError, match="any_k=True extends the one-hot index embedding; got embedding='none'"):
        ktframe.build_model("learned", d=3, k=5, n_layers=1, any_k=True, embedding="none")


def test_without_ranges_a_step_draws_what_it_always_drew() -> None:
    cfg = load_config(["data.n=20", "data.k=3", "data.d=2", "data.batch_size=4"]).data
    step = draw_step(cfg, torch.Generator().manual_seed(5))
    plain = draw(cfg, 4, torch.Generator().manual_seed(5))
    assert all(torch.equal(a, b) for a, b in zip(step, plain))


def test_ranges_draw_each_steps_k_and_n_within_them() -> None:
    cfg = load_config(["data.n=40", "data.k=3", "data.d=2", "data.batch_size=2", "data.k_range=[2,5]", "data.n_range=[10,40]"]).data
    shapes = set()
    for seed in range(60):
        X, C0, labels = draw_step(cfg, torch.Generator().manual_seed(seed))
        k, n = C0.shape[1], X.shape[1]
        assert 2 <= k <= 5 and 10 <= n <= 40 and labels.shape == (2, n) and int(labels.max()) < k
        shapes.add((k, n))
    assert {k for k, _ in shapes} == {2, 3, 4, 5} and len({n for _, n in shapes}) > 10


def test_model_from_config_builds_for_the_largest_k_and_refuses_a_one_k_model() -> None:
    cfg = OmegaConf.to_container(load_config(["preset=anyk", "data.d=4"]), resolve=True)
    model = model_from_config(cfg)
    assert model.k == 16 and model.embedding.any_k
    cfg["model"]["options"] = {}
    with pytest.raises(InputError, match=r"data.k_range=\[2, 16\] trains on tasks of many k, .* expected model.options.any_k=true"):
        model_from_config(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.k_range=[2,40]"], "a training task may have k=40 clusters but only n=32 points"),
        (["data.k_range=[4,6]"], "'data.k'=3 (the validation tasks' k) lies outside data.k_range=[4, 6]"),
        (["data.n_range=[8]"], "'data.n_range' must be null or [lo, hi]"),
    ],
)
def test_bad_ranges_are_config_errors(overrides, message) -> None:
    with pytest.raises(InputError) as error:
        load_config(["data.n=32", "data.k=3", *overrides])
    assert message in str(error.value)


def test_a_range_for_a_one_k_model_is_one_line_before_training(tmp_path) -> None:
    line = one_line_error(fit(tmp_path, "data.k_range=[2,4]"))
    assert "data.k_range=[2, 4] trains on tasks of many k" in line and "expected model.options.any_k=true" in line
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_any_k_run_trains_on_many_k_and_validates_at_data_k(tmp_path) -> None:
    ok(fit(tmp_path, "data.k_range=[2,4]", "data.n_range=[16,32]", "model.options={any_k: true}", "name=anyk"))
    checkpoint = torch.load(tmp_path / "runs" / "anyk" / "checkpoints" / "last.ckpt", weights_only=True)
    width = 2 + 4 + 1  # d + slots for the largest k + the k coordinate
    assert checkpoint["state_dict"]["model.layers.0.point_cross.q.weight"].shape == (width, width)
    from ktframe.evaluation.evaluate import load_checkpoint

    _, model = load_checkpoint(tmp_path / "runs" / "anyk" / "checkpoints" / "last.ckpt")
    X, _ = tasks(1, B=2, n=32, d=2)
    for k in (2, 3, 4):
        assert model(X.float(), X[:, :k].float(), n_steps=3, reembed=True).centers.shape == (2, k, 2)
