"""Every variant's fast model (``ktframe.fast``, which each first-party variant chooses by default)
computes what its plain definition (``ktframe.transformer.model``, ``fast=False``) computes."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import ktframe
from ktframe import fast
from ktframe.core import host, reference
from ktframe.core.tasks import mixture
from ktframe.fast import attention  # noqa: F401  (fast.attention, which only training imports otherwise)
from ktframe.fast import model as fast_model
from ktframe.kernels import cpu as kernels
from ktframe.plugin.manager import registry
from ktframe.transformer import construction, model

# Each first-party variant at its exact setting and at a finite temperature where it has one.
SETTINGS = [
    pytest.param("lloyd", {}, id="lloyd"),
    pytest.param("lloyd", {"reset": "identity"}, id="lloyd-identity-reset"),
    pytest.param("lloyd", {"center_update": "argmax"}, id="lloyd-argmax-update"),
    pytest.param("lloyd", {"gamma": 50.0}, id="lloyd-gamma50"),
    pytest.param("lloyd-dot", {}, id="lloyd-dot"),
    pytest.param("soft", {"gamma": 20.0}, id="soft"),
    pytest.param("spherical", {}, id="spherical"),
    pytest.param("trimmed", {}, id="trimmed"),
    pytest.param("robust", {}, id="robust"),
    pytest.param("kmedoids", {"beta": math.inf}, id="kmedoids"),
    pytest.param("kmedoids", {"beta": 5.0}, id="kmedoids-sampled"),
    pytest.param("learned", {}, id="learned"),
]
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}


def problem(dtype: torch.dtype, tasks: int = 4, n: int = 150, d: int = 3, k: int = 5):
    generator = torch.Generator().manual_seed(7)
    X = torch.rand(tasks, n, d, generator=generator, dtype=torch.float64)
    X[1, 10] = X[1, 11]  # a duplicate point
    return X.to(dtype), X[:, :k].clone().to(dtype)


def twins(name: str, options: dict, dtype: torch.dtype, n_layers: int = 8) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The variant's model on the fast path and as its plain definition, with the same weights."""
    torch.manual_seed(0)
    quick = ktframe.build_model(name, d=3, k=5, n_layers=n_layers, dtype=dtype, **options)
    plain = ktframe.build_model(name, d=3, k=5, n_layers=n_layers, dtype=dtype, fast=False, **options)
    plain.load_state_dict(quick.state_dict())
    return quick.eval(), plain.eval()  # dropout off: the two paths would draw different masks


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name, options", SETTINGS)
def test_the_fast_model_computes_the_plain_definition(name, options, dtype):
    quick, plain = twins(name, options, dtype)
    assert isinstance(quick.plan, fast.ModelPlan) and all(getattr(m, "plan", None) is None for m in plain.modules())
    assert [type(m) for m in quick.modules()] == [type(m) for m in plain.modules()]  # one class hierarchy
    X, C0 = problem(dtype)
    with torch.no_grad():
        got, want = quick(X, C0), plain(X, C0)
    torch.testing.assert_close(got.trajectory, want.trajectory, rtol=0, atol=TOLERANCE[dtype])
    torch.testing.assert_close(got.assignments, want.assignments, rtol=0, atol=TOLERANCE[dtype])
    # The fast path counts a task converged only where it can tell (a hard assignment by cluster),
    # never before the definition's streams stop changing.
    assert bool((got.n_iter >= want.n_iter).all()), (got.n_iter, want.n_iter)


