"""The plugin author's API: everything a clustering variant needs, from this one module.

A variant plugin imports nothing of ktframe but this module (a test holds ktframe's own plugins to
it); CONTRIBUTING.md walks through writing one. What is here, by purpose:

- **declaring**: :data:`hookimpl` (the marker of the hooks in :mod:`ktframe.hooks.hookspecs`),
  :class:`Variant`, :class:`Tolerance`, :func:`exact_tolerance`;
- **building**: the model's definition (:class:`KMeansTransformer`, :class:`Layer`,
  :class:`AttentionHead`, :class:`FeedForward`, the projections :class:`Select` and
  :class:`Linear`), the construction helpers of the Lloyd family (:func:`fixed_head`,
  :func:`assignment_head`, :func:`reset_head`, :func:`mean_head`, :func:`cluster_head`,
  :func:`lloyd_family_layer`, :class:`HeadGroup`, :func:`stack`, :func:`learnable`), the frame
  a model may see each task in (:class:`Standardize`), the
  components a head is made of (:class:`AttentionMap` and :class:`MapOutput`, :class:`Score`,
  :class:`Embedding` and the built-in embeddings) and :func:`registry` to look registered ones up
  by name;
- **the temperature**: :func:`assignment_map` is the one place that says what ``gamma`` means:
  a softmax at finite gamma, the arg-max it tends to at ``gamma = inf``;
- **the fast path**: :func:`accelerate`;
- **checking**: :mod:`reference` (the classical steps: ``sqdist``, ``assign``, ``update``,
  ``iterate``, ``lloyd``), :class:`ClusteringResult`, :class:`InputError`, and the conformance kit
  :func:`check_variant` / :func:`variant_checks`;
- **using one**: :func:`build_model`, :func:`get_variant`.
"""

from ktframe.components.embeddings import Embedding, NoIndex, OneHot, SlotIndex, data_tokens, index_tokens
from ktframe.components.maps import AttentionMap, MapOutput
from ktframe.components.scores import Score
from ktframe.core import reference
from ktframe.core.errors import InputError
from ktframe.core.result import ClusteringResult
from ktframe.fast import accelerate
from ktframe.hooks.hookspecs import Register, RegisterVariant, hookimpl
from ktframe.plugin.build import build_model, get_variant
from ktframe.plugin.manager import registry
from ktframe.plugin.testing import check_variant, variant_checks
from ktframe.plugin.variant import Tolerance, Variant, exact_tolerance
from ktframe.transformer.construction import (
    HeadGroup,
    assignment_head,
    assignment_map,
    check_reset,
    cluster_head,
    coords,
    fixed_head,
    learnable,
    lloyd_family_layer,
    mean_head,
    reset_head,
    slot,
    stack,
)
from ktframe.transformer.model import AttentionHead, FeedForward, KMeansTransformer, Layer, Linear, Select, Standardize

__all__ = [
    "AttentionHead",
    "AttentionMap",
    "ClusteringResult",
    "Embedding",
    "FeedForward",
    "HeadGroup",
    "InputError",
    "KMeansTransformer",
    "Layer",
    "Linear",
    "MapOutput",
    "NoIndex",
    "OneHot",
    "Register",
    "RegisterVariant",
    "Score",
    "Select",
    "SlotIndex",
    "Standardize",
    "Tolerance",
    "Variant",
    "accelerate",
    "assignment_head",
    "assignment_map",
    "build_model",
    "check_reset",
    "check_variant",
    "cluster_head",
    "coords",
    "data_tokens",
    "exact_tolerance",
    "fixed_head",
    "get_variant",
    "hookimpl",
    "index_tokens",
    "learnable",
    "lloyd_family_layer",
    "mean_head",
    "reference",
    "registry",
    "reset_head",
    "slot",
    "stack",
    "variant_checks",
]
