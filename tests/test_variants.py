"""The five variant plugins behave as the classical algorithms they claim to be.

Beyond the layer-by-layer agreement with their references (``ktframe verify``, and the
conformance suite in test_conformance.py), each variant's defining behaviour is checked here
against numbers worked out independently of both the model and the plugin's reference: soft
k-means against its closed form, the trimming rule on a hand-made example, sparsemax's linear
weights, an outlier that must not pull any center, centers on the sphere, medoids that are data
points and nearly as good as PAM's.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import kmedoids
import numpy as np
import pytest
import torch

import ktframe
from ktframe.core import reference
from ktframe.core.errors import InputError
from ktframe.core.reference import random_points, sqdist
from ktframe.core.tasks import mixture
from ktframe.plugin.build import get_variant
from ktframe.plugin.manager import registry


def run(variant, X, C0, n_layers, **options):
    model = ktframe.build_model(variant, d=X.shape[-1], k=C0.shape[1], n_layers=n_layers, dtype=X.dtype, **options)
    with torch.no_grad():
        return model(X, C0)


def center_weights(variant, X, C0, n_layers, **options):
    """The center-update attention map ``(B, k, n)`` of every layer, as the model applied it."""
    model = ktframe.build_model(variant, d=X.shape[-1], k=C0.shape[1], n_layers=n_layers, dtype=X.dtype, **options)
    points, centers = model.embedding.points(X, model.k), model.embedding.centers(C0)
    maps = []
    with torch.no_grad():
        for step in range(n_layers):
            layer = model.layer(step)
            before = centers.clone()
            points, centers = layer(points, centers)
            maps.append(layer.center_cross.weights(before, points))
    return maps


def problem(seed, B=2, n=120, d=2, k=4):
    g = torch.Generator().manual_seed(seed)
    X, _ = mixture(B, n, d, k, generator=g, dtype=torch.float64)
    return X, random_points(X, k, g)


# --- soft ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [0.5, 10.0, 300.0, 5000.0])
def test_soft_equals_the_closed_form(gamma):
    X, C0 = problem(1)
    got = run("soft", X, C0, 4, gamma=gamma)
    # Soft k-means, written out: responsibilities r_ij ∝ exp(−γ‖x_i − c_j‖²), c_j = Σ r_ij x_i / Σ r_ij.
    C, trajectory = C0, [C0]
    for _ in range(4):
        r = torch.softmax(-gamma * ((X[:, :, None] - C[:, None]) ** 2).sum(-1), dim=-1)
        C = torch.einsum("bnk,bnd->bkd", r, X) / r.sum(dim=1)[..., None]
        trajectory.append(C)
    torch.testing.assert_close(got.trajectory, torch.stack(trajectory, dim=1), atol=1e-10, rtol=0)
    torch.testing.assert_close(got.assignments, r, atol=1e-10, rtol=0)
    # ... and the plugin's declared reference is the same algorithm.
    want = get_variant("soft").run_reference(X, C0, 4, gamma)
    torch.testing.assert_close(got.trajectory, want.trajectory, atol=1e-10, rtol=0)
    if gamma < 100:
        assert not bool(((got.assignments == 0) | (got.assignments == 1)).all())  # really soft


def test_soft_tends_to_lloyd_as_gamma_grows():
    X, C0 = problem(3, n=200)
    lloyd = reference.lloyd(X, C0, 6)
    gammas = [1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6, 1e7]
    errors = [(run("soft", X, C0, 6, gamma=g).trajectory - lloyd.trajectory).abs().max().item() for g in gammas]
    assert errors[0] > 0.1  # far from Lloyd when soft ...
    assert all(b <= a for a, b in zip(errors, errors[1:])), errors  # ... and nearer at every larger gamma
    assert errors[-1] < 1e-9, errors
    hard = run("soft", X, C0, 6, gamma=math.inf)
    torch.testing.assert_close(hard.trajectory, lloyd.trajectory, atol=1e-12, rtol=0)
    assert torch.equal(hard.labels, lloyd.labels)


# --- spherical -----------------------------------------------------------------------------------


def test_spherical_centers_have_unit_norm_and_labels_match_the_reference():
    g = torch.Generator().manual_seed(4)
    X = torch.randn(2, 150, 3, generator=g, dtype=torch.float64) * torch.rand(2, 150, 1, generator=g, dtype=torch.float64)
    C0 = torch.randn(2, 4, 3, generator=g, dtype=torch.float64) * 3.0  # anywhere, of any norm
    got = run("spherical", X, C0, 5)
    want = get_variant("spherical").run_reference(X, C0, 5, math.inf)
    norms = got.trajectory[:, 1:].norm(dim=-1)
    torch.testing.assert_close(norms, torch.ones_like(norms), atol=1e-12, rtol=0)
    assert torch.equal(got.labels, want.labels)
    torch.testing.assert_close(got.trajectory, want.trajectory, atol=1e-12, rtol=0)
    # The labels are the cosine arg-max over the centers the model returned one layer earlier.
    cosines = torch.nn.functional.normalize(X, dim=-1) @ got.trajectory[:, -2].transpose(1, 2)
    assert torch.equal(got.labels, cosines.argmax(dim=-1))
    # Scaling a point does not change its cluster: only directions count.
    scaled = run("spherical", X * torch.rand(2, 150, 1, generator=g, dtype=torch.float64).add(0.1) * 7, C0, 5)
    assert torch.equal(scaled.labels, got.labels)


# --- trimmed and robust: the outlier -------------------------------------------------------------


def separated_clusters_with_an_outlier():
    """Three tight clusters of 39 points (so that the trimmed count of the outlier's cluster goes
    from ⌊0.05·39⌋ = 1 to ⌊0.05·40⌋ = 2) and one point 50 away."""
    g = torch.Generator().manual_seed(8)
    means = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    clean = (means[:, None, :] + 0.3 * torch.randn(3, 39, 2, generator=g, dtype=torch.float64)).reshape(1, 117, 2)
    outlier = torch.tensor([[[50.0, 40.0]]], dtype=torch.float64)
    C0 = clean[:, [0, 39, 78]].clone() + 0.2
    return clean, torch.cat([clean, outlier], dim=1), C0


@pytest.mark.parametrize("variant", ["trimmed", "robust"])
def test_a_far_outlier_gets_zero_weight_and_pulls_no_center(variant):
    clean, dirty, C0 = separated_clusters_with_an_outlier()
    layers = 4
    for weights in center_weights(variant, dirty, C0, layers):
        assert bool((weights[..., -1] == 0).all()), weights[..., -1]  # exactly zero, every center, every layer
        assert bool((weights[..., :-1].sum(-1) > 0.999).all())  # the clusters' own points carry the mass
    with_outlier, without = run(variant, dirty, C0, layers), run(variant, clean, C0, layers)
    torch.testing.assert_close(with_outlier.trajectory, without.trajectory, atol=1e-12, rtol=0)
    nearest = sqdist(dirty[:, -1:], with_outlier.trajectory[:, -2]).argmin().item()
    assert with_outlier.labels[0, -1].item() == nearest  # still assigned, to its nearest center
    # Lloyd's mean, by contrast, is dragged about 50/40 toward it.
    pulled = (reference.lloyd(dirty, C0, layers).centers - reference.lloyd(clean, C0, layers).centers).norm(dim=-1).max().item()
    assert pulled > 1.0


def test_trimmed_drops_the_farthest_fraction_of_each_cluster():
    # One cluster, the points 0..19 on a line, the center at 0. trim=0.1 drops ⌊0.1 · 20⌋ = 2
    # points: 19 and 18 first (farthest from 0), then from 8.5 again 19 and 18 (18 is 9.5 away,
    # 0 only 8.5): the center stays at mean(0..17) = 8.5.
    X = torch.arange(20, dtype=torch.float64).reshape(1, 20, 1)
    C0 = torch.zeros(1, 1, 1, dtype=torch.float64)
    got = run("trimmed", X, C0, 3, trim=0.1)
    torch.testing.assert_close(got.trajectory[0, :, 0, 0], torch.tensor([0.0, 8.5, 8.5, 8.5], dtype=torch.float64), atol=1e-14, rtol=0)
    weights = center_weights("trimmed", X, C0, 1, trim=0.1)[0][0, 0]
    assert torch.equal(weights, torch.cat([torch.full((18,), 1 / 18, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)]))
    # trim=0 is Lloyd's algorithm, and the default trims 5%: ⌊0.05 · 20⌋ = 1 point.
    X2, C2 = problem(5)
    torch.testing.assert_close(run("trimmed", X2, C2, 4, trim=0.0).trajectory, reference.lloyd(X2, C2, 4).trajectory, atol=1e-12, rtol=0)
    torch.testing.assert_close(run("trimmed", X, C0, 1).centers[0, 0, 0], torch.tensor(9.0, dtype=torch.float64))  # mean(0..18)


def test_trimmed_refuses_soft_assignments():
    with pytest.raises(InputError, match=r"^trimmed needs hard assignments.*use gamma=inf \(got gamma=100\)$"):
        ktframe.build_model("trimmed", d=2, k=3, n_layers=1, gamma=100.0)
    with pytest.raises(InputError, match=r"^trim must be a fraction in \[0, 1\); got 1.5$"):
        ktframe.build_model("trimmed", d=2, k=3, n_layers=1, trim=1.5)


def test_robust_weights_are_sparsemax_of_the_scaled_distances():
    X, C0 = problem(6, B=1, n=80, d=3, k=3)
    beta = 5.0
    weights = center_weights("robust", X, C0, 1, beta=beta)[0][0]  # (k, n)
    A = reference.assign(X, C0)[0].T  # (k, n): the first layer's clusters
    D = sqdist(X, C0)[0].T
    for j in range(3):
        members = A[j] > 0
        w = weights[j]
        assert bool((w[~members] == 0).all()) and w.sum().item() == pytest.approx(1.0, abs=1e-12)
        support = w > 0
        # sparsemax: w_i = −β D_ij − τ_j on its support (a constant offset), zero beyond it.
        offsets = w[support] + beta * D[j, support]
        torch.testing.assert_close(offsets, offsets[:1].expand_as(offsets), atol=1e-12, rtol=0)
        assert bool((-beta * D[j, members & ~support] <= -offsets[0] + 1e-12).all())
        assert bool((members & ~support).any())  # at beta = 5 the far members of this cluster are cut
    # As beta -> 0 the weights become uniform over the cluster: Lloyd's mean.
    X2, C2 = problem(7)
    torch.testing.assert_close(run("robust", X2, C2, 4, beta=1e-9).trajectory, reference.lloyd(X2, C2, 4).trajectory, atol=1e-6, rtol=0)


def test_robust_default_beta_is_the_authors():
    X, C0 = problem(9, d=3)
    torch.testing.assert_close(run("robust", X, C0, 3).trajectory, run("robust", X, C0, 3, beta=0.01 / math.sqrt(3)).trajectory, atol=0, rtol=0)
    with pytest.raises(InputError, match=r"^beta must be a positive finite number"):
        ktframe.build_model("robust", d=2, k=3, n_layers=1, beta=-1.0)


# --- kmedoids ------------------------------------------------------------------------------------


def is_data_point(X, C):
    return bool((C[:, :, None, :] == X[:, None, :, :]).all(-1).any(-1).all())


def test_kmedoids_centers_are_data_points_and_near_pam():
    """From the same start (PAM's BUILD medoids), the transformer's randomized alternating
    k-medoids reaches an objective within 10% of PAM's BUILD + SWAP solution."""
    for seed in range(6):
        g = torch.Generator().manual_seed(seed)
        X, _ = mixture(1, 60, 2, 3, generator=g, dtype=torch.float64)
        diss = sqdist(X, X)[0].numpy()
        build = kmedoids.pam(diss, 3, max_iter=0, init="build").medoids.astype(np.int64)
        got = run("kmedoids", X, X[:, torch.as_tensor(build)], 8, seed=seed)
        for t in range(9):
            assert is_data_point(X, got.trajectory[:, t]), (seed, t)
        pam = kmedoids.pam(diss, 3, init="build")
        assert reference.objective(X, got.centers).item() <= 1.1 * pam.loss, seed


def test_kmedoids_is_randomized_but_reproducible():
    X, C0 = problem(10, B=1, n=90, k=3)
    runs = {seed: run("kmedoids", X, C0, 5, seed=seed) for seed in range(6)}
    again = run("kmedoids", X, C0, 5, seed=3)
    assert torch.equal(again.trajectory, runs[3].trajectory)  # the same seed, the same medoids
    assert len({tuple(r.trajectory.flatten().tolist()) for r in runs.values()}) > 1  # other seeds, other draws
    assert all(is_data_point(X, r.centers) for r in runs.values())
    # The reference draws the same noise from the same seed.
    want = get_variant("kmedoids").run_reference(X, C0, 5, math.inf, {"seed": 0})
    assert torch.equal(runs[0].trajectory, want.trajectory)


def test_kmedoids_at_zero_temperature_picks_the_point_nearest_the_mean():
    X, C0 = problem(11, B=2, n=70, k=3)
    got = run("kmedoids", X, C0, 1, beta=math.inf)
    A = reference.assign(X, C0)
    means = reference.update(X, A, C0)
    for b in range(2):
        for j in range(3):
            members = A[b, :, j] > 0
            nearest = X[b, members][((X[b, members] - means[b, j]) ** 2).sum(-1).argmin()]
            assert torch.equal(got.centers[b, j], nearest)


# --- the registered components -------------------------------------------------------------------


def test_normmax_map():
    normmax = registry().get("map", "normmax")(trim=0.25)
    logits = torch.tensor([[[3.0, -math.inf, 1.0, 2.0, 0.0, -math.inf], [-math.inf] * 6]], dtype=torch.float64)
    out = normmax(logits)
    # 4 finite keys, ⌊0.25 · 4⌋ = 1 cut: uniform over the three best; the empty query stays.
    assert torch.equal(out.weights[0, 0], torch.tensor([1 / 3, 0, 1 / 3, 1 / 3, 0, 0], dtype=torch.float64))
    assert torch.equal(out.weights[0, 1], torch.zeros(6, dtype=torch.float64))
    assert out.stay.flatten().tolist() == [0.0, 1.0]
    tie = normmax(torch.tensor([[[1.0, 1.0, 1.0, 1.0]]], dtype=torch.float64))
    assert tie.weights.flatten().tolist() == [1 / 3, 1 / 3, 1 / 3, 0.0]  # equal logits at the cut: the lower index stays


def test_sparsemax_map():
    sparsemax = registry().get("map", "sparsemax")()
    out = sparsemax(torch.tensor([[[0.5, 0.0, -math.inf, -2.0], [-math.inf] * 4]], dtype=torch.float64))
    # Projection of (0.5, 0, -2) onto the simplex: τ = -0.25 on the support {0, 1}.
    assert torch.equal(out.weights[0, 0], torch.tensor([0.75, 0.25, 0.0, 0.0], dtype=torch.float64))
    assert out.weights[0, 1].abs().sum().item() == 0.0 and out.stay.flatten().tolist() == [0.0, 1.0]


def test_gumbel_hardmax_samples_proportionally_to_exp_logits():
    gumbel = registry().get("map", "gumbel-hardmax")(seed=123)
    logits = torch.log(torch.tensor([1.0, 2.0, 3.0, 0.0], dtype=torch.float64)).expand(1, 30_000, 4)
    picks = gumbel(logits).index.flatten()
    frequencies = torch.bincount(picks, minlength=4).double() / picks.numel()
    torch.testing.assert_close(frequencies, torch.tensor([1 / 6, 2 / 6, 3 / 6, 0.0], dtype=torch.float64), atol=0.01, rtol=0)
    gumbel.reseed()
    assert torch.equal(gumbel(logits).index.flatten(), picks)  # reproducible from its seed
    # Straight-through: a one-hot forward value, the softmax's gradient.
    x = torch.zeros(1, 2, 3, dtype=torch.float64, requires_grad=True)
    weights = gumbel(x).weights
    assert bool(((weights == 0) | (weights == 1)).all()) and weights.sum().item() == 2
    (weights * torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)).sum().backward()
    assert bool((x.grad != 0).all())