@pytest.mark.parametrize("keys", [7, 20], ids=["short-rows", "long-rows"])  # below and above SHORT_ROW
@pytest.mark.parametrize("unit", [True, False], ids=["one-hot-values", "dense-values"])
def test_softmax_with_values_wider_than_its_queries_builds_the_weights_block_by_block(monkeypatch, unit, keys):
    # The path that a softmax head takes without autograd when its values are wider than its
    # queries (the soft variant's point → center assignment: d-wide queries, k-wide one-hot
    # values), in blocks of a few rows here, against softmax(a q·k + b‖k‖²) v built whole.
    monkeypatch.setattr(fast_model, "CACHE_BLOCK", 3 * keys * 4)  # 4 rows per block of 3 tasks
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(3, 10, 2, generator=generator, dtype=torch.float64), torch.randn(3, keys, 2, generator=generator, dtype=torch.float64)
    v = torch.eye(keys, dtype=torch.float64).expand(3, keys, keys) if unit else torch.randn(3, keys, keys, generator=generator, dtype=torch.float64)
    a, b = 2.0 * 5.0, -5.0  # -γ‖q − k‖² up to a constant per query, γ = 5
    want = torch.softmax(a * q @ k.transpose(1, 2) + b * k.pow(2).sum(-1).unsqueeze(1), dim=-1) @ v
    into = torch.full((3, 10, keys + 2), math.nan, dtype=torch.float64)[..., 1 : keys + 1]  # a slot of a wider stream
    got = fast_model._softmax_rows(q, k, v, a, b, into)
    assert got is into
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("e, f", [(9, 3), (3, 9)], ids=["keys-wider", "values-wider"])
def test_key_value_sums_of_dense_keys_match_the_product_in_either_orientation(monkeypatch, e, f):
    # Dense keys (soft assignments) go to the batched product, block by block, summed into
    # kv (B, e, f) or, where e > f, into its transpose: Σᵢ kᵢ vᵢᵀ and Σᵢ kᵢ either way.
    monkeypatch.setattr(fast_model, "CACHE_BLOCK", 2 * e * 5)  # 5 rows per block of 2 tasks
    generator = torch.Generator().manual_seed(e)
    k, v = torch.rand(2, 23, e, generator=generator, dtype=torch.float64), torch.randn(2, 23, f, generator=generator, dtype=torch.float64)
    k.requires_grad_(), v.requires_grad_()  # a linear-attention head's key sums in training
    kv, mass = fast_model.key_value_sums(k, v)
    want_kv, want_mass = k.transpose(1, 2) @ v, k.sum(dim=1)
    torch.testing.assert_close(kv, want_kv, rtol=0, atol=1e-12)
    torch.testing.assert_close(mass, want_mass, rtol=0, atol=1e-12)
    got = torch.autograd.grad(kv.square().sum() + mass.sum(), (k, v))
    want = torch.autograd.grad(want_kv.square().sum() + want_mass.sum(), (k, v))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12)


def test_a_converged_task_is_counted_alike_where_the_fast_path_can_tell():
    """Two well-separated blobs: Lloyd converges at once, and both paths say at which step."""
    generator = torch.Generator().manual_seed(1)
    X = torch.cat(
        [torch.randn(2, 50, 2, generator=generator, dtype=torch.float64) * 0.01, torch.randn(2, 50, 2, generator=generator, dtype=torch.float64) * 0.01 + 5],
        dim=1,
    )
    C0 = X[:, [0, 50]].clone()
    quick, plain = (
        ktframe.build_model("lloyd", d=2, k=2, n_layers=6, dtype="float64", reset="identity"),
        ktframe.build_model("lloyd", d=2, k=2, n_layers=6, dtype="float64", reset="identity", fast=False),
    )
    with torch.no_grad():
        got, want = quick(X, C0), plain(X, C0)
    assert want.n_iter.tolist() == [2, 2]  # step 1 finds the blobs, step 2 changes nothing
    assert got.n_iter.tolist() == want.n_iter.tolist()
    torch.testing.assert_close(got.trajectory, want.trajectory, rtol=0, atol=1e-12)  # sums in another order


def test_the_learned_model_trains_alike_on_both_paths():
    """Outputs and gradients of a training step, fused softmax against the explicit definition
    (dropout off, so that both draw no mask)."""
    quick, plain = (ktframe.build_model("learned", d=3, k=5, n_layers=1, dtype="float64", dropout=0.0, fast=f) for f in (True, False))
    plain.load_state_dict(quick.state_dict())
    assert_train_alike(quick, plain)


def assert_train_alike(quick, plain, before_plain=lambda: None) -> None:
    """Two unrolled training steps of each model on the same tasks (``before_plain()`` run just
    before the plain one's): the same centers and the same gradient of every parameter."""
    X, C0 = problem(torch.float64)
    results = []
    for m in (quick, plain):
        m.train()
        if m is plain:
            before_plain()
        out = m(X, C0, n_steps=2, reembed=True)
        out.centers.square().sum().backward()
        results.append((out.centers, {name: w.grad for name, w in m.named_parameters()}))
    (c1, g1), (c2, g2) = results
    torch.testing.assert_close(c1, c2, rtol=0, atol=1e-10)
    assert g1.keys() == g2.keys()
    for name in g1:
        torch.testing.assert_close(g1[name], g2[name], rtol=1e-8, atol=1e-10, msg=name)


