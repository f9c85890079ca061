"""``TransformerKMeans``: the exact k-means transformer behind the scikit-learn estimator API."""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np
import torch

from ktframe.clustering import reference
from ktframe.errors import InputError
from ktframe.transformer.validation import as_tensor, check_finite, check_gamma, check_n_clusters, check_points, check_rank

INITS = ("k-means++", "random")


def _generator(random_state: Any) -> torch.Generator:
    if isinstance(random_state, torch.Generator):
        return random_state
    generator = torch.Generator()
    if random_state is None:
        generator.seed()
    elif isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool) and random_state >= 0:
        generator.manual_seed(int(random_state))
    else:
        raise InputError(f"random_state must be None, a non-negative integer or a torch.Generator; got {random_state!r}")
    return generator


class TransformerKMeans:
    """k-means clustering computed by a hand-built k-means transformer, one layer per iteration.

    Parameters follow scikit-learn's ``KMeans``: ``n_clusters``; ``variant`` (a registered
    clustering variant, ``lloyd`` by default); ``n_layers`` (Lloyd iterations); ``gamma`` (inverse
    temperature, ``inf`` for the exact hard limit); ``init`` (``"k-means++"`` — scikit-learn's
    greedy form —, ``"random"`` or an array of shape ``(n_clusters, d)``); ``random_state``;
    ``dtype`` (``"float32"`` or ``"float64"``); ``variant_options`` for the variant's own options.

    In the hard limit the ``lloyd`` variant computes its point self-attention as the identity it
    then is (see ``reset`` in docs/exactness.md), so memory grows with n·k, not n².

    Attributes after ``fit``: ``cluster_centers_ (k, d)``, ``labels_ (n,)``, ``inertia_``,
    ``n_iter_`` (layers applied: as in scikit-learn, fewer than ``n_layers`` once a layer leaves
    the assignments, and so the centers, as they were), ``n_features_in_``. Arrays come back as
    numpy arrays, or as tensors when ``fit`` was given a tensor.

    Many independent tasks at once: ``fit`` also takes ``X`` of shape ``(n_tasks, n_samples,
    n_features)`` and clusters every task separately in one batched pass; the attributes then
    gain a leading task axis (``cluster_centers_ (n_tasks, k, d)``, ``labels_ (n_tasks, n)``,
    ``inertia_ (n_tasks,)``, ``n_iter_ (n_tasks,)``), an ``init`` array has shape
    ``(n_tasks, k, d)``, and ``predict``, ``transform`` and ``score`` take
    ``(n_tasks, m, n_features)``.
    """

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        variant: str = "lloyd",
        n_layers: int = 10,
        gamma: float = math.inf,
        init: Any = "k-means++",
        random_state: Any = None,
        dtype: str = "float64",
        variant_options: dict | None = None,
    ) -> None:
        self.n_clusters = n_clusters
        self.variant = variant
        self.n_layers = n_layers
        self.gamma = gamma
        self.init = init
        self.random_state = random_state
        self.dtype = dtype
        self.variant_options = variant_options

    # scikit-learn's parameter protocol, so that clone, GridSearchCV and pipelines work.
    @classmethod
    def _param_names(cls) -> list[str]:
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> TransformerKMeans:
        valid = self._param_names()
        for name, value in params.items():
            if name not in valid:
                raise InputError(f"invalid parameter {name!r} for TransformerKMeans; expected one of: {', '.join(valid)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if not (v is defaults[k] or (isinstance(v, (int, float, str)) and v == defaults[k]))]
        return f"TransformerKMeans({', '.join(changed)})"

    # --- fitting --------------------------------------------------------------------------------

    def _model_options(self) -> dict[str, Any]:
        options = dict(self.variant_options or {})
        if self.variant == "lloyd" and math.isinf(check_gamma(self.gamma)):
            options.setdefault("reset", "identity")
        return options

    def _initial_centers(self, X: torch.Tensor, k: int, generator: torch.Generator, batched: bool) -> torch.Tensor:
        B, _, d = X.shape
        shape, text = ((B, k, d), "(n_tasks, n_clusters, n_features)") if batched else ((k, d), "(n_clusters, n_features)")
        if isinstance(self.init, str):
            if self.init == "k-means++":
                return reference.kmeans_plusplus(X, k, generator, greedy=True)
            if self.init == "random":
                return reference.random_points(X, k, generator)
            raise InputError(f"init must be 'k-means++', 'random' or an array of shape {shape}; got {self.init!r}")
        C0 = as_tensor(self.init, "init", X.dtype)
        check_rank(C0, "init", (len(shape),), f"{text} = {shape}")
        if tuple(C0.shape) != shape:
            raise InputError(f"init must have shape {text} = {shape}; got {tuple(C0.shape)}")
        check_finite(C0, "init")
        return C0.reshape(B, k, d)

    def _check_X(self, X: Any, *, fitted: bool) -> tuple[torch.Tensor, bool]:
        """``X`` as ``(n_tasks, n, d)``, and whether it came batched."""
        from ktframe.plugin.variant import resolve_dtype

        tensor = as_tensor(X, "X", resolve_dtype(self.dtype))
        if fitted:
            expected = f"({self._n_tasks}, n_samples, {self.n_features_in_})" if self._batched else f"(n_samples, {self.n_features_in_})"
            check_rank(tensor, "X", (3,) if self._batched else (2,), expected)
        else:
            check_rank(tensor, "X", (2, 3), "(n_samples, n_features) or (n_tasks, n_samples, n_features)")
        check_finite(tensor, "X")  # here, so that the index reported is that of X as given
        batched = tensor.dim() == 3
        tensor = check_points(tensor, "X")
        if fitted and tensor.shape[-1] != self.n_features_in_:
            raise InputError(f"X has {tensor.shape[-1]} features, but TransformerKMeans was fitted with {self.n_features_in_}; expected shape {expected}")
        if fitted and batched and tensor.shape[0] != self._n_tasks:
            raise InputError(f"X holds {tensor.shape[0]} tasks, but TransformerKMeans was fitted on {self._n_tasks}; expected shape {expected}")
        return tensor, batched

    def fit(self, X: Any, y: Any = None) -> TransformerKMeans:
        from ktframe.plugin.variant import build_model

        tensor, batched = self._check_X(X, fitted=False)
        k = check_n_clusters(self.n_clusters, tensor.shape[1])
        generator = _generator(self.random_state)
        C0 = self._initial_centers(tensor, k, generator, batched)
        model = build_model(self.variant, d=tensor.shape[-1], k=k, n_layers=self.n_layers, gamma=self.gamma, dtype=tensor.dtype, **self._model_options())
        with torch.no_grad():
            result = model(tensor, C0)
        # Set only once fit succeeds: a failed fit leaves a fitted estimator as it was.
        self._returns_tensor = isinstance(X, torch.Tensor)
        self._batched, self._n_tasks = batched, tensor.shape[0]
        self.n_features_in_ = tensor.shape[-1]
        self._centers = result.centers
        self.cluster_centers_ = self._out(result.centers)
        self.labels_ = self._out(result.labels)
        inertia = reference.objective(tensor, result.centers)
        self.inertia_ = inertia.cpu().numpy() if batched else float(inertia[0])
        self.n_iter_ = result.n_iter.cpu().numpy() if batched else int(result.n_iter[0])
        return self

    def fit_predict(self, X: Any, y: Any = None) -> Any:
        return self.fit(X).labels_

    # --- using a fitted model -------------------------------------------------------------------

    def _fitted(self) -> torch.Tensor:
        if not hasattr(self, "_centers"):
            raise InputError("this TransformerKMeans is not fitted yet; call fit(X) first")
        return self._centers

    def _out(self, tensor: torch.Tensor) -> Any:
        """A batched ``(n_tasks, ...)`` result as the caller's kind of array, without the task
        axis unless the estimator was fitted on many tasks."""
        tensor = tensor if self._batched else tensor[0]
        return tensor if self._returns_tensor else tensor.cpu().numpy()

    def transform(self, X: Any) -> Any:
        """Euclidean distances ``(n, k)`` from every point to every center."""
        centers = self._fitted()
        tensor, _ = self._check_X(X, fitted=True)
        return self._out(reference.sqdist(tensor, centers).sqrt())

    def predict(self, X: Any) -> Any:
        """The nearest center of every point (the transformer's assignment head in the hard limit)."""
        centers = self._fitted()
        tensor, _ = self._check_X(X, fitted=True)
        return self._out(reference.assign(tensor, centers).argmax(-1))

    def score(self, X: Any, y: Any = None) -> Any:
        """The opposite of the k-means objective of ``X`` (larger is better, as in scikit-learn);
        one score per task when fitted on many."""
        centers = self._fitted()
        tensor, _ = self._check_X(X, fitted=True)
        scores = -reference.objective(tensor, centers)
        return scores.cpu().numpy() if self._batched else float(scores[0])
