"""The vectorised pieces of the exact path compute what their plain definitions compute: the
arg-max map (winners found by a float compare and a product with [1, j]), the key-value sums of
linear attention (block by block, streamed with the point stream), the blocked in-place layer, and
the numba CPU kernels (ktframe.kernels.cpu), which must give what PyTorch gives with them turned off."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numba
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ktframe
import ktframe.fast.model
from ktframe.components.maps import Hardmax, count_and_index
from ktframe.core import host, reference
from ktframe.core.tasks import mixture
from ktframe.fast.model import CACHE_BLOCK, key_value_sums
from ktframe.kernels import cpu as kernels


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
    monkeypatch.setattr(ktframe.fast.model, "CACHE_BLOCK", 64)
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
    assert layer.point_self.plan.rescale == 0.0
    with torch.no_grad():
        points, centers = model.embedding.points(X, 4), model.embedding.centers(C0)
        points[..., 3:] = torch.nn.functional.one_hot(torch.randint(0, 4, (2, 40), generator=g), 4)  # an old assignment to erase
        heads = [(layer.point_self, points)] + [(layer.point_cross, centers)] * writers
        want = layer.update(points.clone(), points.clone(), heads)  # the definition's
        got = layer.plan.update(layer, points, points, heads, in_place=True)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


# --- the numba kernels (ktframe.kernels.cpu) against their plain PyTorch definitions ----------------


def plain_argmax_count(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's number of maximal entries and the sum of their columns (a NaN row: count 0)."""
    winners = logits == logits.amax(dim=-1, keepdim=True)
    count = torch.where(logits.isnan().any(dim=-1), 0, winners.sum(dim=-1))
    return count, (winners * torch.arange(logits.shape[-1])).sum(dim=-1)


def assert_argmax_count_is_plain(logits):
    count, index = kernels.argmax_count(logits)
    want_count, want_index = plain_argmax_count(logits)
    assert count.dtype == index.dtype == torch.int64
    assert count.shape == index.shape == logits.shape[:-1]
    assert torch.equal(count, want_count)
    # A NaN row's index is left unspecified (its count, 0, marks it).
    finite = ~logits.isnan().any(dim=-1)
    assert torch.equal(index[finite], want_index[finite])