def test_every_first_party_variant_chooses_the_fast_path_and_can_build_the_plain_one():
    for name in ("lloyd", "lloyd-dot", "soft", "spherical", "trimmed", "robust", "kmedoids", "learned"):
        assert "fast" in registry().get("variant", name).options(), name
        quick = ktframe.build_model(name, d=2, k=3, n_layers=1)
        assert isinstance(quick.plan, fast.ModelPlan), name
        assert all(isinstance(head.plan, fast.HeadPlan) for head in quick.modules() if isinstance(head, model.AttentionHead)), name
        plain = ktframe.build_model(name, d=2, k=3, n_layers=1, fast=False)
        assert all(getattr(m, "plan", None) is None for m in plain.modules()), name
        for built in (quick, plain):
            assert all(not type(m).__module__.startswith("ktframe.fast") for m in built.modules()), name


def test_the_plans_are_shown_by_repr_and_name_each_route():
    built = ktframe.build_model("lloyd", d=2, k=3, n_layers=2, reset="identity")
    layer = built.layers[0]
    assert layer.point_cross.plan.route == "fused-argmax" and layer.center_cross.plan.route == "linear-sums"
    assert layer.point_self.plan == fast.HeadPlan("identity", rescale=0.0) == layer.center_self.plan
    assert layer.plan == fast.LayerPlan(by_cluster=True, fixed_rows=True, keys_in_centers=True, reports_settled=True, all_steps=True)
    assert built.plan == fast.ModelPlan(skip_settled=True, one_kernel_call=True)
    text = repr(built)
    assert "plan=ModelPlan(skip_settled=True, one_kernel_call=True)" in text and "plan=HeadPlan(route='fused-argmax', rescale=None)" in text
    assert "plan=" not in repr(ktframe.build_model("lloyd", d=2, k=3, n_layers=2, fast=False))
    soft = ktframe.build_model("soft", d=2, k=3, n_layers=1, gamma=5.0)
    assert soft.layers[0].point_cross.plan.route == "fused-softmax" and soft.plan == fast.ModelPlan(skip_settled=False, one_kernel_call=False)


class TwiceLayer(model.Layer):
    """A plugin's own layer: two Lloyd steps per call, through a forward of its own."""

    def forward(self, points, centers):
        return super().forward(*super().forward(points, centers))


class ReversedLayer(model.Layer):
    """A plugin's own layer that changes the definition's update: the heads added in reverse."""

    def update(self, tokens, queries, heads):
        return super().update(tokens, queries, heads[::-1])


@pytest.mark.parametrize("kind", [TwiceLayer, ReversedLayer], ids=["own-forward", "own-update"])
def test_a_plugins_own_layer_needs_no_fast_twin(kind):
    """``accelerate`` plans a subclass of the definition's layer as it is: its class stays, its
    heads take their fast routes, and the model computes what the plain one computes. A subclass
    with a forward of its own gets no settled tasks handed in; one with its own update, which the
    layer's in-place route would bypass, gets no layer plan."""
    width, xs, ys = 5, construction.coords(0, 2), construction.coords(2, 5)

    def make_layer():
        return construction.lloyd_family_layer(
            width, xs, ys, gamma=math.inf, center_cross=construction.mean_head(width, xs, ys), layer=kind, identity_resets=True
        )

    plain = model.KMeansTransformer(registry().get("embedding", "onehot")(), construction.stack(make_layer, 6, True), d=2, k=3, n_layers=6).double()
    quick = fast.accelerate(copy.deepcopy(plain))
    assert [type(m) for m in quick.modules()] == [type(m) for m in plain.modules()]
    layer = quick.layers[0]
    assert all(head.plan is not None for head in (layer.point_cross, layer.point_self, layer.center_cross, layer.center_self))
    if kind is TwiceLayer:
        assert layer.plan.by_cluster and not layer.plan.reports_settled and not layer.plan.all_steps
    else:
        assert layer.plan is None
    assert quick.plan == fast.ModelPlan(skip_settled=False, one_kernel_call=False)
    X, C0 = problem(torch.float64, d=2, k=3)
    with torch.no_grad():
        got, want = quick(X, C0), plain(X, C0)
    torch.testing.assert_close(got.trajectory, want.trajectory, rtol=0, atol=TOLERANCE[torch.float64])
    torch.testing.assert_close(got.assignments, want.assignments, rtol=0, atol=TOLERANCE[torch.float64])


def test_a_learnable_model_is_planned_again_for_its_new_projections():
    """``learnable`` swaps the fixed projections for linear maps: the reset is then no rescale of
    its slot and the assignment no longer by cluster, and the fast model still computes the plain one."""
    quick = construction.learnable(ktframe.build_model("lloyd", d=3, k=5, n_layers=3, dtype="float64", reset="identity"))
    plain = construction.learnable(ktframe.build_model("lloyd", d=3, k=5, n_layers=3, dtype="float64", reset="identity", fast=False))
    layer = quick.layers[0]
    assert layer.point_self.plan == fast.HeadPlan("identity", rescale=None) and not layer.plan.by_cluster
    assert quick.plan == fast.ModelPlan(skip_settled=False, one_kernel_call=False) and plain.plan is None
    X, C0 = problem(torch.float64)
    with torch.no_grad():
        got, want = quick(X, C0), plain(X, C0)
    torch.testing.assert_close(got.trajectory, want.trajectory, rtol=0, atol=TOLERANCE[torch.float64])