def test_sphere_norm_and_cluster_euclidean_score():
    sphere = registry().get("norm", "sphere")(5, 3)
    tokens = torch.tensor([[[3.0, 0.0, 4.0, 7.0, -1.0], [0.0, 0.0, 0.0, 2.0, 2.0]]], dtype=torch.float64)
    assert sphere(tokens).tolist() == [[[0.6, 0.0, 0.8, 7.0, -1.0], [0.0, 0.0, 0.0, 2.0, 2.0]]]
    score = registry().get("score", "cluster-euclidean")(gate=2)
    q = torch.tensor([[[0.0, 0.0, 1.0, 0.0]]], dtype=torch.float64)  # a center at the origin, index e_0
    k = torch.tensor([[[1.0, 2.0, 1.0, 0.0], [3.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.5, 0.5]]], dtype=torch.float64)  # in, out, shared
    logits = score(q, k, 2.0)
    assert logits.tolist() == [[[-10.0, -math.inf, -4.0 + math.log(0.5)]]]


# --- the command line: verify at each documented setting, and fit variant=NAME ------------------

DOCUMENTED = {
    "soft": ("--gamma", "100", "--dtype", "float64"),
    "spherical": ("--gamma", "inf", "--dtype", "float64"),
    "trimmed": ("--gamma", "inf", "--dtype", "float64"),
    "robust": ("--gamma", "inf", "--dtype", "float64"),
    "kmedoids": ("--gamma", "inf", "--dtype", "float64"),
}


