"""``TransformerKMeans``: the exact k-means transformer behind the scikit-learn estimator API."""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ktframe.clustering.trained import Frame, Trained, load_trained
from ktframe.core import reference
from ktframe.core.errors import InputError, KtframeError, NotFittedError
from ktframe.core.names import canonical
from ktframe.core.result import ClusteringResult
from ktframe.core.validation import as_tensor, check_gamma, check_n_clusters, check_positive_int, check_rank, check_values
from ktframe.fast import lloyd as fast
from ktframe.fast import seeding
from ktframe.fast.swaps import swap
from ktframe.plugin.build import build_model, get_variant
from ktframe.plugin.manager import registry

# scikit-learn's n_init="auto": one start for k-means++ or given centers, this many for random ones.
RANDOM_STARTS = 10
FLOATS = {"float32": torch.float32, "float64": torch.float64}


def _generator(random_state: Any, device: torch.device) -> torch.Generator:
    """A generator on the data's ``device`` seeded from ``random_state`` (a given one as it is)."""
    if isinstance(random_state, torch.Generator):
        return random_state
    generator = torch.Generator(device=device)
    if random_state is None:
        generator.seed()
    elif isinstance(random_state, (int, np.integer)) and not isinstance(random_state, bool) and random_state >= 0:
        generator.manual_seed(int(random_state))
    else:
        raise InputError(f"random_state must be None, a non-negative integer or a torch.Generator; got {random_state!r}")
    return generator


def _float_tensor(data: Any, dtype: Any) -> torch.Tensor:
    """``data`` as a floating tensor: of ``dtype`` when one is given (``"float32"`` or
    ``"float64"``), else of the input's own float dtype where that is float32 or float64 and of
    float64 otherwise (integers, booleans, lists), as scikit-learn converts. A tensor or a
    C-contiguous array already of that dtype is used as it is, not copied."""
    if dtype is not None and dtype not in FLOATS and dtype not in FLOATS.values():
        raise InputError(f"unsupported dtype {dtype!r}; expected None (the input's float dtype) or one of: float32, float64")
    wanted = FLOATS.get(dtype, dtype) if dtype is not None else None
    if type(data).__module__.startswith("scipy.sparse"):
        raise InputError(f"X is a sparse {type(data).__name__}; TransformerKMeans needs dense data (convert it with X.toarray())")
    if isinstance(data, torch.Tensor):
        if data.is_complex():
            raise InputError(f"X must be real numbers; Complex data not supported (got {data.dtype})")
        own = data.dtype if data.dtype in FLOATS.values() else torch.float64
        return data.to(wanted or own)
    try:
        array = np.asarray(data)
    except (ValueError, TypeError) as exc:
        raise InputError(f"X must be an array of numbers; could not read it as one ({exc})") from None
    if np.iscomplexobj(array):
        raise InputError(f"X must be real numbers; Complex data not supported (got {array.dtype})")
    if array.dtype == object:
        try:
            array = array.astype(np.float64)
        except ValueError as exc:
            raise InputError(f"X must contain only numbers; got values of type object that are not numbers ({exc})") from None
        except TypeError as exc:  # a TypeError, as scikit-learn raises for such values
            raise TypeError(f"X must contain only numbers; {exc}") from None
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise InputError(f"X must contain only numbers; got values of type {array.dtype}")
    own = array.dtype if array.dtype in (np.float32, np.float64) else np.float64
    array = np.ascontiguousarray(array, dtype=str(wanted).removeprefix("torch.") if wanted else own)
    with warnings.catch_warnings():  # a read-only array (a memory map): fit only reads it
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


@functools.cache
def _sklearn_not_fitted_error(base: type) -> type:
    """:class:`NotFittedError` that is also scikit-learn's ``base`` (its own NotFittedError)."""
    return type("NotFittedError", (NotFittedError, base), {"__module__": NotFittedError.__module__, "__doc__": NotFittedError.__doc__})


def _not_fitted_error(message: str) -> NotFittedError:
    """A :class:`NotFittedError`; where scikit-learn is loaded, also an instance of its own
    ``NotFittedError``, which its checks (``check_is_fitted``, the estimator checks) catch;
    ktframe never imports scikit-learn itself."""
    sklearn_exceptions = sys.modules.get("sklearn.exceptions")
    if sklearn_exceptions is None:
        return NotFittedError(message)
    return _sklearn_not_fitted_error(sklearn_exceptions.NotFittedError)(message)


class NoSoftMemberships(InputError, AttributeError):
    """``predict_proba`` of an estimator whose variant's assignments are hard: an
    :class:`InputError`, and an ``AttributeError``, so that ``hasattr(estimator, "predict_proba")``
    is False, as scikit-learn's ``available_if`` makes a method absent."""


