"""One training step of the learned k-means transformer against a naive implementation of the
same layer (``torch.cdist`` + softmax), at the paper's setting, in one run, as a ratio.

    python benchmarks/train_step_vs_naive.py            # B=32 tasks, n=512, d=32, k=10
"""

from __future__ import annotations

import argparse
import math
import time

import torch
from torch import nn

import ktframe
from ktframe.core.loss import softmin_bound
from ktframe.core.reference import random_points
from ktframe.core.tasks import mixture


class NaiveHead(nn.Module):
    def __init__(self, width: int, scale: float) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)
        self.scale = scale

    def forward(self, queries, keys):
        logits = -self.scale * torch.cdist(self.q(queries), self.k(keys)).square()
        return torch.softmax(logits, dim=-1) @ self.v(keys)


class NaiveLayer(nn.Module):
    """The same one-layer model written the obvious way."""

    def __init__(self, d: int, k: int) -> None:
        super().__init__()
        self.d, self.k = d, k
        scale = 1 / math.sqrt(d + k)
        self.heads = nn.ModuleList(NaiveHead(d + k, scale) for _ in range(4))

    def forward(self, X, C0):
        B = X.shape[0]
        points = torch.cat([X, X.new_zeros(B, X.shape[1], self.k)], dim=-1)
        centers = torch.cat([C0, torch.eye(self.k).expand(B, -1, -1)], dim=-1)
        points = points + self.heads[0](points, centers) + self.heads[1](points, points)
        centers = centers + self.heads[2](centers, points) + self.heads[3](centers, centers)
        return centers[..., : self.d]


def time_steps(model, forward, X, C0, steps: int) -> float:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def step():
        optimizer.zero_grad()
        softmin_bound(X, forward(X, C0), 10.0).backward()
        optimizer.step()

    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--n", type=int, default=512)
    parser.add_argument("--d", type=int, default=32)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    X, _ = mixture(args.batch, args.n, args.d, args.k, generator=generator)
    C0 = random_points(X, args.k, generator)
    ours = ktframe.build_model("learned", d=args.d, k=args.k, n_layers=1, dropout=0.0)
    naive = NaiveLayer(args.d, args.k)
    t_ours = time_steps(ours, lambda X, C0: ours(X, C0).centers, X, C0, args.steps)
    t_naive = time_steps(naive, naive, X, C0, args.steps)
    print(f"one training step, B={args.batch} n={args.n} d={args.d} k={args.k}, float32, CPU ({torch.get_num_threads()} threads)")
    print(f"ktframe learned layer: {t_ours * 1e3:8.1f} ms")
    print(f"naive cdist + softmax: {t_naive * 1e3:8.1f} ms")
    print(f"ratio naive / ktframe: {t_naive / t_ours:.2f}x (above 1 means ktframe is faster)")


if __name__ == "__main__":
    main()
