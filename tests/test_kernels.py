"""The vectorised pieces of the exact path compute what their plain definitions compute: the
arg-max map (winners found by a float compare and a product with [1, j]), the key-value sums of
linear attention (block by block, streamed with the point stream), and the blocked in-place layer."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ktframe
import ktframe.model
from ktframe import reference
from ktframe.components.maps import Hardmax, count_and_index
from ktframe.model import CACHE_BLOCK, key_value_sums


def plain_hardmax(logits: torch.Tensor) -> torch.Tensor:
    winners = (logits == logits.amax(dim=-1, keepdim=True)).to(logits.dtype)
    return winners / winners.sum(dim=-1, keepdim=True)


def dense(out, n: int, dtype) -> torch.Tensor:
    weights = torch.nn.functional.one_hot(out.index, n).to(dtype)
    if out.ties is not None:
        rows, tie_weights = out.ties
        weights[rows[:, 0], rows[:, 1]] = tie_weights
    return weights


@st.composite
def integer_logits(draw):
    # Small integers: exact ties are common.
    B, m, n = draw(st.integers(1, 3)), draw(st.integers(1, 40)), draw(st.integers(1, 300))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    logits = torch.randint(-draw(st.integers(0, 5)), 3, (B, n, m), generator=g).to(dtype)
    # Either layout: the Euclidean score hands the map a keys-major (transposed) view.
    return logits.transpose(1, 2) if draw(st.booleans()) else logits.transpose(1, 2).contiguous()


@settings(max_examples=60, deadline=None)
@given(logits=integer_logits())
def test_hardmax_equals_uniform_over_the_maximal_keys(logits):
    out = Hardmax()(logits)
    assert out.index.dtype == torch.long and out.weights is None
    assert int(out.index.min()) >= 0 and int(out.index.max()) < logits.shape[-1]
    torch.testing.assert_close(dense(out, logits.shape[-1], logits.dtype), plain_hardmax(logits), atol=0, rtol=0)


def test_hardmax_tie_weights_are_exact_in_float64():
    logits = torch.tensor([[[1.0, 3.0, 3.0, 3.0, 0.0]]], dtype=torch.float64)
    rows, weights = Hardmax()(logits).ties
    assert rows.tolist() == [[0, 0]]
    assert weights.dtype == torch.float64 and weights[0, 1].item() == 1 / 3


def test_hardmax_threshold_leaves_unsupported_queries_on_themselves():
    logits = torch.tensor([[[0.0, -3.0], [-5.0, -2.0]]])
    out = Hardmax(threshold=-1.0)(logits)
    assert out.weights.tolist() == [[[1.0, 0.0], [0.0, 0.0]]]
    assert out.stay.tolist() == [[[0.0], [1.0]]]


@pytest.mark.parametrize("keys_major", [False, True])
def test_count_and_index_find_every_one(keys_major):
    n = 5000
    columns = torch.randint(0, n, (2, 64))
    mask = torch.nn.functional.one_hot(columns, n).to(torch.float32)
    mask[1, 5] = 0.0  # an empty row
    mask[1, 7, [3, 10]] = 1.0  # a row with three ones
    if keys_major:
        mask = mask.transpose(1, 2).contiguous().transpose(1, 2)
    count, index = count_and_index(mask)
    assert torch.equal(index, (mask.double() * torch.arange(n)).sum(dim=-1).long())
    assert torch.equal(index[0], columns[0])
    assert torch.equal(count, mask.sum(dim=-1))


def plain_sums(k, v):
    return torch.bmm(k.transpose(1, 2), v), k.sum(dim=1)


@st.composite
def keys_and_values(draw):
    B, n, e, f = draw(st.integers(1, 3)), draw(st.integers(1, 500)), draw(st.integers(1, 12)), draw(st.integers(1, 5))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(["one-hot", "scaled one-hot", "with empty rows", "soft", "one soft row"]))
    k = torch.nn.functional.one_hot(torch.randint(0, e, (B, n), generator=g), e).to(torch.float64)
    if kind == "scaled one-hot":
        k = k * torch.rand(B, n, 1, generator=g, dtype=torch.float64)
    elif kind == "with empty rows":
        k = k * (torch.rand(B, n, 1, generator=g) < 0.5)
    elif kind == "soft":
        k = torch.softmax(torch.randn(B, n, e, generator=g, dtype=torch.float64), dim=-1)
    elif kind == "one soft row":
        k[0, n // 2] = 1.0 / e
    v = torch.randn(B, n, f, generator=g, dtype=torch.float64)
    return k, v


@settings(max_examples=60, deadline=None)
@given(problem=keys_and_values())
def test_key_value_sums_equal_the_product(problem):
    k, v = problem
    kv, mass = key_value_sums(k, v)
    want_kv, want_mass = plain_sums(k, v)
    torch.testing.assert_close(kv, want_kv, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(mass, want_mass, atol=1e-12, rtol=1e-12)


def test_key_value_sums_over_many_blocks():
    # Enough keys for several cache blocks, one-hot but for one soft key.
    e = 4
    n = 3 * CACHE_BLOCK // e
    k = torch.nn.functional.one_hot(torch.arange(n) % e, e).to(torch.float64).unsqueeze(0)
    k[0, n // 2] = 0.25
    v = torch.randn(1, n, 3, dtype=torch.float64)
    kv, mass = key_value_sums(k, v)
    want_kv, want_mass = plain_sums(k, v)
    torch.testing.assert_close(kv, want_kv, atol=1e-9, rtol=1e-12)
    torch.testing.assert_close(mass, want_mass, atol=1e-9, rtol=1e-12)


def test_key_value_sums_carry_the_products_gradient():
    # The sums are accumulated in place; autograd must still see the product, zero entries included.
    k = torch.nn.functional.one_hot(torch.tensor([[0, 2, 1, 2]]), 3).to(torch.float64).requires_grad_()
    v = torch.randn(1, 4, 2, dtype=torch.float64, requires_grad=True)
    kv, mass = key_value_sums(k, v)
    (kv.square().sum() + mass.sum()).backward()
    got = k.grad.clone(), v.grad.clone()
    k.grad = v.grad = None
    want_kv, want_mass = plain_sums(k, v)
    (want_kv.square().sum() + want_mass.sum()).backward()
    torch.testing.assert_close(got, (k.grad, v.grad))


@pytest.mark.parametrize("options", [{}, {"reset": "identity"}, {"center_update": "argmax"}], ids=["attention-reset", "identity-reset", "argmax-update"])
def test_blocked_in_place_layers_equal_lloyd_and_the_autograd_path(monkeypatch, options):
    # Tiny cache blocks: the in-place path splits both streams into many blocks and streams the
    # center update's key sums block by block; it must still be Lloyd's iteration, and agree with
    # the out-of-place path that autograd takes.
    monkeypatch.setattr(ktframe.model, "CACHE_BLOCK", 64)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 300, 3, generator=g, dtype=torch.float64)
    C0 = reference.random_points(X, 5, g)
    model = ktframe.build_model("lloyd", d=3, k=5, n_layers=4, dtype=torch.float64, **options)
    with torch.no_grad():
        blocked = model(X, C0)
    unblocked = model(X.clone().requires_grad_(), C0)
    want = reference.lloyd(X, C0, 4)
    torch.testing.assert_close(blocked.trajectory, want.trajectory, atol=1e-12, rtol=0)
    torch.testing.assert_close(blocked.trajectory, unblocked.trajectory.detach(), atol=1e-12, rtol=0)


def test_count_and_index_stay_exact_when_float32_products_may_round():
    # "high" / "medium" let PyTorch compute float32 products in TF32 or bf16, which cannot hold
    # the column numbers exactly; the index must not depend on that setting.
    n = 5000
    columns = torch.arange(n - 64, n).unsqueeze(0)
    mask = torch.nn.functional.one_hot(columns, n).to(torch.float32)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        assert torch.equal(count_and_index(mask)[1], columns)
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("writers", [0, 1, 2])
def test_in_place_reset_with_any_number_of_writers_equals_the_out_of_place_sum(writers):
    # The reset zeroes its slot; the heads that write that slot then add to 0 (one of them alone
    # is copied in). Whatever the number of writers, the result is the out-of-place sum.
    g = torch.Generator().manual_seed(0)
    X = torch.randn(2, 40, 3, generator=g, dtype=torch.float64)
    C0 = reference.random_points(X, 4, g)
    model = ktframe.build_model("lloyd", d=3, k=4, n_layers=1, dtype=torch.float64, reset="identity")
    layer = model.layers[0]
    assert layer.point_self.slot_factor == 0.0
    with torch.no_grad():
        points, centers = model.embedding.points(X, 4), model.embedding.centers(C0)
        points[..., 3:] = torch.nn.functional.one_hot(torch.randint(0, 4, (2, 40), generator=g), 4)  # an old assignment to erase
        heads = [(layer.point_self, points)] + [(layer.point_cross, centers)] * writers
        want = layer._update(points.clone(), points.clone(), heads, in_place=False)
        got = layer._update(points, points, heads, in_place=True)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