def test_the_model_file_holds_no_kernel():
    """The definition stays readable: no kernel, no in-place trickery, nothing the fast path owns."""
    source = open(model.__file__).read()
    for word in ("import kernels", "kernels.", "CACHE_BLOCK", "settled", "scaled_dot_product_attention", "ClusterSums", "in_place"):
        assert word not in source, word


class ReplayDropout(torch.nn.Module):
    """Dropout of attention weights with the masks another run drew, in the order it drew them."""

    def __init__(self, p: float, masks: list[torch.Tensor]) -> None:
        super().__init__()
        self.p, self.masks = p, masks

    def forward(self, weights: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(weights.numel(), dtype=weights.dtype)
        keep[self.masks.pop(0)] = 0.0
        return weights * keep.view_as(weights) / (1 - self.p)


def test_the_learned_model_trains_alike_on_both_paths_with_dropout(monkeypatch):
    """The fast path's attention dropout (sparse masks, one fused autograd function) gives the
    outputs and gradients of the plain definition's dense dropout under the same masks."""
    p = 0.3
    quick, plain = (ktframe.build_model("learned", d=3, k=5, n_layers=1, dtype="float64", dropout=p, fast=f) for f in (True, False))
    plain.load_state_dict(quick.state_dict())
    drawn = []
    draw = fast.attention.dropped_positions
    monkeypatch.setattr(fast.attention, "dropped_positions", lambda *args, **kwargs: drawn.append(draw(*args, **kwargs)) or drawn[-1])

    def replay() -> None:
        masks = list(drawn)
        assert len(masks) == 8 and all(len(mask) > 0 for mask in masks)  # four heads, two steps
        for head in plain.modules():
            if isinstance(head, model.AttentionHead):
                head.dropout = ReplayDropout(p, masks)

    assert_train_alike(quick, plain, before_plain=replay)


def test_sparse_dropout_masks_drop_each_weight_independently_at_rate_p():
    """Over many masks, every position is dropped at rate p (a chi-square test of uniformity over
    the positions, and the count's mean and variance those of Binomial(numel, p))."""
    generator = torch.Generator().manual_seed(0)
    shape, p, draws = torch.Size((2, 20, 25)), 0.1, 2000
    counts = torch.zeros(shape.numel())
    sizes = []
    for _ in range(draws):
        dropped = fast.attention.dropped_positions(shape, p, generator)
        assert len(dropped.unique()) == len(dropped)
        counts[dropped] += 1
        sizes.append(len(dropped))
    sizes = torch.tensor(sizes, dtype=torch.float64)
    numel = shape.numel()
    assert abs(sizes.mean() - numel * p) < 4 * math.sqrt(numel * p * (1 - p) / draws)
    assert abs(sizes.var() / (numel * p * (1 - p)) - 1) < 0.15
    expected = draws * p
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < numel + 5 * math.sqrt(2 * numel), chi2  # 999 degrees of freedom, about 5 sigma


def test_the_dropout_attention_reuses_its_buffers_and_never_one_a_live_graph_needs():
    """Two attentions through one workspace before either backward (an unrolled layer with shared
    weights) keep their own weights; step after step the same few buffers are lent again."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 30, 6, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    workspace = fast.attention.Workspace()

    def plain(dropped):
        keep = torch.ones(2 * 30 * 30, dtype=torch.float64)
        keep[dropped] = 0.0
        return (torch.softmax(0.5 * q @ k.transpose(1, 2), -1) * keep.view(2, 30, 30) / 0.8) @ v

    seen = set()
    for step in range(6):
        first, second = (fast.attention.dropped_positions(torch.Size((2, 30, 30)), 0.2, g) for _ in range(2))
        x = fast.attention.softmax_dropout_attention(q, k, v, 0.5, 0.2, first, workspace)
        y = fast.attention.softmax_dropout_attention(q, k, v, 0.5, 0.2, second, workspace)
        got = torch.autograd.grad((x * y.detach() + y).sum(), (q, k, v))
        want = torch.autograd.grad((plain(first) * y.detach() + plain(second)).sum(), (q, k, v))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
        del x, y
        if step >= 2:
            seen |= {buffer.data_ptr() for buffer in workspace._buffers}
    assert len(workspace._buffers) <= 3 and len(seen) <= 3


def test_the_workspace_lets_go_of_buffers_whose_shape_no_step_asks_for_again():
    """Tasks whose n changes every step (data.n_range): buffers are held only while in use, not
    one per shape ever seen."""
    g = torch.Generator().manual_seed(4)
    workspace = fast.attention.Workspace()
    for n in range(20, 60):
        q, k, v = (torch.randn(2, n, 6, generator=g, requires_grad=True) for _ in range(3))
        dropped = fast.attention.dropped_positions(torch.Size((2, n, n)), 0.1, g)
        fast.attention.softmax_dropout_attention(q, k, v, 0.5, 0.1, dropped, workspace).sum().backward()
        assert len(workspace._buffers) <= 2


def _lloyd_fast_and_plain(X: torch.Tensor, C0: torch.Tensor, steps: int, **options) -> list:
    """The hand-built lloyd model's results on the tasks, fast path first, then the plain definition."""
    results = []
    for accelerated in (True, False):
        built = ktframe.build_model("lloyd", d=X.shape[-1], k=C0.shape[1], n_layers=steps, dtype=X.dtype, fast=accelerated)
        with torch.no_grad():
            results.append(built(X, C0, **options))
    return results


def test_tasks_that_stop_at_different_steps_keep_their_streams_one_step_at_a_time() -> None:
    # 300 points per task, more than one tile of the arg-max: the fast model takes its steps one
    # by one, and a task that stops (its center shift within tol) keeps the streams of that step
    # while the others go on.
    generator = torch.Generator().manual_seed(0)
    X = torch.rand(12, 300, 1, generator=generator, dtype=torch.float64)
    quick, plain = _lloyd_fast_and_plain(X, X[:, :4].clone(), 40, tol=1e-4)
    assert len(set(plain.n_iter.tolist())) > 1 and int(plain.n_iter.max()) < 40, "tasks should stop at different steps"
    assert torch.equal(quick.n_iter, plain.n_iter)
    assert torch.equal(quick.assignments, plain.assignments)
    torch.testing.assert_close(quick.trajectory, plain.trajectory, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_steps_on_the_kernels_stop_each_task_where_the_exact_rule_does(monkeypatch, dtype):
    # Tasks of 2 000 points: the steps run on the kernels one by one, and kernels.shifts_beyond
    # passes over the steps that surely stop no task. The run is the one where the exact
    # comparison decides every step, bit for bit, with a tol that puts task 0's bound at the very
    # shift of its third step (which the kernel must leave to the exact comparison).
    X, _ = mixture(6, 2000, 2, 8, generator=torch.Generator().manual_seed(3), dtype=dtype)
    C0 = reference.kmeans_plusplus(X, 8, torch.Generator().manual_seed(4))
    model = ktframe.build_model("lloyd", d=2, k=8, n_layers=40, dtype=dtype)
    with torch.no_grad():
        trajectory = model(X, C0).trajectory
    at_bound = (host.squared_shift(trajectory[:1, 2], trajectory[:1, 3]) / host.mean_square_deviation(X[:1])).item()
    verdicts = []
    decide = kernels.shifts_beyond
    for tol in (1e-4, at_bound):
        monkeypatch.setattr(kernels, "shifts_beyond", lambda *args: verdicts.append(decide(*args)) or verdicts[-1])
        with torch.no_grad():
            quick = model(X, C0, tol=tol)
        monkeypatch.setattr(kernels, "shifts_beyond", lambda *args: False)
        with torch.no_grad():
            exact = model(X, C0, tol=tol)
        assert len(set(exact.n_iter.tolist())) > 1 and int(exact.n_iter.max()) < 40, "tasks should stop at different steps"
        for field in ("centers", "assignments", "trajectory", "n_iter"):
            assert torch.equal(getattr(quick, field), getattr(exact, field)), field
    assert True in verdicts and False in verdicts
    assert int(quick.n_iter[0]) == 3


@pytest.mark.xfail(
    strict=True,
    reason="the kernels' rounding bounds are relative to the numbers' magnitudes, which does not hold where float32 squared distances are subnormal",
)
def test_the_fast_model_computes_the_definition_on_float32_data_near_underflow() -> None:
    generator = torch.Generator().manual_seed(0)
    X = (torch.rand(512, 200, 1, generator=generator) * 1e-20).float()
    quick, plain = _lloyd_fast_and_plain(X, X[:, :4].clone(), 30)
    assert torch.equal(quick.n_iter, plain.n_iter)
    assert torch.equal(quick.assignments, plain.assignments)