@st.composite
def tied_logits(draw):
    B, m, n = draw(st.integers(1, 3)), draw(st.integers(1, 20)), draw(st.sampled_from([1, 2, 3, 7, 50]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    kind = draw(st.sampled_from(["continuous", "small integers", "duplicate columns", "with NaN"]))
    logits = torch.randn(B, m, n, generator=g, dtype=dtype)
    if kind == "small integers":  # exact ties everywhere
        logits = torch.randint(-2, 2, (B, m, n), generator=g).to(dtype)
    elif kind == "duplicate columns" and n > 1:  # the maximum, where it is, held twice
        logits[..., n - 1] = logits[..., 0]
        logits[..., n // 2] = logits.amax(dim=-1)
    elif kind == "with NaN":
        logits[0, m // 2, int(torch.randint(n, (1,), generator=g))] = float("nan")
    return logits


@settings(max_examples=60, deadline=None)
@given(logits=tied_logits())
def test_argmax_count_equals_its_plain_definition(logits):
    assert_argmax_count_is_plain(logits)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_argmax_count_of_ties_nan_and_strided_views(dtype):
    logits = torch.tensor([[3.0, 1.0, 3.0, 3.0], [0.0, 0.0, 0.0, 0.0], [1.0, float("nan"), 5.0, 2.0], [-1.0, 4.0, 0.0, 4.0]], dtype=dtype)
    count, index = kernels.argmax_count(logits)
    assert count.tolist() == [3, 4, 0, 2]
    assert index[[0, 1, 3]].tolist() == [0 + 2 + 3, 0 + 1 + 2 + 3, 1 + 3]
    # A NaN that is the only non-maximal entry, and one in a row of equal numbers: still count 0.
    assert kernels.argmax_count(torch.tensor([[7.0, float("nan")], [float("nan"), float("nan")]], dtype=dtype))[0].tolist() == [0, 0]
    # Single keys, and infinities.
    count, index = kernels.argmax_count(torch.randn(2, 5, 1, dtype=dtype))
    assert torch.equal(count, torch.ones(2, 5, dtype=torch.long)) and torch.equal(index, torch.zeros(2, 5, dtype=torch.long))
    inf = float("inf")
    count, index = kernels.argmax_count(torch.tensor([[-inf, -inf, -inf], [inf, 1.0, inf]], dtype=dtype))
    assert count.tolist() == [3, 2] and index.tolist() == [3, 2]
    # Non-contiguous inputs (keys-major as the Euclidean score gives them, every other key, a
    # batch of rows picked out) give what their contiguous copies give.
    g = torch.Generator().manual_seed(3)
    base = torch.randint(-3, 3, (3, 40, 25), generator=g).to(dtype)
    for view in [base.transpose(1, 2), base[..., ::2], base[:, 5:30:3], base.permute(2, 0, 1)]:
        assert not view.is_contiguous()
        got = kernels.argmax_count(view)
        want = kernels.argmax_count(view.contiguous())
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert_argmax_count_is_plain(view)


def one_hot_tokens(B, n, width, e, dtype, g, *, soft_rows=0.0):
    """Tokens (B, n, width + e + 1) whose columns [width, width + e) hold weighted one-hot keys,
    about a fifth of them all zero, and a fraction ``soft_rows`` of them with three non-zeros."""
    tokens = torch.randn(B, n, width + e + 1, generator=g, dtype=dtype)
    keys = torch.nn.functional.one_hot(torch.randint(0, e, (B, n), generator=g), e).to(dtype)
    keys *= torch.rand(B, n, 1, generator=g, dtype=dtype) + 0.5
    keys *= torch.rand(B, n, 1, generator=g) > 0.2
    if soft_rows and e >= 3:
        soft = torch.rand(B, n, generator=g) < soft_rows
        keys[soft] = 0.0
        keys[soft, :3] = torch.rand(int(soft.sum()), 3, generator=g, dtype=dtype) + 0.1
    tokens[..., width : width + e] = keys
    return tokens


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float64, 1e-12)], ids=["float32", "float64"])
@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("soft_rows", [0.0, 0.05], ids=["one-hot", "some-soft-rows"])
def test_add_sparse_key_sums_equal_the_dense_product(dtype, tol, B, soft_rows):
    g = torch.Generator().manual_seed(B)
    d, e, n = 3, 5, 300
    tokens = one_hot_tokens(B, n, d, e, dtype, g, soft_rows=soft_rows)
    k, v = tokens[..., d : d + e], tokens[..., :d]  # strided slices of the token stream
    assert not k.is_contiguous() and not v.is_contiguous()
    kv0 = torch.randn(B, e, d, generator=g, dtype=dtype)
    mass0 = torch.randn(B, e, generator=g, dtype=dtype)
    kv, mass = kv0.clone(), mass0.clone()
    before = tokens.clone()
    assert kernels.add_sparse_key_sums(k, v, kv, mass) is True
    assert torch.equal(tokens, before)
    want_kv, want_mass = plain_sums(k.contiguous(), v.contiguous())
    # Accumulated onto what was there.
    torch.testing.assert_close(kv, kv0 + want_kv, rtol=tol, atol=tol * 10)
    torch.testing.assert_close(mass, mass0 + want_mass, rtol=tol, atol=tol * 10)
    # A second call adds the same again.
    assert kernels.add_sparse_key_sums(k, v, kv, mass)
    torch.testing.assert_close(kv, kv0 + 2 * want_kv, rtol=tol, atol=tol * 10)
    torch.testing.assert_close(mass, mass0 + 2 * want_mass, rtol=tol, atol=tol * 10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_add_sparse_key_sums_of_empty_rows_single_rows_and_other_layouts(dtype):
    g = torch.Generator().manual_seed(5)
    cases = []
    # All keys zero: nothing to add.
    cases.append((torch.zeros(2, 30, 4, dtype=dtype), torch.randn(2, 30, 2, generator=g, dtype=dtype)))
    # One key and a key width of 1; values as a strided slice of a wider tensor.
    cases.append((torch.tensor([[[2.5]]], dtype=dtype), torch.randn(1, 1, 7, generator=g, dtype=dtype)[..., 2:5]))
    # Keys and values batch-inner (a transposed batch), values broadcast over the batch.
    keys = torch.nn.functional.one_hot(torch.randint(0, 3, (40, 4), generator=g), 3).to(dtype)
    cases.append((keys.transpose(0, 1), torch.randn(1, 40, 2, generator=g, dtype=dtype).expand(4, -1, -1)))
    for k, v in cases:
        kv = torch.zeros(k.shape[0], k.shape[-1], v.shape[-1], dtype=dtype)
        mass = torch.zeros(k.shape[0], k.shape[-1], dtype=dtype)
        assert kernels.add_sparse_key_sums(k, v, kv, mass)
        want_kv, want_mass = plain_sums(k.contiguous(), v.contiguous())
        torch.testing.assert_close(kv, want_kv, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(mass, want_mass, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_add_sparse_key_sums_decline_dense_keys_and_accept_no_keys(dtype):
    g = torch.Generator().manual_seed(0)
    for B in [1, 3]:
        k = torch.rand(B, 50, 6, generator=g, dtype=dtype) + 0.1  # every entry non-zero
        v = torch.randn(B, 50, 3, generator=g, dtype=dtype)
        kv0, mass0 = torch.randn(B, 6, 3, generator=g, dtype=dtype), torch.randn(B, 6, generator=g, dtype=dtype)
        kv, mass = kv0.clone(), mass0.clone()
        assert kernels.add_sparse_key_sums(k, v, kv, mass) is False
        assert torch.equal(kv, kv0) and torch.equal(mass, mass0)  # nothing added, not even in part
    # No keys: nothing to do, done.
    kv0, mass0 = torch.randn(2, 4, 3, dtype=dtype), torch.randn(2, 4, dtype=dtype)
    kv, mass = kv0.clone(), mass0.clone()
    assert kernels.add_sparse_key_sums(torch.zeros(2, 0, 4, dtype=dtype), torch.zeros(2, 0, 3, dtype=dtype), kv, mass) is True
    assert torch.equal(kv, kv0) and torch.equal(mass, mass0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B", [1, 3])
def test_gather_rows_into_a_slot_of_a_wider_tensor(dtype, B):
    g = torch.Generator().manual_seed(B)
    n, m, e, width = 20, 50, 4, 11
    table_tokens = torch.randn(B, n, width, generator=g, dtype=dtype)
    table = table_tokens[..., 2 : 2 + e]  # the values: a slice of the keys' tokens
    index = torch.randint(0, n, (B, m), generator=g)
    tokens = torch.randn(B, m, width, generator=g, dtype=dtype)
    before = tokens.clone()
    out = tokens[..., 5 : 5 + e]
    assert kernels.gather_rows(table, index, out) is None
    want = table[torch.arange(B).unsqueeze(-1), index]
    assert torch.equal(out, want)
    assert torch.equal(tokens[..., 5 : 5 + e], want)
    assert torch.equal(tokens[..., :5], before[..., :5]) and torch.equal(tokens[..., 5 + e :], before[..., 5 + e :])
    # A block of rows of the stream, as the in-place layer hands it over.
    tokens = before.clone()
    kernels.gather_rows(table, index[:, 10:30], tokens[:, 10:30, 5 : 5 + e])
    assert torch.equal(tokens[:, 10:30, 5 : 5 + e], want[:, 10:30])
    untouched = before.clone()
    untouched[:, 10:30, 5 : 5 + e] = want[:, 10:30]
    assert torch.equal(tokens, untouched)


@pytest.mark.parametrize("total, workers", [(10, 3), (5, 4), (7, 7), (1024, 2), (3, 1)])
def test_slots_take_contiguous_runs_that_cover_every_item_once(total, workers):
    runs = [list(kernels._share.py_func(w, workers, total)) for w in range(workers)]
    assert [item for run in runs for item in run] == list(range(total))
    assert all(len(run) <= -(-total // workers) for run in runs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B, m", [(1, 2 * kernels.INERTIA_ROWS + 5), (5, 30)], ids=["one-task-over-slots", "many-tasks"])
def test_inertia_is_the_objective_of_the_labels_summed_in_float64(dtype, B, m):
    # d = 8: one task of 8 197 points is enough work for two threads, three blocks between them.
    g = torch.Generator().manual_seed(B)
    X, C = torch.randn(B, m, 8, generator=g, dtype=dtype) * 100, torch.randn(B, 6, 8, generator=g, dtype=dtype)
    labels = torch.randint(0, 6, (B, m), generator=g)
    want = (X.double() - C.double()[torch.arange(B).unsqueeze(-1), labels]).square().sum(dim=(1, 2))
    got = kernels.inertia(X, C, labels)
    assert got.dtype == torch.float64 and got.shape == (B,)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=0)
    # Strided points (a slot of a token stream) read as they are.
    tokens = torch.zeros(B, m, 12, dtype=dtype)
    tokens[..., 2:10] = X
    torch.testing.assert_close(kernels.inertia(tokens[..., 2:10], C, labels), want, rtol=1e-13, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("B", "m", "d"), [(1, 8197, 8), (256, 100, 2), (5, 1, 3)])
def test_mean_square_deviation_is_the_hosts_in_another_order_of_sums(dtype, B, m, d):
    # One task of 8 197 points spreads over both threads. The float64 sums differ from the
    # host's in the last bits at most, which rounding to float32 hides for these tasks.
    X = torch.randn(B, m, d, generator=torch.Generator().manual_seed(m), dtype=dtype) * 3 + 5
    got, want = kernels.mean_square_deviation(X), host.mean_square_deviation(X)
    assert got.dtype == dtype and got.shape == (B,)
    torch.testing.assert_close(got, want, rtol=0 if dtype == torch.float32 else 1e-14, atol=0)
    torch.testing.assert_close(kernels.mean_square_deviation(X.transpose(1, 2).contiguous().transpose(1, 2)), got, rtol=0, atol=0)


def test_gather_rows_refuses_an_out_with_strided_coordinates():
    table = torch.randn(2, 6, 3, dtype=torch.float64)
    index = torch.randint(0, 6, (2, 4))
    for out in [torch.zeros(2, 4, 6, dtype=torch.float64)[..., ::2], torch.zeros(2, 3, 4, dtype=torch.float64).transpose(1, 2)]:
        assert out.stride(-1) != 1
        with pytest.raises(ValueError):
            kernels.gather_rows(table, index, out)
        assert not out.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cluster_attention_equals_linear_attention_over_the_summed_keys(dtype):
    g = torch.Generator().manual_seed(5)
    B, r, m, e, f, width = 3, 6, 7, 5, 3, 10
    keys = torch.rand(B, r, e, generator=g, dtype=dtype)
    keys[:, :, 0] = 0  # no key has weight on coordinate 0: a query on it alone matches nothing
    sums, sizes = torch.randn(B, r, f, generator=g, dtype=dtype), torch.rand(B, r, generator=g, dtype=dtype) + 1
    tokens = torch.randn(B, m, width, generator=g, dtype=dtype)
    q = tokens[..., f : f + e]
    q[:, 0] = 0
    q[:, 0, 0] = 1
    before = tokens.clone()
    own, out = tokens[..., :f], tokens[..., :f]  # the update overwrites the very value it keeps
    kv, mass = ktframe.fast.ClusterSums(keys, sums, sizes).totals()
    total = torch.bmm(before[..., f : f + e], mass.unsqueeze(-1))
    want = torch.bmm(before[..., f : f + e], kv) / torch.where(total == 0, torch.ones_like(total), total)
    want[:, 0] = before[:, 0, :f]
    assert kernels.cluster_attention(q, keys, sums, sizes, own, out) is None
    torch.testing.assert_close(tokens[..., :f], want, rtol=4 * torch.finfo(dtype).eps, atol=0)
    assert torch.equal(tokens[..., f:], before[..., f:])
    # Skipped tasks are left as they are; the others get the same update again.
    again = before.clone()
    kernels.cluster_attention(again[..., f : f + e], keys, sums, sizes, again[..., :f], again[..., :f], torch.tensor([False, True, False]))
    assert torch.equal(again[1], before[1]) and torch.equal(again[[0, 2]], tokens[[0, 2]])


def test_usable_only_for_cpu_floats_without_autograd(monkeypatch):
    x = torch.randn(2, 3)
    monkeypatch.delenv(kernels.OFF_ENV, raising=False)
    assert kernels.usable(x, x.double())
    assert not kernels.usable(x, x.half())
    assert not kernels.usable(torch.ones(2, dtype=torch.long))
    w = x.clone().requires_grad_()
    assert not kernels.usable(w)
    with torch.no_grad():
        assert kernels.usable(w)
    monkeypatch.setenv(kernels.OFF_ENV, "0")
    assert kernels.usable(x)
    monkeypatch.setenv(kernels.OFF_ENV, "1")
    assert not kernels.usable(x)


def assert_same_map_output(got, want):
    assert torch.equal(got.index, want.index)
    assert got.weights is None and want.weights is None and got.stay is None and want.stay is None
    assert (got.ties is None) == (want.ties is None)
    if got.ties is not None:
        assert torch.equal(got.ties[0], want.ties[0])
        torch.testing.assert_close(got.ties[1], want.ties[1], atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("keys_major", [False, True])
def test_hardmax_with_and_without_kernels(monkeypatch, dtype, ties, keys_major):
    g = torch.Generator().manual_seed(int(ties))
    B, m, n = 2, 40, 33
    if ties:
        logits = torch.randint(-3, 2, (B, n, m), generator=g).to(dtype)
    else:
        logits = torch.randn(B, n, m, generator=g, dtype=dtype)
    logits = logits.transpose(1, 2) if keys_major else logits.transpose(1, 2).contiguous()
    monkeypatch.delenv(kernels.OFF_ENV, raising=False)
    assert kernels.usable(logits)
    with_kernels = Hardmax()(logits)
    monkeypatch.setenv(kernels.OFF_ENV, "1")
    without = Hardmax()(logits)
    assert (with_kernels.ties is not None) == ties
    assert_same_map_output(with_kernels, without)
    torch.testing.assert_close(dense(with_kernels, n, dtype), plain_hardmax(logits), atol=0, rtol=0)


def test_hardmax_of_a_nan_row_with_and_without_kernels(monkeypatch):
    logits = torch.randn(1, 6, 9, dtype=torch.float64)
    logits[0, 2, 4] = float("nan")
    logits[0, 4, [1, 7]] = logits[0, 4].amax() + 1.0  # a tie
    monkeypatch.delenv(kernels.OFF_ENV, raising=False)
    with_kernels = Hardmax()(logits)
    monkeypatch.setenv(kernels.OFF_ENV, "1")
    without = Hardmax()(logits)
    assert with_kernels.ties[0].tolist() == without.ties[0].tolist() == [[0, 2], [0, 4]]
    torch.testing.assert_close(with_kernels.ties[1], without.ties[1], atol=0, rtol=0, equal_nan=True)
    assert torch.isnan(with_kernels.ties[1][0]).all()  # as the plain map: NaN in, NaN out
    untied = torch.tensor([0, 1, 3, 5])
    assert torch.equal(with_kernels.index[0, untied], without.index[0, untied])
    assert int(with_kernels.index.max()) < 9  # a tied row's index is clamped into range either way


def counting(monkeypatch, names):
    """Count the calls of the named kernels (which still run)."""
    calls = dict.fromkeys(names, 0)
    for name in names:

        def counted(*args, _name=name, _real=getattr(kernels, name), **kwargs):  # noqa: B008 (bound per name on purpose)
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernels, name, counted)
    return calls


@pytest.mark.parametrize("B", [1, 3])
@pytest.mark.parametrize("cache_block", [None, 64], ids=["default-blocks", "tiny-blocks"])
@pytest.mark.parametrize("by_cluster", [True, False], ids=["by-cluster", "in-blocks"])
def test_exact_model_with_and_without_kernels(monkeypatch, B, cache_block, by_cluster):
    if cache_block is not None:
        monkeypatch.setattr(ktframe.fast.model, "CACHE_BLOCK", cache_block)
    g = torch.Generator().manual_seed(10 + B)
    X, _ = mixture(B, 300, 3, 5, generator=g, dtype=torch.float64)
    C0 = reference.kmeans_plusplus(X, 5, g)
    model = ktframe.build_model("lloyd", d=3, k=5, n_layers=4, reset="identity", dtype=torch.float64)
    if not by_cluster:  # the layer's general path: blocks of rows, key sums of the one-hot slot
        layer = model.layers[0]
        layer.plan = dataclasses.replace(layer.plan, by_cluster=False, all_steps=False)
    names = ["argmax_count", "argmax_dot", "add_sparse_key_sums", "gather_rows", "cluster_attention"]
    calls = counting(monkeypatch, names)
    monkeypatch.delenv(kernels.OFF_ENV, raising=False)
    with torch.no_grad():
        with_kernels = model(X, C0)
    # The kernels did the work: the arg-max, and either the center update's key sums by cluster
    # in its pass, or the assignments gathered into the stream and their key sums in blocks.
    assert calls["argmax_dot"] > 0
    assert calls["add_sparse_key_sums"] == 0 if by_cluster else calls["add_sparse_key_sums"] > 0 and calls["gather_rows"] > 0
    assert (calls["cluster_attention"] > 0) == by_cluster
    monkeypatch.setenv(kernels.OFF_ENV, "1")
    calls.update(dict.fromkeys(calls, 0))
    with torch.no_grad():
        without = model(X, C0)
    assert not any(calls.values())
    for field in ["centers", "assignments", "trajectory"]:
        torch.testing.assert_close(getattr(with_kernels, field), getattr(without, field), atol=1e-12, rtol=0)
    assert torch.equal(with_kernels.labels, without.labels)
    want = reference.lloyd(X, C0, 4)
    for got in [with_kernels, without]:
        torch.testing.assert_close(got.trajectory, want.trajectory, atol=1e-9, rtol=0)
        torch.testing.assert_close(got.centers, want.centers, atol=1e-9, rtol=0)
        torch.testing.assert_close(got.assignments, want.assignments, atol=1e-9, rtol=0)
        assert torch.equal(got.labels, want.labels)


def test_center_keys_by_cluster_from_value_rows_equal_those_read_off_the_center_stream():
    # Where the value rows are the centers' own index slot, the layer reads the keys by cluster
    # straight off the center stream; otherwise it builds a token per value row. Both must agree.
    g = torch.Generator().manual_seed(4)
    X, _ = mixture(3, 200, 2, 6, generator=g, dtype=torch.float64)
    C0 = reference.kmeans_plusplus(X, 6, g)
    model = ktframe.build_model("lloyd", d=2, k=6, n_layers=3, reset="identity", dtype=torch.float64)
    with torch.no_grad():
        read_off = model(X, C0)
        for layer in model.layers:
            layer.point_cross.v.unit = False  # multiplies by its scales of 1 instead: same rows
        ktframe.fast.accelerate(model)
        assert not model.layers[0].plan.keys_in_centers and model.layers[0].plan.by_cluster
        built = model(X, C0)
    assert torch.equal(built.trajectory, read_off.trajectory) and torch.equal(built.assignments, read_off.assignments)


def test_ties_in_the_assignment_by_index_are_shared_as_without_kernels(monkeypatch):
    # Task 0: the origin is at distance 1 from three centers (the other points pin them), so the
    # kernel finds no single winner there and the map shares it three ways; task 1 has no tie;
    # in task 2 two points on the symmetry axis are shared between two centers.
    X = torch.tensor(
        [
            [[0.0, 0.0], [2.0, 0.0], [-2.0, 0.0], [0.0, 2.0]],
            [[0.3, 0.1], [2.2, 0.4], [-1.7, 0.2], [0.1, 2.5]],
            [[0.0, 0.0], [0.0, 0.5], [2.0, 0.0], [-2.0, 0.0]],
        ],
        dtype=torch.float64,
    )
    C0 = torch.tensor([[[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]]] * 2 + [[[1.0, 0.0], [-1.0, 0.0], [0.0, 5.0]]], dtype=torch.float64)
    model = ktframe.build_model("lloyd", d=2, k=3, n_layers=2, reset="identity", dtype=torch.float64)
    calls = counting(monkeypatch, ["add_sparse_key_sums"])
    decided = []
    map_rows = ktframe.fast.HeadPlan.map_rows
    monkeypatch.setattr(
        ktframe.fast.HeadPlan,
        "map_rows",
        lambda plan, head, q, k, task, row: decided.append(torch.stack([task, row], 1).tolist()) or map_rows(plan, head, q, k, task, row),
    )
    monkeypatch.delenv(kernels.OFF_ENV, raising=False)
    with torch.no_grad():
        with_kernels = model(X, C0)
    # Both layers by cluster, the tied point decided alone through the map.
    assert calls["add_sparse_key_sums"] == 0 and decided == [[[0, 0], [2, 0], [2, 1]]] * 2
    monkeypatch.setenv(kernels.OFF_ENV, "1")
    with torch.no_grad():
        without = model(X, C0)
    want = reference.lloyd(X, C0, 2)
    torch.testing.assert_close(with_kernels.assignments[0, 0], torch.full((3,), 1 / 3, dtype=torch.float64), atol=1e-15, rtol=0)
    torch.testing.assert_close(with_kernels.assignments[2, :2], torch.tensor([[0.5, 0.5, 0.0]] * 2, dtype=torch.float64), atol=1e-15, rtol=0)
    for got in [with_kernels, without]:
        torch.testing.assert_close(got.trajectory, want.trajectory, atol=1e-12, rtol=0)
        torch.testing.assert_close(got.assignments, want.assignments, atol=1e-12, rtol=0)
        assert torch.equal(got.labels, want.labels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B, m, n, d", [(3, 200, 8, 2), (1, 50, 1, 1), (2, 7, 30, 8), (2, 300, 40, 33)])
def test_argmax_dot_equals_the_arg_max_of_its_logits(dtype, B, m, n, d):
    g = torch.Generator().manual_seed(B * 1000 + m + n + d)
    q, k = torch.randn(B, m, d, generator=g, dtype=dtype), torch.randn(B, n, d, generator=g, dtype=dtype)
    k[:, 0] = q[:, 0]  # query 0 sits on key 0 ...
    k[:, -1] = k[:, 0]  # ... which has an exact duplicate: every query nearest to it ties
    index, undecided = kernels.argmax_dot(q, k, 2.0, -1.0)[:2]
    assert undecided == int((index < 0).sum())
    logits = 2.0 * q @ k.transpose(1, 2) - k.pow(2).sum(-1).unsqueeze(1)
    winners = logits == logits.amax(-1, keepdim=True)
    # Scores summed in another order may differ in the last bits: compare where the best key
    # wins clearly, and where the duplicate pair (which ties exactly in both sums) wins.
    gap = logits.topk(2, dim=-1).values.diff(dim=-1).abs().squeeze(-1) if n > 2 else torch.full((B, m), 1.0, dtype=dtype)
    single = (winners.sum(-1) == 1) & (gap > 1e-4)
    assert torch.equal(index[single], logits.argmax(-1)[single])
    if n > 1:
        pair = winners[..., 0] & winners[..., -1]
        assert bool(pair.any()) and bool((index[pair] == -1).all())


@pytest.mark.parametrize("d", [2, 12])
def test_argmax_dot_leaves_nan_rows_undecided(d):
    q, k = torch.randn(1, 4, d), torch.randn(1, 5, d)
    q[0, 2, 1] = float("nan")
    k[0, 3, 0] = float("nan")  # a NaN logit in every row: none of them is decided
    found = kernels.argmax_dot(q, k, 2.0, -1.0)
    assert found.undecided == 4 and bool((found.index == -1).all())
    k[0, 3, 0] = 0.0
    found = kernels.argmax_dot(q, k, 2.0, -1.0)
    assert found.undecided == 1 and found.index[0, 2] == -1 and bool((found.index[0, [0, 1, 3]] >= 0).all())


@pytest.mark.parametrize("d", [2, 12])
def test_argmax_dot_settles_float32_near_ties_exactly(d):
    # Keys 1 and 2 are key 0 moved by about one float32 rounding: every query nearest to them
    # is within the float32 bound of a tie. The kernel settles it in float64 (exact products),
    # as the exact arithmetic of these float32 numbers does; key 3, a duplicate of key 0, ties
    # it exactly and stays undecided.
    g = torch.Generator().manual_seed(d)
    k = torch.randn(1, 5, d, generator=g)
    k[0, 1] = k[0, 0] * (1 + 2**-23)
    k[0, 2] = k[0, 0] * (1 - 2**-23)
    q = k[0, 0] + 1e-3 * torch.randn(1, 400, d, generator=g)
    found = kernels.argmax_dot(q, k[:, :3], 2.0, -1.0)
    q64, k64 = q.double(), k[:, :3].double()
    logits = 2.0 * q64 @ k64.transpose(1, 2) - k64.pow(2).sum(-1).unsqueeze(1)
    top = logits.topk(2, dim=-1).values
    clear = top[..., 0] - top[..., 1] > 1e-12 * logits.abs().amax()
    assert bool(clear.any())
    assert torch.equal(found.index[clear], logits.argmax(-1)[clear])
    assert found.undecided == int((found.index < 0).sum())
    # Far below what float32 rounding can tell apart: only the float64 pass decides these.
    assert float((top[..., 0] - top[..., 1]).median()) < 1e-3 * 4 * (d + 3) * 2**-24 * float(logits.abs().amax())
    duplicate = kernels.argmax_dot(q, torch.cat([k[:, :1], k[:, :1]], dim=1), 2.0, -1.0)
    assert duplicate.undecided == 400 and bool((duplicate.index == -1).all())


@pytest.mark.parametrize("d", [2, 12])
def test_argmax_dot_leaves_logits_that_may_overflow_undecided(d):
    # a (q·k) of about 1e40 overflows float32: no rounding bound holds there, so the kernel
    # decides none of these queries (the map sees the infinities PyTorch computes).
    g = torch.Generator().manual_seed(d)
    q, k = 1e30 * torch.rand(2, 5, d, generator=g), 1e10 * torch.randn(2, 3, d, generator=g)
    q[1], k[1] = q[1] / 1e30, k[1] / 1e10  # task 1 is ordinary
    found = kernels.argmax_dot(q, k, 2.0, -1.0)
    assert bool((found.index[0] == -1).all()) and bool((found.index[1] >= 0).all()) and found.undecided == 5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B, m, n, d", [(3, 200, 8, 2), (2, 300, 40, 33), (1, 600, 5, 12)])
def test_argmax_dot_sums_and_gathers_by_clear_winner(dtype, B, m, n, d):
    g = torch.Generator().manual_seed(B + m + n + d)
    q, k = torch.randn(B, m, d, generator=g, dtype=dtype), torch.randn(B, n, d, generator=g, dtype=dtype)
    k[:, -1] = k[:, 0]  # a duplicate key: the queries nearest to it have no clear winner
    tokens = torch.randn(B, m, 4 + d + 6, generator=g, dtype=dtype)  # values and out are slots of these rows
    values, out = tokens[..., 4 : 4 + d], tokens[..., 4 + d :]
    table = torch.randn(B, n, 6, generator=g, dtype=dtype)
    before = tokens.clone()
    plain = kernels.argmax_dot(q, k, 2.0, -1.0)
    found = kernels.argmax_dot(q, k, 2.0, -1.0, values=values, gather=(table, out), track_moved=True)
    assert torch.equal(found.index, plain.index) and found.undecided == plain.undecided
    clear = found.index >= 0
    assert bool(clear.any()) and not bool(clear.all())
    one_hot = torch.nn.functional.one_hot(found.index.clamp(0, n - 1), n).to(dtype) * clear.unsqueeze(-1)
    torch.testing.assert_close(found.sums, one_hot.transpose(1, 2) @ values, atol=1e-4 if dtype == torch.float32 else 1e-12, rtol=0)
    assert torch.equal(found.sizes, one_hot.sum(1))
    for b in range(B):
        assert torch.equal(out[b, clear[b]], table[b, found.index[b, clear[b]]])
        assert torch.equal(out[b, ~clear[b]], before[b, ~clear[b], 4 + d :])  # left to the caller
    assert torch.equal(tokens[..., : 4 + d], before[..., : 4 + d])  # nothing outside the slot
    assert torch.equal(found.moved, (tokens != before).flatten(1).any(1)) and bool(found.moved.all())
    # The same rows again change nothing, except a row whose old value was no longer there.
    out[0, int(clear[0].nonzero()[0])] += 1
    again = kernels.argmax_dot(q, k, 2.0, -1.0, values=values, gather=(table, out), track_moved=True)
    assert again.moved.tolist() == [True] + [False] * (B - 1)
    assert kernels.argmax_dot(q, k, 2.0, -1.0, values=values, gather=(table, out)).moved is None


@pytest.mark.parametrize("B, m, d", [(4, 200, 2), (3, 700, 3), (3, 300, 12)])
def test_argmax_dot_leaves_skipped_tasks_alone(B, m, d):
    g = torch.Generator().manual_seed(B * m + d)
    q, k = torch.randn(B, m, d, generator=g), torch.randn(B, 6, d, generator=g)
    k[0, -1] = k[0, 0]  # ties in task 0, which is not skipped: its undecided queries count
    tokens = torch.randn(B, m, d + 6, generator=g)
    table = torch.randn(B, 6, 6, generator=g)
    full = tokens.clone()
    want = kernels.argmax_dot(q, k, 2.0, -1.0, values=full[..., :d], gather=(table, full[..., d:]), track_moved=True)
    skip = torch.zeros(B, dtype=torch.bool)
    skip[1] = True
    before = tokens.clone()
    got = kernels.argmax_dot(q, k, 2.0, -1.0, values=tokens[..., :d], gather=(table, tokens[..., d:]), skip=skip, track_moved=True)
    assert got.undecided == int((want.index[~skip] < 0).sum()) > 0
    assert torch.equal(got.index[~skip], want.index[~skip])
    assert torch.equal(got.sums[1], torch.zeros(6, d)) and torch.equal(got.sizes[1], torch.zeros(6))
    assert torch.equal(got.sums[~skip], want.sums[~skip]) and torch.equal(got.sizes[~skip], want.sizes[~skip])
    assert torch.equal(tokens[1], before[1]) and torch.equal(tokens[~skip], full[~skip])
    assert not bool(got.moved[1]) and torch.equal(got.moved[~skip], want.moved[~skip])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B, m, n, d", [(3, 200, 8, 2), (2, 300, 40, 33)])
def test_argmax_dot_leaves_unread_the_rows_it_knows(dtype, B, m, n, d):
    # Step after step with the index of the step before as `known`: the same index, sums, rows
    # and moves as without it, and a query that wins its known key again is not read at all.
    g = torch.Generator().manual_seed(B + m + n + d)
    k = torch.randn(B, n, d, generator=g, dtype=dtype)
    k[:, -1] = k[:, 0]  # undecided queries, whose rows the caller writes: not known to the kernel
    table = torch.randn(B, n, 6, generator=g, dtype=dtype)
    plain_out, out = torch.zeros(B, m, 6, dtype=dtype), torch.zeros(B, m, 6, dtype=dtype)
    known = torch.full((B, m), -1, dtype=torch.int64)
    q = torch.randn(B, m, d, generator=g, dtype=dtype)
    for step in range(4):
        q = q + 0.3 * torch.randn(B, m, d, generator=g, dtype=dtype) * (step > 0)  # some queries change winner
        want = kernels.argmax_dot(q, k, 2.0, -1.0, values=q, gather=(table, plain_out), track_moved=True)
        got = kernels.argmax_dot(q, k, 2.0, -1.0, values=q, gather=(table, out), track_moved=True, known=known)
        assert got.index is known and torch.equal(known, want.index) and got.undecided == want.undecided > 0
        assert torch.equal(got.sums, want.sums) and torch.equal(got.sizes, want.sizes) and torch.equal(got.moved, want.moved)
        assert torch.equal(out, plain_out)
    b, i = (known >= 0).nonzero()[0].tolist()
    out[b, i] += 1  # a row the kernel knows: not compared, so left as it is
    again = kernels.argmax_dot(q, k, 2.0, -1.0, gather=(table, out), track_moved=True, known=known)
    assert not bool(again.moved[b]) and torch.equal(out[b, i], table[b, known[b, i]] + 1)
    with pytest.raises(ValueError, match="known index"):
        kernels.argmax_dot(q, k, 2.0, -1.0, gather=(table, out), known=known[:, :-1])


@pytest.mark.parametrize("B, m", [(1, 5000), (300, 40)], ids=["one-task-many-tiles", "many-one-tile-tasks"])
def test_argmax_dot_sums_do_not_depend_on_which_thread_ran_a_tile(B, m):
    # Slots of tiles run on whichever thread; the sums must come out bit for bit the same.
    g = torch.Generator().manual_seed(m)
    q, k = torch.randn(B, m, 3, generator=g), torch.randn(B, 7, 3, generator=g)
    values = torch.randn(B, m, 5, generator=g)
    first = kernels.argmax_dot(q, k, 2.0, -1.0, values=values)
    for _ in range(6):
        again = kernels.argmax_dot(q, k, 2.0, -1.0, values=values)
        assert torch.equal(again.index, first.index)
        assert torch.equal(again.sums, first.sums) and torch.equal(again.sizes, first.sizes)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("d", [2, 12])
def test_argmax_dot_gathers_bits_and_moves_a_task_only_where_a_bit_changes(dtype, d):
    # A gathered row is compared with the row it replaces bit for bit: -0.0 in place of +0.0 is
    # a change, and a NaN where the table holds the very same NaN is none.
    q, k = torch.zeros(2, 1, d, dtype=dtype), torch.zeros(2, 2, d, dtype=dtype)
    q[..., 0], k[:, 0, 0], k[:, 1, 0] = 1.0, 1.0, -1.0  # every query's winner is key 0
    table = torch.tensor([[0.0, 1.0], [5.0, 6.0]], dtype=dtype).expand(2, 2, 2).clone()
    table[1, 0, 1] = float("nan")
    out = torch.stack([torch.tensor([[-0.0, 1.0]], dtype=dtype), table[1, :1].clone()])
    found = kernels.argmax_dot(q, k, 2.0, -1.0, gather=(table, out), track_moved=True)
    assert found.index.tolist() == [[0], [0]]
    assert found.moved.tolist() == [True, False]
    bits = torch.int64 if dtype == torch.float64 else torch.int32
    assert torch.equal(out.view(bits), table[:, :1].view(bits))  # +0.0 now, and the same NaN


def test_argmax_dot_refuses_to_gather_rows_of_another_dtype():
    q, k = torch.randn(1, 5, 3), torch.randn(1, 4, 3)
    with pytest.raises(ValueError, match="dtype"):
        kernels.argmax_dot(q, k, 2.0, -1.0, gather=(torch.randn(1, 4, 2, dtype=torch.float64), torch.randn(1, 5, 2)))


def test_argmax_dot_refuses_an_out_with_strided_coordinates():
    q, k = torch.randn(1, 5, 3), torch.randn(1, 4, 3)
    with pytest.raises(ValueError, match="contiguous"):
        kernels.argmax_dot(q, k, 2.0, -1.0, gather=(torch.randn(1, 4, 2), torch.randn(1, 2, 5).transpose(1, 2)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tasks_changed_marks_the_tasks_with_any_other_number(dtype):
    g = torch.Generator().manual_seed(3)
    a = torch.randn(6, 5, 4, generator=g, dtype=dtype)
    b = a.clone()
    b[1, 4, 3] += 1  # the last number of a task
    b[2, 0, 0] = -b[2, 0, 0]
    a[3, 2, 1] = b[3, 2, 1] = float("nan")  # NaN equals nothing, itself included
    a[4, 1, 1], b[4, 1, 1] = 0.0, -0.0  # equal numbers
    view = torch.randn(6, 5, 9, generator=g, dtype=dtype)[..., 2:6]  # strided rows
    view.copy_(b)
    assert kernels.tasks_changed(a, view).tolist() == [False, True, True, True, False, False]
    assert kernels.tasks_changed(a, a.clone()).tolist() == [False, False, False, True, False, False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shifts_beyond_is_true_only_where_every_task_surely_goes_on(dtype):
    g = torch.Generator().manual_seed(4)
    before = torch.randn(5, 16, 3, generator=g, dtype=dtype)
    after = before + 0.1 * torch.randn(5, 16, 3, generator=g, dtype=dtype)
    shift = host.squared_shift(before, after).double()  # the rule's shift, in the centers' dtype
    assert kernels.shifts_beyond(before, after, shift / 2)
    assert not kernels.shifts_beyond(before, after, shift * 2)
    at = shift / 2
    at[3] = shift[3]  # one task exactly at its bound, as its dtype rounds the shift: it may stop
    assert not kernels.shifts_beyond(before, after, at)
    assert kernels.shifts_beyond(before, after, at, skip=torch.tensor([False, False, False, True, False]))
    at[3] = shift[3] * (1 - 1e-3)  # beyond it by more than rounding
    assert kernels.shifts_beyond(before, after, at)
    still = after.clone()
    still[1] = before[1]  # a task that did not move stops at any bound
    assert not kernels.shifts_beyond(before, still, torch.zeros(5, dtype=torch.float64))
    after[2, 0, 0] = float("nan")  # a NaN shift goes on by the rule (NaN <= bound is false), left to it
    assert not kernels.shifts_beyond(before, after, shift / 2)


THREADS_PROBE = """
import os, torch
from ktframe.kernels import cpu as kernels
assert torch.get_num_threads() == int(os.environ["OMP_NUM_THREADS"])
q, k = torch.rand(64, 600, 3), torch.rand(64, 30, 3)
found = kernels.argmax_dot(q, k, 2.0, -1.0, values=q)
print(torch.get_num_threads(), kernels._thread_count(q.numel() * 30), kernels._thread_count(10), int(found.sizes.sum()))
"""


@pytest.mark.parametrize("budget", [1, 2])
def test_kernels_take_pytorchs_thread_budget_and_leave_it_as_it_was(budget):
    # A fresh process: numba's pool starts once per process, and starting it sets the OpenMP
    # runtime's thread count, which PyTorch shares; a multirun's --jobs set OMP_NUM_THREADS.
    env = {**os.environ, "OMP_NUM_THREADS": str(budget), "NUMBA_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", THREADS_PROBE], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    torch_threads, large, small, assigned = map(int, done.stdout.split())
    assert (torch_threads, large, small, assigned) == (budget, budget, 1, 64 * 600)


def test_small_kernels_run_on_the_calling_thread_and_large_ones_on_pytorchs_threads():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert kernels._thread_count(1 << 24) == 1
        torch.set_num_threads(2)
        assert kernels._thread_count(kernels.SERIAL_WORK - 1) == 1
        assert kernels._thread_count(1 << 24) == min(2, numba.config.NUMBA_NUM_THREADS)
    finally:
        torch.set_num_threads(before)
