"""Synthetic clustering tasks: mixtures as in the paper's experiments, and a broader distribution
built from the same generator by switches.

The paper's tasks (every switch off): component means uniform in [0, 1]^d, equal weights, each
point its component's mean plus noise of scale ``std`` from one family, then every task min-max
scaled per dimension to [0, 1]. The families other than Gaussian are for out-of-distribution
tests; ``lognormal`` is the authors' (x = exp(mean + std · Z)), ``lognormal-noise`` the mean plus
a shifted log-normal noise (a one-sided, heavy-tailed cluster).

The switches (:class:`TaskDistribution`), each off by default, draw what real data has and the
paper's tasks lack: unequal weights, spreads that vary from task to task and component to
component, anisotropic and correlated clusters, a family per task, coordinates of unequal scale,
data in fewer coordinates than the model's d (the rest zero, as narrower data is zero-padded),
outliers, and a scaling that keeps the k-means geometry (one factor for every coordinate).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

FAMILIES = ("gaussian", "cauchy", "gumbel", "laplace", "lognormal", "lognormal-noise", "student-t")
SCALINGS = ("minmax", "isotropic", "rms", "none")


class TaskError(ValueError):
    """A task option out of its range: ``name`` (the option), ``expected``, ``value``."""

    def __init__(self, name: str, value, expected: str) -> None:
        value = list(value) if isinstance(value, tuple) else value  # as it was written in a config
        super().__init__(f"{name} must be {expected}; got {value!r}")
        self.name, self.value, self.expected = name, value, expected


def minmax_scale(X: torch.Tensor) -> torch.Tensor:
    """Per task and per dimension, to [0, 1] (a constant dimension becomes 0)."""
    low = X.amin(dim=1, keepdim=True)
    span = X.amax(dim=1, keepdim=True) - low
    return (X - low) / torch.where(span > 0, span, torch.ones_like(span))


def isotropic_scale(X: torch.Tensor) -> torch.Tensor:
    """Per task, each coordinate's minimum moved to 0 and every coordinate divided by the largest
    span of any: one factor for all dimensions, so distances keep their proportions (the k-means
    objective is scaled, not changed) and the largest coordinate span becomes 1."""
    low = X.amin(dim=1, keepdim=True)
    span = (X.amax(dim=1, keepdim=True) - low).amax(dim=-1, keepdim=True)
    return (X - low) / torch.where(span > 0, span, torch.ones_like(span))


def rms_scale(X: torch.Tensor) -> torch.Tensor:
    """Per task, translated to the points' mean and divided by their root-mean-square distance to
    it: one factor for all dimensions, as :func:`isotropic_scale`, but one that the extremes do
    not set, so that tasks of every spread and width weigh alike in a loss summed over points."""
    centered = X - X.mean(dim=1, keepdim=True)
    rms = centered.square().sum(dim=-1).mean(dim=-1)[:, None, None].sqrt()
    return centered / torch.where(rms > 0, rms, torch.ones_like(rms))


def _noise(family: str, shape: tuple[int, ...], generator: torch.Generator | None, dtype: torch.dtype) -> torch.Tensor:
    """Unit-scale noise, location 0 (``lognormal-noise`` is shifted so that its median is 0; the
    authors' ``lognormal`` is Gaussian here and exponentiated with its mean, in the mixture)."""
    if family in ("gaussian", "lognormal"):
        return torch.randn(shape, generator=generator, dtype=dtype)
    if family == "lognormal-noise":
        return torch.randn(shape, generator=generator, dtype=dtype).exp() - 1.0
    if family == "student-t":  # 3 degrees of freedom: Z / sqrt(V / 3), V ~ chi-square(3) = -2 log U + Z'^2
        z = torch.randn((2, *shape), generator=generator, dtype=dtype)
        u = torch.rand(shape, generator=generator, dtype=dtype).clamp_min(torch.finfo(dtype).tiny)
        return z[0] * torch.rsqrt((z[1].square() - 2 * u.log()) / 3)
    # Inverse CDFs of the others, from uniforms kept away from 0 and 1.
    tiny = torch.finfo(dtype).eps
    u = torch.rand(shape, generator=generator, dtype=dtype).clamp(tiny, 1 - tiny)
    if family == "cauchy":
        return torch.tan(math.pi * (u - 0.5))
    if family == "gumbel":
        return -torch.log(-torch.log(u))
    if family == "laplace":
        centered = u - 0.5
        return -torch.sign(centered) * torch.log1p(-2 * centered.abs())
    raise ValueError(f"unknown family {family!r}; expected one of: {', '.join(FAMILIES)}")


def _log_uniform(span: Sequence[float], shape: tuple[int, ...], generator: torch.Generator | None, dtype: torch.dtype) -> torch.Tensor:
    """Numbers drawn log-uniformly from ``span = [lo, hi]``: a factor as likely halved as doubled."""
    lo, hi = math.log(span[0]), math.log(span[1])
    return (lo + (hi - lo) * torch.rand(shape, generator=generator, dtype=dtype)).exp()


def _rotations(shape: tuple[int, ...], d: int, generator: torch.Generator | None, dtype: torch.dtype) -> torch.Tensor:
    """Uniformly distributed rotations ``(*shape, d, d)``: QR of Gaussian matrices, the signs of
    R's diagonal moved into Q (without it Q is not uniform)."""
    Q, R = torch.linalg.qr(torch.randn((*shape, d, d), generator=generator, dtype=dtype))
    return Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)