class _SoftMembershipsOnly:
    """A method that an estimator has only where its variant has soft memberships. scikit-learn's
    tools (its estimator checks, soft voting, ``cross_val_predict(method="predict_proba")``) ask
    ``hasattr`` before they call ``predict_proba``; reading it elsewhere raises
    :class:`NoSoftMemberships`."""

    def __init__(self, method: Any) -> None:
        self.method = method
        functools.update_wrapper(self, method)

    def __get__(self, estimator: TransformerKMeans | None, owner: type | None = None) -> Any:
        if estimator is None:
            return self.method
        estimator._check_soft_memberships()
        return types.MethodType(self.method, estimator)


class TransformerKMeans:
    """k-means clustering computed by a hand-built k-means transformer, one layer per iteration.

    Parameters follow scikit-learn's ``KMeans``: ``n_clusters``; ``variant`` (a registered
    clustering variant, ``lloyd`` by default); ``max_iter`` (at most this many Lloyd iterations,
    300 as in scikit-learn; ``max_iter=10`` is the paper's ten-layer model); ``n_layers`` (an
    alias of ``max_iter`` kept for ``ktframe cluster --layers``; ``None``, the default, means
    ``max_iter``); ``tol`` (scikit-learn's: a task stops after the first iteration whose squared
    center shift, summed over the centers, is at most ``tol`` times the mean variance of its
    features; 1e-4 as in scikit-learn, 0 for only an iteration that changes nothing); ``gamma``
    (inverse temperature, ``inf`` for the exact hard limit); ``init`` (``"k-means++"``, also
    spelt ``"kmeans++"`` — scikit-learn's greedy form —, ``"random"`` or an array of shape
    ``(n_clusters, d)``);
    ``n_init`` (scikit-learn's: the starts run, the one of least ``inertia_`` kept per task; an
    integer >= 1 or ``"auto"``, the default: 1 for ``"k-means++"`` or an array, 10 for
    ``"random"``; an array with ``n_init`` > 1 warns and runs once, as scikit-learn does);
    ``random_state``; ``dtype`` (``None``: the input's float dtype, float32 or float64, other
    inputs becoming float64 as in scikit-learn; ``"float32"`` or ``"float64"`` forces one);
    ``variant_options`` for the variant's own options (``gamma`` is the parameter above);
    ``checkpoint`` (below); ``lloyd_last``: the last of the steps are that many of
    Lloyd's algorithm, the hand-built ``lloyd`` transformer's (exact), from the centers the model
    returns after the others — for a soft or trained model, a finish at a fixed point of Lloyd's
    algorithm (``eval.lloyd_last``'s ``model+lloyd``); ``n_iter_`` counts both parts. ``swaps``:
    after the steps, that many swaps (:mod:`ktframe.fast.swaps`): the least useful center moved to
    where the error is large, then as many Lloyd iterations as the fit's steps (stopping by
    ``tol``), the move kept only where it lowers the k-means objective — a local search out of the
    fixed point Lloyd's algorithm stops at; its iterations are not counted in ``n_iter_``. Both are
    ``None`` by default: 0 for a hand-built model, the checkpoint's own finish
    (its config's ``eval.lloyd_last`` and ``eval.swaps``) for a trained one.
    docs/estimator.md shows each with an example.

    A fit stops spending time on a task once it has settled (``tol``) or an iteration leaves it as
    it was (converged), so ``max_iter=300`` costs what the iterations needed cost; every variant
    stops by the same rule, a soft one too. In the hard limit the ``lloyd`` variant computes its
    point self-attention as the identity it then is (see ``reset`` in docs/exactness.md), so
    memory grows with n·k, not n². An emptied cluster keeps its center (scikit-learn moves it to a
    far point).

    Attributes after ``fit(X)`` with ``X`` of shape ``(n_samples, n_features)``:

    - ``cluster_centers_`` ``(n_clusters, n_features)``: the centers, in ``X``'s float dtype
      (or ``dtype``);
    - ``labels_`` ``(n_samples,)`` integers: the nearest center of every point, the lowest index
      among ties — what ``predict(X)`` gives;
    - ``inertia_`` float: Σ wᵢ‖xᵢ − c[labelᵢ]‖² (wᵢ = 1 without ``sample_weight``), the k-means
      objective of the returned centers;
    - ``n_iter_`` int: the iterations run; as in scikit-learn, fewer than ``max_iter`` once an
      iteration moves the centers by no more than ``tol`` allows (that one counted);
      ``labels_``, ``cluster_centers_``, ``inertia_``, ``n_iter_`` and ``memberships_`` are
      those of the start kept (``n_init``);
    - ``memberships_`` ``(n_samples, n_clusters)``: for a variant with soft memberships
      (``Variant.soft_memberships``, e.g. ``soft``), each point's probabilities over the clusters
      at the returned centers, what ``predict_proba(X)`` gives; absent for the others;
    - ``n_features_in_`` int: ``n_features``.

    Arrays come back as numpy arrays, or as tensors when ``fit`` was given a tensor.

    ``fit(X, sample_weight=w)`` (and ``fit_predict``, ``fit_transform``, ``score``) weighs each
    point as scikit-learn does, for the variants whose center update is a weighted mean
    (``Variant.sample_weights``: ``lloyd``, ``lloyd-dot``, ``soft``, ``spherical``): a point of weight w
    counts as w copies of itself in the center update (the model's normalized linear attention
    weighs it as a key) and in ``inertia_``; weights are non-negative, not all 0. The seeding
    (``k-means++``, ``random``) draws as without weights; pass ``init`` for scikit-learn's weighted
    seeding. Another variant refuses weights in one line.

    ``predict_proba(X)`` ``(n, n_clusters)``: the soft memberships of new points, the assignment
    the variant's model writes for them at the fitted centers (for ``soft``,
    ``softmax(−γ‖x − c‖²)`` over the centers, EM's responsibilities). An estimator whose variant
    has no soft memberships has no ``predict_proba`` (``hasattr`` is False, as scikit-learn's
    ``available_if`` makes it); reading it says so in one line.

    ``checkpoint=PATH`` clusters with a trained model (a ``.ckpt`` of ``ktframe fit``, read
    weights-only) instead of a hand-built one: its layer, re-embedded between steps, for the steps
    it was evaluated with (its config's ``eval.steps``, at most ``max_iter``; ``n_layers`` sets
    them), on the data in the frame of its training tasks: narrower data zero-padded to its ``d``,
    wider data reduced to its first ``d`` principal components (a PCA fitted on ``X``), then scaled
    as its tasks were (``data.scaling``: ``minmax`` per coordinate, the paper's, or ``isotropic``,
    one factor for all). Initial centers, labels and ``predict`` are in that frame;
    ``cluster_centers_`` are mapped back to ``X``'s units (within the principal components, where
    reduced), and ``inertia_``, ``transform`` and ``score`` are measured there. ``n_clusters`` must
    be the checkpoint's k, or at most its largest for a model trained for any k; ``variant``,
    ``gamma`` and ``variant_options`` describe a hand-built model and stay at their defaults.

    Many independent tasks at once: ``fit`` also takes ``X`` of shape ``(n_tasks, n_samples,
    n_features)`` and clusters every task separately in one batched pass, with the same
    conventions per task; the attributes then gain a leading task axis: ``cluster_centers_``
    ``(n_tasks, n_clusters, n_features)``, ``labels_`` ``(n_tasks, n_samples)``, ``inertia_``
    ``(n_tasks,)`` and ``n_iter_`` ``(n_tasks,)`` numpy arrays (``n_features_in_`` stays
    ``n_features``); an ``init`` array has shape ``(n_tasks, n_clusters, n_features)``,
    ``sample_weight`` ``(n_tasks, n_samples)``, and ``predict``, ``predict_proba``, ``transform``
    and ``score`` take ``(n_tasks, m, n_features)`` (``score`` then gives one score per task).

    Points so large that their squared distances overflow the dtype (about 1e154 in float64, 1e19
    in float32) are refused with an :class:`ktframe.InputError` naming their magnitude, and so is a
    fit or score whose objective comes out not finite: no result holds a NaN or an inf.

    Before ``fit``, ``predict``, ``predict_proba``, ``transform`` and ``score`` raise
    :class:`ktframe.NotFittedError` (a ``ValueError`` and an ``AttributeError``; where
    scikit-learn is loaded, also its own ``NotFittedError``). scikit-learn is needed only by its
    tools (``clone``, the estimator checks): ktframe does not import it.
    """

    def __init__(
        self,
        n_clusters: int = 8,
        *,
        variant: str = "lloyd",
        max_iter: int = 300,
        n_layers: int | None = None,
        tol: float = 1e-4,
        gamma: float = math.inf,
        init: Any = "k-means++",
        n_init: int | str = "auto",
        random_state: Any = None,
        dtype: str | None = None,
        variant_options: dict | None = None,
        checkpoint: str | os.PathLike | None = None,
        lloyd_last: int | None = None,
        swaps: int | None = None,
    ) -> None:
        self.n_clusters = n_clusters
        self.variant = variant
        self.max_iter = max_iter
        self.n_layers = n_layers
        self.tol = tol
        self.gamma = gamma
        self.init = init
        self.n_init = n_init
        self.random_state = random_state
        self.dtype = dtype
        self.variant_options = variant_options
        self.checkpoint = checkpoint
        self.lloyd_last = lloyd_last
        self.swaps = swaps

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

    def __sklearn_tags__(self) -> Any:
        # Only scikit-learn calls this, so scikit-learn is loaded already; ktframe does not depend
        # on it (an optional test and benchmark extra), hence no import statement of it here.
        utils = importlib.import_module("sklearn.utils")
        Tags, TargetTags, TransformerTags, InputTags = utils.Tags, utils.TargetTags, utils.TransformerTags, utils.InputTags
        return Tags(
            estimator_type="clusterer",
            target_tags=TargetTags(required=False),
            transformer_tags=TransformerTags(preserves_dtype=["float64", "float32"]),
            input_tags=InputTags(two_d_array=True, allow_nan=False, sparse=False),
        )

    def __repr__(self) -> str:
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if not (v is defaults[k] or (isinstance(v, (int, float, str)) and v == defaults[k]))]
        return f"TransformerKMeans({', '.join(changed)})"

    # --- fitting --------------------------------------------------------------------------------

    def _model(self, d: int, k: int, steps: int, dtype: torch.dtype) -> torch.nn.Module:
        """The variant's model for this fit. The last one built is kept and used again while its
        settings stay the same (refits, as in a search over data, a bootstrap or a stream of
        batches): building a model of ten hand-built layers costs about as much as running one of
        them on a thousand small tasks. A variant's model returns the same result every time it is
        run on the same input (the ``determinism`` check of :mod:`ktframe.plugin.testing`), so
        reuse changes no result."""
        options = _check_variant_options(self.variant_options)
        key = (self.variant, d, k, steps, self.gamma, dtype, repr(sorted(options.items())))
        return self._kept("_built", key, lambda: build_model(self.variant, d=d, k=k, n_layers=steps, gamma=self.gamma, dtype=dtype, **options))

    def _lloyd(self, slot: str, d: int, k: int, steps: int, dtype: torch.dtype) -> torch.nn.Module:
        """The hand-built ``lloyd`` model of ``lloyd_last``'s finish or of the swaps' iterations,
        kept in ``slot`` as :meth:`_model` is."""
        return self._kept(slot, (d, k, steps, dtype), lambda: build_model("lloyd", d=d, k=k, n_layers=steps, dtype=dtype))

    def _kept(self, slot: str, key: tuple, build: Callable[[], Any]) -> Any:
        """What ``build`` makes, kept in the attribute ``slot`` with its ``key`` and made again only
        when the key changes."""
        cached = vars(self).get(slot)
        if cached is None or cached[0] != key:
            cached = (key, build())
            setattr(self, slot, cached)
        return cached[1]

    def _trained(self, dtype: torch.dtype) -> Trained:
        """The checkpoint's model in ``dtype``, kept while the file and the dtype stay the same."""
        if self.variant != "lloyd" or check_gamma(self.gamma) != math.inf or self.variant_options:
            raise InputError(
                "checkpoint= clusters with the checkpoint's trained model, but variant, gamma or variant_options is set, which describe a hand-built one; "
                "expected them at their defaults with a checkpoint"
            )
        try:
            stamp = os.stat(self.checkpoint).st_mtime_ns
        except (OSError, TypeError, ValueError):
            stamp = None  # load_trained says what is wrong with it
        key = ("checkpoint", os.fspath(self.checkpoint) if isinstance(self.checkpoint, (str, os.PathLike)) else repr(self.checkpoint), stamp, dtype)

        def load() -> Trained:
            trained = load_trained(self.checkpoint)
            trained.model.to(dtype)
            return trained

        return self._kept("_built", key, load)

    def _n_starts(self) -> int:
        """How many starts a fit runs: ``n_init``, by scikit-learn's rule."""
        init = canonical(self.init)
        if isinstance(self.n_init, str) and self.n_init == "auto":
            return RANDOM_STARTS if isinstance(init, str) and init == "random" else 1
        if isinstance(self.n_init, bool) or not isinstance(self.n_init, (int, np.integer)) or self.n_init < 1:
            raise InputError(f"n_init must be 'auto' or an integer >= 1 (the starts run, the best kept); got {self.n_init!r}")
        if not isinstance(init, str) and self.n_init != 1:
            # scikit-learn's warning, word for word: one array gives one start however often run
            warnings.warn(
                f"Explicit initial center position passed: performing only one init in TransformerKMeans instead of n_init={self.n_init}.",
                RuntimeWarning,
                stacklevel=3,
            )
            return 1
        return int(self.n_init)

    def _initial_centers(self, X: torch.Tensor, k: int, generator: torch.Generator, batched: bool, frame: Frame | None) -> torch.Tensor:
        """The initial centers of the tasks ``X`` (in the model's frame), an ``init`` array given in
        the user's units taken there too."""
        B, _, d = X.shape
        features = d if frame is None else frame.features
        shape, text = ((B, k, features), "(n_tasks, n_clusters, n_features)") if batched else ((k, features), "(n_clusters, n_features)")
        if isinstance(self.init, str):
            init = canonical(self.init)
            if init == "k-means++":
                return seeding.kmeans_plusplus(X, k, generator, greedy=True)
            if init == "random":
                return reference.random_points(X, k, generator)
            raise InputError(f"init must be 'k-means++' (or 'kmeans++'), 'random' or an array of shape {shape}; got {self.init!r}")
        C0 = as_tensor(self.init, "init", X.dtype).to(X.device)
        check_rank(C0, "init", (len(shape),), f"{text} = {shape}")
        if tuple(C0.shape) != shape:
            raise InputError(f"init must have shape {text} = {shape}; got {tuple(C0.shape)}")
        check_values(C0, "init")
        C0 = C0.reshape(B, k, features)
        return C0 if frame is None else frame.to_model(C0)

    def _check_X(self, X: Any, *, fitted: bool) -> tuple[torch.Tensor, bool]:
        """``X`` as ``(n_tasks, n, d)``, and whether it came batched. Once fitted, ``X`` takes
        the float dtype of the fitted centers."""
        tensor = _float_tensor(X, self._centers.dtype if fitted else self.dtype)
        if fitted:
            expected = f"({self._n_tasks}, n_samples, {self.n_features_in_})" if self._batched else f"(n_samples, {self.n_features_in_})"
        else:
            expected = "(n_samples, n_features) or (n_tasks, n_samples, n_features)"
        if tensor.dim() == 1:
            raise InputError(
                f"X must have shape {expected}; got a 1-D array of shape {tuple(tensor.shape)}. "
                "Reshape your data with X.reshape(-1, 1) if it has one feature or X.reshape(1, -1) if it is one sample"
            )
        check_rank(tensor, "X", (3,) if fitted and self._batched else (2,) if fitted else (2, 3), expected)
        if 0 in tensor.shape:  # scikit-learn's wording of an empty X follows, for its checks
            shape = tuple(tensor.shape)
            empty = "feature" if shape[-1] == 0 else "sample" if shape[-2] == 0 else "task"
            raise InputError(f"X must hold at least one point with at least one coordinate; got 0 {empty}(s) (shape={shape}) while a minimum of 1 is required.")
        check_values(tensor, "X")  # here, so that an index reported is that of X as given
        batched = tensor.dim() == 3
        tensor = tensor if batched else tensor.unsqueeze(0)
        if fitted and tensor.shape[-1] != self.n_features_in_:
            raise InputError(
                f"X has {tensor.shape[-1]} features, but TransformerKMeans is expecting {self.n_features_in_} features as input (it was fitted with {self.n_features_in_}); expected shape {expected}"
            )
        if fitted and batched and tensor.shape[0] != self._n_tasks:
            raise InputError(f"X holds {tensor.shape[0]} tasks, but TransformerKMeans was fitted on {self._n_tasks}; expected shape {expected}")
        return tensor, batched

    def _check_weights(self, sample_weight: Any, X: torch.Tensor, batched: bool) -> torch.Tensor | None:
        """``sample_weight`` as ``(n_tasks, n)``: non-negative finite numbers, not all 0 in a task."""
        if sample_weight is None:
            return None
        B, n, _ = X.shape
        shape, text = ((B, n), "(n_tasks, n_samples)") if batched else ((n,), "(n_samples,)")
        weights = as_tensor(sample_weight, "sample_weight", X.dtype).to(X.device)
        if tuple(weights.shape) != shape:
            raise InputError(f"sample_weight must have shape {text} = {shape}, one weight per point of X; got {tuple(weights.shape)}")
        weights = weights.reshape(B, n)
        bad = ~torch.isfinite(weights) | (weights < 0)
        if bool(bad.any()):
            where = tuple(int(i) for i in bad.nonzero()[0]) if batched else int(bad.nonzero()[0, 1])
            raise InputError(f"sample_weight must hold non-negative finite numbers; got {weights[bad][0].item()!r} at index {where}")
        empty = weights.sum(dim=1) == 0
        if bool(empty.any()):
            raise InputError(f"sample_weight{f' of task {int(empty.nonzero()[0])}' if batched else ''} is zero for every point; expected some positive weight")
        return weights

    def fit(self, X: Any, y: Any = None, sample_weight: Any = None) -> TransformerKMeans:
        tensor, batched = self._check_X(X, fitted=False)
        k = check_positive_int(self.n_clusters, "the number of clusters k")
        if k > tensor.shape[1]:  # n_samples=..., as scikit-learn words it
            raise InputError(
                f"the number of clusters k={k} exceeds the number of points n={tensor.shape[1]} (n_samples={tensor.shape[1]} should be >= n_clusters={k}); expected k <= n"
            )
        k = check_n_clusters(k, tensor.shape[1])
        tol = _check_tol(self.tol)
        starts = self._n_starts()
        weights = self._check_weights(sample_weight, tensor, batched)
        steps = check_positive_int(self.max_iter if self.n_layers is None else self.n_layers, "max_iter" if self.n_layers is None else "n_layers")
        lloyd_last, swaps = self.lloyd_last, self.swaps
        if self.checkpoint is not None:
            trained = self._trained(tensor.dtype)
            k = trained.check_k(k)
            model, frame, reembed = trained.model, Frame.fit(tensor, trained.d, trained.scaling), True
            steps = steps if self.n_layers is not None else min(steps, trained.steps)
            # the checkpoint's own finish where none is given, within the steps asked for
            lloyd_last = min(trained.lloyd_last, steps) if lloyd_last is None else lloyd_last
            swaps = trained.swaps if swaps is None else swaps
        else:
            model, frame, reembed = self._model(tensor.shape[-1], k, steps, tensor.dtype), None, False
        lloyd_last = _check_lloyd_last(0 if lloyd_last is None else lloyd_last, steps)
        swaps = _check_swaps(0 if swaps is None else swaps)
        spec = get_variant(model.variant)
        if weights is not None and not spec.sample_weights:
            takes = _variant_names("sample_weights")
            raise InputError(
                f"variant {spec.name!r} does not take sample weights: its center update is not a weighted mean (Variant.sample_weights); "
                f"expected sample_weight=None, or a variant that takes them: {', '.join(takes) or '(none)'}"
            )
        seen = tensor if frame is None else frame.to_model(tensor)
        generator = _generator(self.random_state, tensor.device)
        # The n_init starts are extra tasks of one batched call: start j of task b is task
        # b·starts + j; each task then keeps its start of least inertia.
        many, many_weights = _repeat(seen, starts), None if weights is None else _repeat(weights, starts)
        C0 = self._initial_centers(many, k, generator, batched, frame)
        with torch.no_grad():
            result = model(many, C0, n_steps=steps - lloyd_last, reembed=reembed, tol=tol, sample_weight=many_weights) if steps > lloyd_last else None
            if lloyd_last:
                finish = self._lloyd("_built_finish", many.shape[-1], k, lloyd_last, many.dtype)
                result = _finish_with_lloyd(finish, many, C0, result, frame, starts, tol=tol, sample_weight=many_weights)
            centers = result.centers
            if swaps:
                iterations = self._lloyd("_built_swaps", many.shape[-1], k, steps, many.dtype)
                found = centers if frame is None or lloyd_last else _in_frame(frame, centers, starts)
                centers = swap(
                    many, found, swaps, steps, generator, many_weights, lambda C: iterations(many, C, tol=tol, sample_weight=many_weights).centers
                ).centers
            # The labels of the returned centers (what predict(X) gives), and the objective of
            # those labels: the last layer's assignments may be those of the centers before it.
            labels = fast.nearest(many, centers)
            user_centers = centers if frame is None else _to_user(frame, centers, starts)
            inertia = _inertia(_repeat(tensor, starts), user_centers, labels, many_weights)
            n_iter = result.n_iter
            if starts > 1:
                best = inertia.view(-1, starts).argmin(dim=1) + torch.arange(0, len(inertia), starts, device=inertia.device)
                centers, labels, user_centers, inertia, n_iter = (t[best] for t in (centers, labels, user_centers, inertia, n_iter))
            memberships = _memberships(model, seen, centers) if spec.soft_memberships else None
        self._check_result("clustering", inertia, user_centers, batched)
        # Set only once fit succeeds: a failed fit leaves a fitted estimator as it was.
        self._returns_tensor = isinstance(X, torch.Tensor)
        self._batched, self._n_tasks = batched, tensor.shape[0]
        self.n_features_in_ = tensor.shape[-1]
        self._centers, self._user_centers, self._frame, self._fitted_model, self._spec = centers, user_centers, frame, model, spec
        self.cluster_centers_ = self._out(user_centers)
        self.labels_ = self._out(labels)
        self.inertia_ = inertia.cpu().numpy() if batched else float(inertia[0])
        self.n_iter_ = n_iter.cpu().numpy() if batched else int(n_iter[0])
        if memberships is not None:
            self.memberships_ = self._out(memberships)
        else:
            vars(self).pop("memberships_", None)
        return self

    def _check_result(self, doing: str, objective: torch.Tensor, centers: torch.Tensor, batched: bool) -> None:
        """Refuse an objective or centers that are not finite, which no result may hold: the
        input's magnitude is checked, but a sum of n squared distances can still overflow, and so
        can gamma times one at a finite gamma."""
        if math.isfinite(objective.sum().item() + centers.sum().item()):  # one sum each: only a non-finite one looks closer
            return
        bad = ~(torch.isfinite(objective) & torch.isfinite(centers).flatten(1).all(dim=1))
        if not bool(bad.any()):  # finite entries whose sum overflows
            return
        task = int(bad.nonzero()[0])
        value = objective[task].item()
        what = f"a k-means objective of {value}" if not math.isfinite(value) else "centers that are not finite"
        finite_gamma = doing == "clustering" and not math.isinf(check_gamma(self.gamma))
        raise InputError(
            f"{doing} X{f' (task {task})' if batched else ''} gave {what}: {'gamma times ' if finite_gamma else ''}squared distances or their sum "
            f"overflow {str(centers.dtype).removeprefix('torch.')}; expected a finite result: rescale the data (e.g. standardise it){' or use a smaller gamma' if finite_gamma else ''}"
        )

    def fit_predict(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        return self.fit(X, sample_weight=sample_weight).labels_

    # --- using a fitted model -------------------------------------------------------------------

    def _fitted(self, method: str) -> torch.Tensor:
        if "_centers" not in vars(self):
            raise _not_fitted_error(f"this TransformerKMeans is not fitted yet; call fit(X) first, then {method}(X)")
        return self._centers

    def _seen(self, X: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``X`` checked against the fit, as given and in the model's frame."""
        tensor, _ = self._check_X(X, fitted=True)
        return tensor, tensor if self._frame is None else self._frame.to_model(tensor)

    def _out(self, tensor: torch.Tensor) -> Any:
        """A batched ``(n_tasks, ...)`` result as the caller's kind of array, without the task
        axis unless the estimator was fitted on many tasks."""
        tensor = tensor if self._batched else tensor[0]
        return tensor if self._returns_tensor else tensor.cpu().numpy()

    def transform(self, X: Any) -> Any:
        """Euclidean distances ``(n, k)`` from every point to every center."""
        self._fitted("transform")
        tensor, _ = self._check_X(X, fitted=True)
        return self._out(reference.sqdist(tensor, self._user_centers).sqrt())

    def fit_transform(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """``fit(X)``, then the distances from every point of ``X`` to every center."""
        return self.fit(X, sample_weight=sample_weight).transform(X)

    def predict(self, X: Any) -> Any:
        """The nearest center of every point (the transformer's assignment head in the hard limit)."""
        centers = self._fitted("predict")
        _, seen = self._seen(X)
        return self._out(fast.nearest(seen, centers))

    def _check_soft_memberships(self) -> None:
        """Raise :class:`NoSoftMemberships` where the variant has none: the fitted model's, else
        the ``variant`` named (a checkpoint's model, or a variant not registered, is known once
        fitted)."""
        spec = vars(self).get("_spec")
        if spec is None and self.checkpoint is None:
            try:
                spec = get_variant(self.variant)
            except KtframeError:
                return  # fit says what is wrong with the name
        if spec is not None and not spec.soft_memberships:
            with_them = _variant_names("soft_memberships")
            raise NoSoftMemberships(
                f"variant {spec.name!r} has no soft memberships (Variant.soft_memberships): its assignments are hard; "
                f"expected predict(X) for labels, or a variant with soft memberships: {', '.join(with_them) or '(none)'}"
            )

    @_SoftMembershipsOnly
    def predict_proba(self, X: Any) -> Any:
        """The soft memberships ``(n, k)`` of every point, each row summing to 1: the assignment
        that the variant's model writes for the points at the fitted centers (one step from
        them). Only for variants with soft memberships (``Variant.soft_memberships``): for the
        others the estimator has no ``predict_proba``, and reading it raises
        :class:`NoSoftMemberships` (an :class:`InputError` and an ``AttributeError``)."""
        centers = self._fitted("predict_proba")
        _, seen = self._seen(X)
        with torch.no_grad():
            return self._out(_memberships(self._fitted_model, seen, centers))

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> Any:
        """The opposite of the k-means objective of ``X`` (larger is better, as in scikit-learn),
        each point weighed by ``sample_weight`` if given; one score per task when fitted on many."""
        centers = self._fitted("score")
        tensor, seen = self._seen(X)
        weights = self._check_weights(sample_weight, tensor, self._batched)
        objective = _inertia(tensor, self._user_centers, fast.nearest(seen, centers), weights)
        self._check_result("scoring", objective, self._user_centers, self._batched)
        scores = -objective
        return scores.cpu().numpy() if self._batched else float(scores[0])


def _check_lloyd_last(lloyd_last: Any, steps: int) -> int:
    if isinstance(lloyd_last, bool) or not isinstance(lloyd_last, (int, np.integer)) or not 0 <= lloyd_last <= steps:
        raise InputError(f"lloyd_last must be an integer from 0 to the {steps} steps of the fit (how many of them are Lloyd's); got {lloyd_last!r}")
    return int(lloyd_last)


def _check_swaps(swaps: Any) -> int:
    if isinstance(swaps, bool) or not isinstance(swaps, (int, np.integer)) or swaps < 0:
        raise InputError(f"swaps must be an integer >= 0 (how many swaps follow the steps; 0 for none); got {swaps!r}")
    return int(swaps)


def _finish_with_lloyd(
    lloyd: torch.nn.Module, X: torch.Tensor, C0: torch.Tensor, result: ClusteringResult | None, frame: Frame | None, starts: int, **options: Any
) -> ClusteringResult:
    """The hand-built ``lloyd`` transformer's steps on ``X`` after the model's ``result`` (or
    from ``C0`` where the model ran none): from its centers as a user gets them (in a
    checkpoint's frame, a padded coordinate the layer moved them along dropped); the two
    trajectories one after the other and their iterations added."""
    centers = C0 if result is None else result.centers if frame is None else _in_frame(frame, result.centers, starts)
    finish = lloyd(X, centers, **options)
    if result is None:
        return finish
    return ClusteringResult(
        centers=finish.centers,
        assignments=finish.assignments,
        trajectory=torch.cat([result.trajectory, finish.trajectory[:, 1:]], dim=1),
        n_iter=result.n_iter + finish.n_iter,
    )


def _in_frame(frame: Frame, centers: torch.Tensor, starts: int) -> torch.Tensor:
    """Centers ``(B·starts, k, d)`` of the frame as the user gets them, back in the frame."""
    many, k, d = centers.shape
    return frame.to_model(_to_user(frame, centers, starts).reshape(many // starts, starts * k, -1)).reshape(many, k, d).to(centers.dtype)


def _check_tol(tol: Any) -> float:
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.integer, np.floating)) or not (0 <= tol < math.inf):
        raise InputError(
            f"tol must be a non-negative finite number (scikit-learn's: 1e-4 by default, 0 for only an iteration that changes nothing); got {tol!r}"
        )
    return float(tol)


def _check_variant_options(options: Any) -> dict:
    """``variant_options`` as a dict of the variant's own options (the variant checks their names)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise InputError(f"variant_options must be a dict of the variant's build options, e.g. {{'trim': 0.1}}; got {options!r}")
    if "gamma" in options:
        raise InputError("variant_options holds 'gamma', which is TransformerKMeans' own parameter; expected TransformerKMeans(gamma=...)")
    return dict(options)


def _repeat(tensor: torch.Tensor, starts: int) -> torch.Tensor:
    """Each task of ``tensor`` ``(B, ...)`` ``starts`` times in a row, ``(B·starts, ...)``; the
    tensor itself for one start."""
    return tensor if starts == 1 else tensor.repeat_interleave(starts, dim=0)


def _to_user(frame: Frame, centers: torch.Tensor, starts: int) -> torch.Tensor:
    """Centers ``(B·starts, k, d)`` of the starts of ``frame``'s B tasks in the user's units: each
    task's starts mapped back together, as ``starts·k`` centers of that task."""
    many, k, d = centers.shape
    return frame.to_user(centers.reshape(many // starts, starts * k, d)).reshape(many, k, -1)


def _inertia(X: torch.Tensor, C: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """``(B,)``: Σ wᵢ‖xᵢ − c[labelᵢ]‖² (wᵢ = 1 without ``weights``)."""
    if weights is None:
        return fast.inertia(X, C, labels)
    nearest = torch.gather(C, 1, labels.unsqueeze(-1).expand(-1, -1, C.shape[-1]))
    return ((X - nearest).square().sum(dim=-1) * weights).sum(dim=1)


def _memberships(model: torch.nn.Module, X: torch.Tensor, centers: torch.Tensor) -> torch.Tensor:
    """``(B, n, k)``: the assignment that one step of ``model`` from ``centers`` writes for ``X``.
    A point's assignment reads the centers, not the other points, so fewer points than centers
    are clustered with the centers themselves beside them (a model takes at least k points)."""
    n = X.shape[1]
    points = X if n >= centers.shape[1] else torch.cat([X, centers], dim=1)
    return model(points, centers, n_steps=1).assignments[:, :n]


def _variant_names(flag: str) -> list[str]:
    """The registered variants that declare ``flag`` (a :class:`~ktframe.plugin.Variant` field)."""
    return [name for name in registry().names("variant") if getattr(get_variant(name), flag)]
