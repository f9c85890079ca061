"""The task distribution's switches (``ktframe.core.tasks.TaskDistribution``, the ``data.*``
keys of a training config, the ``general`` preset): with every switch off the paper's tasks, bit
for bit; each switch doing what it says; the authors' log-normal family."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ktframe.core import reference
from ktframe.core.errors import InputError
from ktframe.core.tasks import FAMILIES, TaskDistribution, isotropic_scale, minmax_scale, mixture
from ktframe.learning.config import load_config
from ktframe.learning.data import draw, draw_step

SHAPES = [(3, 50, 4, 5), (8, 64, 32, 10), (2, 7, 1, 3)]


def paper_tasks(batch, n, d, k, generator, dtype=torch.float32, family="gaussian"):
    """The paper's generator as it is written in its own words: means uniform in the unit cube,
    labels uniform, the mean plus 0.1 times the noise, each coordinate min-max scaled."""
    means = torch.rand(batch, k, d, generator=generator, dtype=dtype)
    labels = torch.randint(k, (batch, n), generator=generator)
    if family == "gaussian":
        noise = torch.randn(batch, n, d, generator=generator, dtype=dtype)
    else:  # laplace, by its inverse CDF
        u = torch.rand(batch, n, d, generator=generator, dtype=dtype).clamp(torch.finfo(dtype).eps, 1 - torch.finfo(dtype).eps) - 0.5
        noise = -torch.sign(u) * torch.log1p(-2 * u.abs())
    X = means[torch.arange(batch)[:, None], labels] + 0.1 * noise
    low = X.amin(dim=1, keepdim=True)
    span = X.amax(dim=1, keepdim=True) - low
    return (X - low) / torch.where(span > 0, span, torch.ones_like(span)), labels


def draws(distribution: TaskDistribution, batch=6, n=400, d=4, k=3, seed=0, dtype=torch.float64):
    return distribution.draw(batch, n, d, k, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def component_stats(X, labels, k):
    """Per task and component: the points' mean and their deviations from it."""
    return [[X[b][labels[b] == j] for j in range(k)] for b in range(X.shape[0])]


@pytest.mark.parametrize("family", ["gaussian", "laplace"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", SHAPES)
def test_with_every_switch_off_the_paper_tasks_bit_for_bit(shape, dtype, family) -> None:
    batch, n, d, k = shape
    ours = mixture(batch, n, d, k, family=family, generator=torch.Generator().manual_seed(11), dtype=dtype)
    theirs = paper_tasks(batch, n, d, k, torch.Generator().manual_seed(11), dtype, family)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])


def test_the_paper_preset_draws_the_paper_tasks_and_its_initial_centers() -> None:
    cfg = load_config(["preset=paper"]).data
    assert TaskDistribution.of(cfg) == TaskDistribution()
    X, C0, labels = draw_step(cfg, torch.Generator().manual_seed(3))
    generator = torch.Generator().manual_seed(3)
    theirs, their_labels = paper_tasks(32, 512, 32, 10, generator)
    assert torch.equal(X, theirs) and torch.equal(labels, their_labels)
    assert torch.equal(C0, reference.random_points(theirs, 10, generator))  # then the initial centers, from the same generator