def _weights(span: Sequence[float], batch: int, k: int, generator: torch.Generator | None) -> torch.Tensor:
    """Component weights ``(batch, k)``, each task's from a symmetric Dirichlet whose concentration
    is drawn log-uniformly from ``span``. torch's Dirichlet takes no generator, so numpy draws
    them, seeded from ``generator``."""
    concentration = _log_uniform(span, (batch,), generator, torch.float64).numpy()
    rng = np.random.default_rng(int(torch.randint(2**62, (), generator=generator)))
    weights = np.stack([rng.dirichlet(np.full(k, a)) for a in concentration])
    return torch.from_numpy(weights)


@dataclass(frozen=True)
class TaskDistribution:
    """Which mixtures to draw. Every range is ``[lo, hi]``, drawn anew for every task (or
    component, or axis, as said); ``None`` turns the switch off. With every switch off it draws
    the paper's tasks, exactly as they were always drawn.

    - ``family`` / ``families``: the noise family, or one drawn per task from a list.
    - ``std`` / ``std_range``: the noise scale, or one drawn log-uniformly per task.
    - ``sizes``: ``"multinomial"`` (each point's component drawn by the weights) or ``"equal"``
      (n // k points each, the remainder to the first).
    - ``weight_concentration``: unequal weights, from a symmetric Dirichlet whose concentration is
      drawn log-uniformly per task (1: uniform on the simplex; smaller: more unequal).
    - ``component_scale``: each component's noise scale times a factor drawn log-uniformly.
    - ``axis_scale``: each component's noise stretched along each axis by its own factor (drawn
      log-uniformly per component and axis): anisotropic clusters.
    - ``rotate``: each component's noise turned by a random rotation of its own: correlated
      coordinates (with ``axis_scale``, a random covariance per component).
    - ``dim_scale``: each coordinate of a task stretched by a factor drawn log-uniformly, before
      scaling (min-max scaling undoes it; isotropic scaling keeps it).
    - ``subspace``: each task's data in its first d' coordinates, d' drawn from ``[lo, hi]``,
      the others exactly 0 (the way narrower data is zero-padded to a model's d).
    - ``outliers``: each task's fraction of points (drawn uniformly from ``[lo, hi]``, rounded to
      a count) moved to uniform positions in the task's bounding box; they keep their labels.
    - ``components``: each task's number of mixture components drawn from ``[lo, hi]``,
      whatever the k asked (data rarely has as many clusters as a user asks for); None: k.
    - ``scaling``: ``"minmax"`` (the paper's: each coordinate to [0, 1]), ``"isotropic"``
      (:func:`isotropic_scale`, as real data is fed to a model), ``"rms"`` (:func:`rms_scale`)
      or ``"none"``.
    """

    family: str = "gaussian"
    std: float = 0.1
    sizes: str = "multinomial"
    scaling: str = "minmax"
    families: Sequence[str] | None = None
    std_range: Sequence[float] | None = None
    weight_concentration: Sequence[float] | None = None
    component_scale: Sequence[float] | None = None
    axis_scale: Sequence[float] | None = None
    rotate: bool = False
    dim_scale: Sequence[float] | None = None
    subspace: Sequence[int] | None = None
    outliers: Sequence[float] | None = None
    components: Sequence[int] | None = None

    def __post_init__(self) -> None:
        _choice("family", self.family, FAMILIES)
        if self.families is not None and not (_pair_or_list(self.families) and self.families and all(f in FAMILIES for f in self.families)):
            raise TaskError("families", self.families, "null or a non-empty list of families, each one of " + ", ".join(FAMILIES))
        _choice("sizes", self.sizes, ("multinomial", "equal"))
        _choice("scaling", self.scaling, SCALINGS)
        if not (_number(self.std) and 0 < self.std < math.inf):
            raise TaskError("std", self.std, "a positive number")
        for name in ("std_range", "weight_concentration", "component_scale", "axis_scale", "dim_scale"):
            _span(name, getattr(self, name), "positive numbers", lambda v: _number(v) and 0 < v < math.inf)
        _span("outliers", self.outliers, "fractions in [0, 1)", lambda v: _number(v) and 0 <= v < 1)
        for name in ("subspace", "components"):
            _span(name, getattr(self, name), "integers >= 1", lambda v: type(v) is int and v >= 1)
        if type(self.rotate) is not bool:
            raise TaskError("rotate", self.rotate, "true or false")
        if self.weight_concentration is not None and self.sizes == "equal":
            raise TaskError("weight_concentration", self.weight_concentration, "null with sizes='equal' (equal sizes have equal weights)")

    @classmethod
    def of(cls, options: Mapping) -> TaskDistribution:
        """The distribution that ``options`` names: a mapping whose keys include fields of this
        class (the ``data`` section of a training config; other keys are ignored, a missing field
        keeps its default)."""
        values = {f.name: options[f.name] for f in dataclasses.fields(cls) if f.name in options}
        return cls(**{name: tuple(value) if _pair_or_list(value) else value for name, value in values.items()})

    def check(self, d: int) -> None:
        """What depends on the tasks' d: the subspace fits in it."""
        if self.subspace is not None and self.subspace[1] > d:
            raise TaskError("subspace", self.subspace, f"null or [lo, hi] with hi <= d={d}")

    def draw(
        self, batch: int, n: int, d: int, k: int, *, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``batch`` tasks of ``n`` points from ``k`` components in ``d`` dimensions: points
        ``(batch, n, d)`` and the components' labels ``(batch, n)``. The paper's draws (means,
        labels, noise) come in its order and alike; a switch draws only when it is on."""
        self.check(d)
        counts = None if self.components is None else torch.randint(self.components[0], self.components[1] + 1, (batch, 1), generator=generator)
        m = k if counts is None else self.components[1]  # the components drawn, of which each task uses its count
        means = torch.rand(batch, m, d, generator=generator, dtype=dtype)
        labels = self._labels(batch, n, m, counts, generator)
        families = (
            [self.family] * batch
            if self.families is None
            else [self.families[i] for i in torch.randint(len(self.families), (batch,), generator=generator).tolist()]
        )
        noise = self._spread(_noise_of(families, (n, d), generator, dtype), labels, m, generator)
        X = torch.gather(means, 1, labels.unsqueeze(-1).expand(-1, -1, d)) + noise
        exponentiated = torch.tensor([family == "lognormal" for family in families])
        if exponentiated.all():
            X = X.exp()
        elif exponentiated.any():
            X[exponentiated] = X[exponentiated].exp()
        if self.dim_scale is not None:
            X = X * _log_uniform(self.dim_scale, (batch, 1, d), generator, dtype)
        if self.subspace is not None:
            width = torch.randint(self.subspace[0], self.subspace[1] + 1, (batch, 1, 1), generator=generator)
            X = X * (torch.arange(d) < width).to(dtype)
        if self.outliers is not None:
            X = _with_outliers(X, self.outliers, generator)
        scale = {"minmax": minmax_scale, "isotropic": isotropic_scale, "rms": rms_scale, "none": lambda X: X}[self.scaling]
        return scale(X), labels

    def _labels(self, batch: int, n: int, k: int, counts: torch.Tensor | None, generator: torch.Generator | None) -> torch.Tensor:
        """Each point's component, of the first ``counts`` (batch, 1) of ``k`` (all k where None)."""
        if self.sizes == "equal":
            return (torch.arange(n) % k).sort().values.expand(batch, n) if counts is None else (torch.arange(n) % counts).sort(dim=1).values
        if self.weight_concentration is None:
            if counts is None:
                return torch.randint(k, (batch, n), generator=generator)
            return (torch.rand(batch, n, generator=generator, dtype=torch.float64) * counts).long()
        weights = _weights(self.weight_concentration, batch, k, generator)
        if counts is not None:  # a Dirichlet's weights of a subset, renormalised, are the subset's Dirichlet
            weights = weights.clamp_min(1e-30) * (torch.arange(k) < counts)
        return torch.multinomial(weights, n, replacement=True, generator=generator)

    def _spread(self, noise: torch.Tensor, labels: torch.Tensor, k: int, generator: torch.Generator | None) -> torch.Tensor:
        """Unit noise ``(batch, n, d)`` given each task's, component's and axis's scale and each
        component's rotation."""
        if self.std_range is None and self.component_scale is None and self.axis_scale is None and not self.rotate:
            return self.std * noise  # the paper's, as it always was computed
        batch, n, d = noise.shape
        std = self.std if self.std_range is None else _log_uniform(self.std_range, (batch, 1, 1), generator, noise.dtype)
        if self.component_scale is None and self.axis_scale is None and not self.rotate:
            return std * noise
        # Each component's points side by side, (batch, k, most points of a component, d), so that
        # one batched product applies every component's own map (a map gathered per point would
        # be (batch, n, d, d)); the slots no point fills are zeros, and left there.
        slot, most = _slots(labels, k)
        grouped = noise.new_zeros(batch, k * most, d).scatter_(1, (labels * most + slot).unsqueeze(-1).expand(-1, -1, d), noise).view(batch, k, most, d)
        factor = torch.ones(batch, k, 1, 1, dtype=noise.dtype)
        if self.component_scale is not None:
            factor = factor * _log_uniform(self.component_scale, (batch, k, 1, 1), generator, noise.dtype)
        if self.axis_scale is not None:
            factor = factor * _log_uniform(self.axis_scale, (batch, k, 1, d), generator, noise.dtype)
        grouped = grouped * factor
        if self.rotate:
            grouped = grouped @ _rotations((batch, k), d, generator, noise.dtype).transpose(-1, -2)
        return std * grouped.view(batch, k * most, d).gather(1, (labels * most + slot).unsqueeze(-1).expand(-1, -1, d))


def _number(value) -> bool:
    return type(value) in (int, float)


def _pair_or_list(value) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str)