@pytest.fixture(scope="module")
def verify_runs():
    """``ktframe verify`` of every variant at its documented setting (on 400 points), plus
    trimmed at a finite gamma (``--gamma`` overrides its declared gamma=inf); two at a time,
    each in its own interpreter."""
    cases = {name: ("--variant", name, *args, "--n", "400", "--layers", "5", "--json") for name, args in DOCUMENTED.items()}
    cases["trimmed-finite"] = ("--variant", "trimmed", "--gamma", "1e4", "--json")
    with ThreadPoolExecutor(max_workers=2) as pool:
        done = dict(
            zip(
                cases,
                pool.map(
                    lambda args: subprocess.run([sys.executable, "-m", "ktframe.cli.main", "verify", *args], capture_output=True, text=True, timeout=600),
                    cases.values(),
                ),
            )
        )
    return done


@pytest.mark.parametrize("variant", sorted(DOCUMENTED))
def test_verify_passes_at_the_documented_setting(verify_runs, variant):
    proc = verify_runs[variant]
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["passed"] is True and report["variant"] == variant and report["dtype"] == "float64"
    assert report["at_exact_setting"] is True  # the documented setting is the one the variant declares
    assert report["max_center_error"] <= 1e-9 and report["assignment_agreement"] == 1.0
    assert report["center_error_per_layer"][0] == 0.0
    assert report["log_objective_transformer"][-1] == pytest.approx(report["log_objective_reference"][-1], abs=1e-12)
    assert report.get("centers_are_data_points") is (True if variant == "kmedoids" else None)