def test_the_authors_log_normal_is_the_exponential_of_a_normal_around_the_mean() -> None:
    X, labels = mixture(2, 300, 3, 4, family="lognormal", scaling="none", generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    g = torch.Generator().manual_seed(5)
    means = torch.rand(2, 4, 3, generator=g, dtype=torch.float64)
    assert torch.equal(labels, torch.randint(4, (2, 300), generator=g))
    z = torch.randn(2, 300, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(X, (means[torch.arange(2)[:, None], labels] + 0.1 * z).exp(), rtol=1e-15, atol=0)
    # The old family, under its own name: the mean plus a shifted log-normal noise.
    Y, _ = mixture(2, 300, 3, 4, family="lognormal-noise", scaling="none", generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    torch.testing.assert_close(Y, means[torch.arange(2)[:, None], labels] + 0.1 * (z.exp() - 1), rtol=1e-15, atol=0)


def skewness(x: torch.Tensor) -> float:
    centered = x - x.mean()
    return float(centered.pow(3).mean() / centered.pow(2).mean().pow(1.5))


def test_log_normal_clusters_are_nearly_symmetric_and_log_normal_noise_is_one_sided() -> None:
    # One component: the authors' cluster, exp of N(m, 0.1^2), has skewness about 0.3; the
    # shifted log-normal noise about 6.2 (that of a log-normal of sigma 1).
    for family, low, high in [("lognormal", 0.2, 0.45), ("lognormal-noise", 4.0, 8.0), ("gaussian", -0.05, 0.05)]:
        X, _ = mixture(1, 200_000, 1, 1, family=family, scaling="none", generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        assert low < skewness(X.flatten()) < high, family


def test_student_t_has_three_degrees_of_freedom() -> None:
    X, _ = mixture(1, 400_000, 1, 1, family="student-t", scaling="none", std=1.0, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    x = (X - X.median()).flatten().abs()
    # P(|T3| > 1) = 0.3910, P(|T3| > 3) = 0.0577, P(|T3| > 10) = 0.00212
    for t, p in [(1.0, 0.3910), (3.0, 0.0577), (10.0, 0.00212)]:
        assert abs(float((x > t).double().mean()) - p) < 4 * (p * (1 - p) / x.numel()) ** 0.5 + 1e-3 * p, t


def test_families_give_each_task_one_family_of_the_list() -> None:
    X, _ = draws(TaskDistribution(families=("gaussian", "lognormal"), scaling="none"), batch=40, n=200, d=2)
    # exp(mean + noise) lies above exp(-0.6) > 0.5; a Gaussian task has points below 0.3.
    lognormal = X.flatten(1).amin(dim=1) > 0.5
    assert 5 < int(lognormal.sum()) < 35
    assert bool((X[~lognormal].flatten(1).amin(dim=1) < 0.3).all())
    one = dataclasses.replace(TaskDistribution(families=("laplace",)), scaling="none")
    assert torch.isfinite(draws(one)[0]).all()


def test_a_family_at_evaluation_replaces_the_list() -> None:
    cfg = load_config(["preset=general", "data.d=4", "data.subspace=[4,4]", "data.outliers=null"]).data
    X, _, _ = draw(cfg, 8, torch.Generator().manual_seed(0), n=64, k=3, family="lognormal")
    # Every task exp(mean + noise), then scaled: no task keeps its family drawn from the list.
    expected = dataclasses.replace(TaskDistribution.of(cfg), family="lognormal", families=None)
    assert torch.equal(X, expected.draw(8, 64, 4, 3, generator=torch.Generator().manual_seed(0))[0])
    # The config's own family changes nothing: a general model is evaluated on its distribution.
    same = draw(cfg, 8, torch.Generator().manual_seed(0), n=64, k=3, family=cfg.family)
    plain = draw(cfg, 8, torch.Generator().manual_seed(0), n=64, k=3)
    assert torch.equal(same[0], plain[0])


def test_std_range_draws_each_tasks_spread_log_uniformly() -> None:
    X, _ = draws(TaskDistribution(std_range=(0.01, 1.0), scaling="none"), batch=30, n=2000, d=3, k=1)
    spread = X.std(dim=1).mean(dim=1)
    assert bool((spread > 0.009).all() and (spread < 1.1).all())
    logs = spread.log10()
    assert float(logs.min()) < -1.3 and float(logs.max()) > -0.7  # spread over the decades, not one value


def test_weight_concentration_makes_cluster_sizes_unequal() -> None:
    def spread_of_sizes(distribution):
        _, labels = draws(distribution, batch=50, n=1000, k=8)
        sizes = torch.stack([torch.bincount(row, minlength=8) for row in labels]).double()
        assert bool((sizes.sum(dim=1) == 1000).all())
        return float((sizes.std(dim=1) / sizes.mean(dim=1)).mean())

    equal = spread_of_sizes(TaskDistribution())
    assert equal < 0.15  # multinomial noise alone
    assert spread_of_sizes(TaskDistribution(weight_concentration=(0.2, 0.2))) > 1.2  # Dirichlet(0.2): cv about 1.5
    assert 0.3 < spread_of_sizes(TaskDistribution(weight_concentration=(5.0, 5.0))) < 0.6  # about 0.42


def test_component_and_axis_scales_stretch_each_components_noise_within_their_ranges() -> None:
    plain = TaskDistribution(scaling="none")
    X0, labels = draws(plain, batch=4, n=600, k=3)
    mu = torch.rand(4, 3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # the means: the first draw
    for switch, (lo, hi) in [("component_scale", (0.2, 5.0)), ("axis_scale", (0.3, 3.0))]:
        X, same_labels = draws(dataclasses.replace(plain, **{switch: (lo, hi)}), batch=4, n=600, k=3)
        assert torch.equal(labels, same_labels)
        ratios = []
        for b in range(4):
            for j in range(3):
                mine = labels[b] == j
                ratio = (X[b][mine] - mu[b, j]) / (X0[b][mine] - mu[b, j])  # (points, d): one factor per axis
                assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-9)
                ratios.append(ratio[0])
                if switch == "component_scale":  # one factor for every axis
                    assert torch.allclose(ratio[0], ratio[0, :1].expand(4), rtol=1e-9)
        factors = torch.stack(ratios)
        assert bool((factors >= lo - 1e-9).all() and (factors <= hi + 1e-9).all())
        assert float(factors.max() / factors.min()) > 2


def test_rotations_keep_each_points_distance_to_its_mean_and_correlate_coordinates() -> None:
    plain = TaskDistribution(scaling="none")
    X0, labels = draws(plain, batch=3, n=3000, d=5, k=2)
    X, _ = draws(dataclasses.replace(plain, rotate=True), batch=3, n=3000, d=5, k=2)
    mu = torch.rand(3, 2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    centers = mu[torch.arange(3)[:, None], labels]
    torch.testing.assert_close((X - centers).norm(dim=-1), (X0 - centers).norm(dim=-1), rtol=1e-12, atol=1e-15)
    assert not torch.allclose(X, X0)
    # Anisotropic and turned: each component's covariance has large off-diagonal terms.
    Y, labels = draws(TaskDistribution(scaling="none", axis_scale=(0.1, 3.0), rotate=True), batch=3, n=4000, d=5, k=2)
    for b in range(3):
        for j in range(2):
            cov = torch.cov(Y[b][labels[b] == j].T)
            corr = cov / cov.diagonal().sqrt().outer(cov.diagonal().sqrt())
            assert float((corr - torch.eye(5, dtype=corr.dtype)).abs().max()) > 0.3
    Z, labels = draws(TaskDistribution(scaling="none", axis_scale=(0.1, 3.0)), batch=3, n=4000, d=5, k=2)
    cov = torch.cov(Z[0][labels[0] == 0].T)
    corr = cov / cov.diagonal().sqrt().outer(cov.diagonal().sqrt())
    assert float((corr - torch.eye(5, dtype=corr.dtype)).abs().max()) < 0.1  # axis-aligned without rotations


def test_dim_scale_stretches_each_coordinate_and_minmax_scaling_undoes_it() -> None:
    plain = TaskDistribution(scaling="none")
    X0, _ = draws(plain)
    X, _ = draws(dataclasses.replace(plain, dim_scale=(0.1, 1.0)))
    factor = X / X0
    assert torch.allclose(factor, factor[:, :1].expand_as(factor), rtol=1e-12)  # one per task and coordinate
    assert bool((factor >= 0.1 - 1e-12).all() and (factor <= 1 + 1e-12).all()) and float(factor.min()) < 0.5
    torch.testing.assert_close(draws(TaskDistribution(dim_scale=(0.1, 1.0)))[0], draws(TaskDistribution())[0], rtol=0, atol=1e-12)
    X, _ = draws(TaskDistribution(dim_scale=(0.1, 1.0), scaling="isotropic"))
    spans = X.amax(dim=1) - X.amin(dim=1)
    assert torch.allclose(spans.amax(dim=1), torch.ones(6, dtype=X.dtype)) and float(spans.amin()) < 0.5  # kept


@pytest.mark.parametrize("scaling", ["minmax", "isotropic", "none"])
def test_subspace_puts_each_task_in_its_first_coordinates_and_zeros_the_rest(scaling) -> None:
    X, _ = draws(TaskDistribution(subspace=(2, 6), scaling=scaling), batch=60, n=50, d=8)
    used = (X != 0).any(dim=1)  # (batch, d)
    widths = used.sum(dim=1)
    assert torch.equal(used, torch.arange(8) < widths.unsqueeze(1))  # the first d' coordinates, then zeros
    assert int(widths.min()) == 2 and int(widths.max()) == 6


def test_outliers_move_the_drawn_fraction_of_points_into_the_bounding_box() -> None:
    plain = TaskDistribution(scaling="none")
    X0, labels = draws(plain, batch=10, n=200)
    X, same = draws(dataclasses.replace(plain, outliers=(0.1, 0.1)), batch=10, n=200)
    moved = (X != X0).any(dim=-1)
    assert torch.equal(moved.sum(dim=1), torch.full((10,), 20)) and torch.equal(labels, same)
    assert bool((X >= X0.amin(dim=1, keepdim=True)).all() and (X <= X0.amax(dim=1, keepdim=True)).all())
    counts = (draws(dataclasses.replace(plain, outliers=(0.0, 0.3)), batch=40, n=200)[0] != draws(plain, batch=40, n=200)[0]).any(-1).sum(1)
    assert int(counts.min()) < 15 and int(counts.max()) > 45 and int(counts.max()) <= 60


def test_isotropic_scaling_keeps_the_geometry_and_makes_the_largest_span_one() -> None:
    X0, _ = draws(TaskDistribution(scaling="none", dim_scale=(0.1, 1.0)))
    X = isotropic_scale(X0)
    low, high = X.amin(dim=1), X.amax(dim=1)
    assert torch.allclose(low, torch.zeros_like(low)) and torch.allclose(high.amax(dim=1), torch.ones(6, dtype=X.dtype))
    assert float(high.amin()) < 0.5  # the narrow coordinates stay narrow
    factor = (X0.amax(dim=1) - X0.amin(dim=1)).amax(dim=1)
    torch.testing.assert_close(torch.cdist(X, X) * factor[:, None, None], torch.cdist(X0, X0))  # distances by one factor
    spans = minmax_scale(X0).amax(dim=1) - minmax_scale(X0).amin(dim=1)
    assert torch.allclose(spans, torch.ones_like(spans))


def test_the_general_preset_draws_tasks_of_every_switch_reproducibly() -> None:
    cfg = load_config(["preset=general"]).data
    tasks = TaskDistribution.of(cfg)
    assert tasks.rotate and tasks.scaling == "rms" and tasks.components == (1, 16) and all(family in FAMILIES for family in tasks.families)
    shapes = set()
    for seed in range(4):
        X, C0, labels = draw_step(cfg, torch.Generator().manual_seed(seed))
        again = draw_step(cfg, torch.Generator().manual_seed(seed))
        assert all(torch.equal(a, b) for a, b in zip((X, C0, labels), again))
        n, k = X.shape[1], C0.shape[1]
        assert X.shape == (32, n, 32) and C0.shape == (32, k, 32) and 128 <= n <= 1024 and 2 <= k <= 16
        # The RMS frame: each task's mean at 0, its points at RMS distance 1 from it.
        rms = X.square().sum(dim=-1).mean(dim=1).sqrt()
        assert torch.isfinite(X).all() and torch.allclose(X.mean(dim=1), torch.zeros(32, 32), atol=1e-5) and torch.allclose(rms, torch.ones(32))
        shapes.add((n, k))
    assert len(shapes) == 4
    other = draw_step(cfg, torch.Generator().manual_seed(99))[0]
    assert other.shape != X.shape or not torch.equal(other, X)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.subspace=[0,3]", "config key 'data.subspace' must be null or [lo, hi], integers >= 1 with lo <= hi; got [0, 3]"),
        ("data.subspace=[2,40]", "config key 'data.subspace' must be null or [lo, hi] with hi <= d=8; got [2, 40]"),
        ("data.outliers=[0.1,1.5]", "config key 'data.outliers' must be null or [lo, hi], fractions in [0, 1) with lo <= hi; got [0.1, 1.5]"),
        ("data.std_range=[0.3,0.1]", "config key 'data.std_range' must be null or [lo, hi], positive numbers with lo <= hi; got [0.3, 0.1]"),
        ("data.axis_scale=[0,2]", "config key 'data.axis_scale' must be null or [lo, hi], positive numbers"),
        ("data.families=[gaussian,gauss]", "config key 'data.families' must be null or a non-empty list of families, each one of gaussian, cauchy"),
        ("data.families=[]", "config key 'data.families' must be null or a non-empty list"),
        ("data.scaling=unit", "config key 'data.scaling' must be one of minmax, isotropic, rms, none; got 'unit'"),
        ("data.warm_start=[3,1]", "config key 'data.warm_start' must be null or [lo, hi], integers with 0 <= lo <= hi; got [3, 1]"),
    ],
)
def test_a_bad_switch_is_a_one_line_error_naming_its_key(override, message) -> None:
    with pytest.raises(InputError) as raised:
        load_config([override])
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_components_draw_each_tasks_number_of_clusters_whatever_k() -> None:
    for weights in (None, (0.5, 0.5)):
        X, labels = draws(TaskDistribution(components=(1, 6), weight_concentration=weights), batch=40, n=300, k=3)
        used = torch.tensor([len(row.unique()) for row in labels])
        assert int(used.min()) == 1 and int(used.max()) == 6 and X.shape == (40, 300, 4)
    _, labels = draws(TaskDistribution(components=(5, 5), sizes="equal"), batch=2, n=12, k=2)
    assert torch.equal(labels, torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 3, 3, 4, 4]).expand(2, 12))


def test_rms_scaling_centers_each_task_at_unit_spread() -> None:
    X0, _ = draws(TaskDistribution(scaling="none", std_range=(0.01, 1.0)))
    X, _ = draws(TaskDistribution(scaling="rms", std_range=(0.01, 1.0)))
    torch.testing.assert_close(X.mean(dim=1), torch.zeros(6, 4, dtype=X.dtype), rtol=0, atol=1e-12)
    torch.testing.assert_close(X.square().sum(dim=-1).mean(dim=-1), torch.ones(6, dtype=X.dtype))
    factor = (X0 - X0.mean(dim=1, keepdim=True)).norm(dim=-1).square().mean(dim=-1).sqrt()
    torch.testing.assert_close(torch.cdist(X, X) * factor[:, None, None], torch.cdist(X0, X0))


def test_a_warm_start_moves_each_steps_initial_centers_by_lloyd_steps() -> None:
    cold = load_config(["preset=anyk"]).data
    for steps in (0, 3):
        warm = load_config(["preset=anyk", f"data.warm_start=[{steps},{steps}]"]).data
        X, C0, labels = draw_step(cold, torch.Generator().manual_seed(5))
        X2, C2, labels2 = draw_step(warm, torch.Generator().manual_seed(5))
        assert torch.equal(X, X2) and torch.equal(labels, labels2)
        torch.testing.assert_close(C2, reference.lloyd(X, C0, steps).centers, rtol=0, atol=0)
        assert torch.equal(C2, C0) == (steps == 0)


def test_an_evaluation_on_another_presets_tasks_draws_that_presets_tasks() -> None:
    from omegaconf import OmegaConf

    from ktframe.evaluation.evaluate import eval_config
    from ktframe.learning.config import to_dict

    general = to_dict(load_config(["preset=general"]))
    moved = eval_config(general, ["eval.task_preset=anyk", "eval.ks=[5]"])
    anyk = load_config(["preset=anyk"]).data
    assert moved["model"] == general["model"] and moved["data"]["d"] == general["data"]["d"]
    tasks = lambda data: draw(data, 3, torch.Generator().manual_seed(5), n=64, k=5)
    drawn = tasks(OmegaConf.create(moved["data"]))
    assert all(torch.equal(a, b) for a, b in zip(drawn, tasks(anyk)))
    assert not torch.equal(drawn[0], tasks(OmegaConf.create(general["data"]))[0])
    with pytest.raises(InputError, match="unknown preset 'anyq'"):
        eval_config(general, ["eval.task_preset=anyq"])
