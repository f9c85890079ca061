"""On a CUDA device, ktframe computes what it computes on the CPU. Skipped where no CUDA device
exists; ``benchmarks/gpu.sh`` runs them (``pytest -m cuda``) on a GPU machine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ktframe
from ktframe.core import reference
from ktframe.fast import attention, seeding
from ktframe.fast import lloyd as fast_lloyd

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def blobs(tasks: int = 4, n: int = 300, d: int = 5, k: int = 6, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    means = torch.rand(tasks, k, d, generator=g, dtype=torch.float64) * 10
    which = torch.randint(k, (tasks, n), generator=g)
    X = torch.gather(means, 1, which.unsqueeze(-1).expand(-1, -1, d)) + 0.3 * torch.randn(tasks, n, d, generator=g, dtype=torch.float64)
    return X.to(dtype)


@pytest.mark.parametrize("variant, options", [("lloyd", {}), ("lloyd", {"reset": "identity"}), ("soft", {"gamma": 20.0})])
def test_a_variant_on_cuda_computes_what_it_computes_on_cpu(variant, options):
    X = blobs()
    C0 = X[:, :6].clone()
    model = ktframe.build_model(variant, d=5, k=6, n_layers=8, dtype="float64", **options)
    with torch.no_grad():
        on_cpu = model(X, C0)
        on_gpu = model.to("cuda")(X.cuda(), C0.cuda())
    torch.testing.assert_close(on_gpu.trajectory.cpu(), on_cpu.trajectory, rtol=0, atol=1e-9)


def test_fast_lloyd_and_seeding_on_cuda_match_the_reference():
    X = blobs().cuda()
    C0 = reference.kmeans_plusplus(X, 6, torch.Generator(device="cuda").manual_seed(0))
    torch.testing.assert_close(fast_lloyd.lloyd(X, C0, 5).trajectory, reference.lloyd(X, C0, 5).trajectory, rtol=0, atol=1e-12)
    assert torch.equal(fast_lloyd.nearest(X, C0), reference.sqdist(X, C0).argmin(-1))
    seeds = seeding.kmeans_plusplus(X, 6, torch.Generator(device="cuda").manual_seed(1), greedy=True)
    assert seeds.shape == (4, 6, 5) and seeds.device.type == "cuda"


def test_the_estimator_fits_cuda_tensors_and_returns_them():
    X = blobs(tasks=1, dtype=torch.float32)[0]
    on_gpu = ktframe.TransformerKMeans(6, random_state=0).fit(X.cuda())
    assert on_gpu.cluster_centers_.device.type == "cuda" and on_gpu.cluster_centers_.dtype == torch.float32
    on_cpu = ktframe.TransformerKMeans(6, init=on_gpu.cluster_centers_.cpu().numpy(), max_iter=1).fit(X.numpy())
    np.testing.assert_array_equal(on_gpu.labels_.cpu().numpy(), on_cpu.predict(X.numpy()))


def test_softmax_dropout_attention_on_cuda_gives_the_cpu_outputs_and_gradients():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 40, 7, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    dropped = attention.dropped_positions(torch.Size((3, 40, 40)), 0.1, g)
    results = []
    for device in ("cpu", "cuda"):
        inputs = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
        out = attention.softmax_dropout_attention(*inputs, 0.5, 0.1, dropped.to(device))
        out.square().sum().backward()
        results.append([out.detach().cpu(), *(t.grad.cpu() for t in inputs)])
    for cpu, gpu in zip(*results):
        torch.testing.assert_close(gpu, cpu, rtol=1e-10, atol=1e-12)


def test_a_training_step_on_cuda_in_bf16_autocast_is_finite():
    model = ktframe.build_model("learned", d=8, k=4, n_layers=1).cuda().train()
    X = blobs(tasks=8, n=64, d=8, k=4, dtype=torch.float32).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        centers = model(X, X[:, :4].clone()).centers
    loss = centers.float().square().mean()
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in model.parameters())