def _choice(name: str, value, choices: Sequence[str]) -> None:
    if value not in choices:
        raise TaskError(name, value, "one of " + ", ".join(choices))


def _span(name: str, span, what: str, ok) -> None:
    """``span`` is None or ``[lo, hi]`` of values that pass ``ok``, lo <= hi."""
    if span is not None and not (_pair_or_list(span) and len(span) == 2 and all(ok(v) for v in span) and span[0] <= span[1]):
        raise TaskError(name, span, f"null or [lo, hi], {what} with lo <= hi")


def _slots(labels: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
    """Each point's place among the points of its component ``(batch, n)`` (in the order of the
    points), and the most points any component of any task has."""
    batch, n = labels.shape
    order = labels.argsort(dim=1, stable=True)
    counts = torch.zeros(batch, k, dtype=torch.long).scatter_add_(1, labels, torch.ones_like(labels))
    first = counts.cumsum(dim=1) - counts  # where each component starts in the sorted order
    place = torch.arange(n).expand(batch, n) - first.gather(1, labels.gather(1, order))
    return torch.empty_like(labels).scatter_(1, order, place), int(counts.max())


def _noise_of(families: list[str], shape: tuple[int, int], generator: torch.Generator | None, dtype: torch.dtype) -> torch.Tensor:
    """Unit-scale noise ``(len(families), *shape)``, each task's of its family (each family drawn
    once, in the order it first appears)."""
    if len(set(families)) == 1:
        return _noise(families[0], (len(families), *shape), generator, dtype)
    noise = torch.empty(len(families), *shape, dtype=dtype)
    for family in dict.fromkeys(families):
        tasks = torch.tensor([f == family for f in families])
        noise[tasks] = _noise(family, (int(tasks.sum()), *shape), generator, dtype)
    return noise


def _with_outliers(X: torch.Tensor, span: Sequence[float], generator: torch.Generator | None) -> torch.Tensor:
    """``X`` with a fraction of each task's points (drawn uniformly from ``span``, rounded to a
    count; the points chosen at random) moved to uniform positions in the task's bounding box."""
    batch, n, d = X.shape
    fraction = span[0] + (span[1] - span[0]) * torch.rand(batch, 1, generator=generator, dtype=torch.float64)
    count = (fraction * n).round().long()
    most = int(count.max())
    chosen = torch.rand(batch, n, generator=generator).argsort(dim=1)[:, :most].unsqueeze(-1).expand(-1, -1, d)
    low, high = X.amin(dim=1, keepdim=True), X.amax(dim=1, keepdim=True)
    uniform = low + (high - low) * torch.rand(batch, most, d, generator=generator, dtype=X.dtype)
    moved = torch.where((torch.arange(most) < count).unsqueeze(-1), uniform, X.gather(1, chosen))
    return X.scatter(1, chosen, moved)


def mixture(
    batch: int, n: int, d: int, k: int, *, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32, **options
) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` tasks of ``n`` points from ``k`` components: points ``(batch, n, d)`` and the
    true labels ``(batch, n)``. ``options`` are :class:`TaskDistribution`'s (``family``, ``std``,
    ``sizes``, ``scaling``, the switches); none given: the paper's tasks."""
    return TaskDistribution(**options).draw(batch, n, d, k, generator=generator, dtype=dtype)