def test_verify_trimmed_at_a_finite_gamma_is_a_one_line_error(verify_runs):
    proc = verify_runs["trimmed-finite"]
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "ktframe verify: error: trimmed needs hard assignments: its norm-max update counts the members of each cluster; use gamma=inf (got gamma=10000)"
    ]


def test_fit_variant_shorthand_builds_a_learnable_version():
    from ktframe.learning.config import load_config, to_dict
    from ktframe.learning.module import model_from_config

    cfg = load_config(["variant=robust", "data.n=40", "data.d=2", "data.k=3", "model.options.beta=2.0"])
    assert (cfg.variant, cfg.model.variant, cfg.model.gamma, cfg.model.options) == ("robust", "robust", 100.0, {"beta": 2.0})
    assert load_config(["variant=robust", "model.gamma=inf"]).model.gamma == math.inf  # the command line wins
    model = model_from_config(to_dict(cfg))
    params = [p for p in model.parameters() if p.requires_grad]
    assert params and model.layers[0].center_cross.gamma == 2.0  # the option reached the build
    # It starts at the construction: the same centers as the hand-built robust model.
    X, C0 = problem(12, d=2, k=3)
    with torch.no_grad():
        torch.testing.assert_close(model.double()(X, C0).centers, run("robust", X, C0, 1, gamma=100.0, beta=2.0).centers, atol=1e-12, rtol=0)
    for overrides, message in (
        (["variant=robst"], r"^unknown variant 'robst'; expected one of: .* \(did you mean 'robust'\?\)$"),
        (["variant=robust", "model.variant=soft"], r"^variant=robust and model.variant=soft name different variants; give one of them$"),
        (
            ["variant=trimmed", "model.options.trimm=0.1"],
            r"^unknown option 'trimm' for variant 'trimmed'; expected one of: gamma, trim, share_weights, fast \(did you mean 'trim'\?\)$",
        ),
    ):
        with pytest.raises(ktframe.KtframeError, match=message):
            load_config(overrides)
