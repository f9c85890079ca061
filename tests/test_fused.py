"""The fused attention path (PyTorch's scaled_dot_product_attention, with the Euclidean score as a
dot product plus a per-key bias) computes what the explicit path computes: logits, softmax, product."""

from __future__ import annotations

import copy
import dataclasses

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ktframe
from ktframe.transformer.model import AttentionHead


def fused(head: torch.nn.Module) -> bool:
    return isinstance(head, AttentionHead) and head.plan.route == "fused-softmax"


def explicit(model: torch.nn.Module) -> torch.nn.Module:
    """The same model with every fused head's plan switched to the explicit path."""
    twin = copy.deepcopy(model)
    for head in twin.modules():
        if fused(head):
            head.plan = dataclasses.replace(head.plan, route="blocked")
    return twin


def fused_heads(model: torch.nn.Module) -> int:
    return sum(1 for head in model.modules() if fused(head))


@st.composite
def problems(draw):
    B, n, d = draw(st.integers(1, 3)), draw(st.integers(1, 70)), draw(st.integers(1, 6))
    k = draw(st.integers(1, min(n, 6)))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, n, d, generator=g, dtype=torch.float64) * draw(st.sampled_from([0.1, 1.0, 5.0]))
    C0 = X[:, torch.randperm(n, generator=g)[:k]].clone()
    return X, C0, seed


@settings(max_examples=30, deadline=None)
@given(problem=problems(), embedding=st.sampled_from(["onehot", "none"]), score=st.sampled_from(["euclidean", "dot"]), steps=st.integers(1, 3))
def test_learned_model_fused_equals_explicit(problem, embedding, score, steps):
    X, C0, seed = problem
    torch.manual_seed(seed)
    model = ktframe.build_model("learned", d=X.shape[-1], k=C0.shape[1], n_layers=1, dtype=torch.float64, embedding=embedding, score=score).eval()
    assert fused_heads(model) == 4
    with torch.no_grad():
        got = model(X, C0, n_steps=steps, reembed=True)
        want = explicit(model)(X, C0, n_steps=steps, reembed=True)
    torch.testing.assert_close(got.trajectory, want.trajectory, atol=1e-10, rtol=1e-10)


@settings(max_examples=20, deadline=None)
@given(problem=problems(), gamma=st.sampled_from([1.0, 10.0, 100.0, 1e4]))
def test_soft_lloyd_fused_heads_equal_explicit(problem, gamma):
    # The hand-built construction at finite gamma: its softmax heads take the fused path. Each
    # head is compared on the tokens of every layer of a run. (Whole trajectories are not: the
    # soft center update divides by a cluster's soft mass, and a nearly empty cluster turns
    # rounding-level differences of the heads into arbitrarily large ones of its center.)
    X, C0, _ = problem
    k = C0.shape[1]
    model = ktframe.build_model("lloyd", d=X.shape[-1], k=k, n_layers=3, gamma=gamma, dtype=torch.float64)
    assert fused_heads(model) > 0
    with torch.no_grad():
        points, centers = model.embedding.points(X, k), model.embedding.centers(C0)
        for step in range(3):
            layer = model.layer(step)
            for head, queries, keys in [(layer.point_cross, points, centers), (layer.point_self, points, points), (layer.center_self, centers, centers)]:
                if fused(head):
                    got = head(queries, keys)
                    plan, head.plan = head.plan, dataclasses.replace(head.plan, route="blocked")
                    want = head(queries, keys)
                    head.plan = plan
                    torch.testing.assert_close(got, want, atol=1e-9, rtol=1e-9)
            points, centers = layer(points, centers)


def test_gradients_agree():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(4, 50, 5, generator=g, dtype=torch.float64)
    C0 = X[:, :3].clone()
    torch.manual_seed(0)
    model = ktframe.build_model("learned", d=5, k=3, n_layers=1, dtype=torch.float64, dropout=0.0).train()
    twin = explicit(model)
    grads = []
    for m in (model, twin):
        m.zero_grad()
        m(X, C0, n_steps=2, reembed=True).centers.pow(2).sum().backward()
        grads.append([p.grad for p in m.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8)


def test_float32_agrees_to_rounding():
    g = torch.Generator().manual_seed(1)
    X = torch.rand(8, 300, 16, generator=g)
    C0 = X[:, :10].clone()
    torch.manual_seed(1)
    model = ktframe.build_model("learned", d=16, k=10, n_layers=1).eval()
    with torch.no_grad():
        got, want = model(X, C0, n_steps=5, reembed=True), explicit(model)(X, C0, n_steps=5, reembed=True)
    torch.testing.assert_close(got.trajectory, want.trajectory, atol=1e-4, rtol=1e-4)
