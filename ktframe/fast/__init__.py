"""The fast path a variant chooses for its model (:func:`accelerate`): the same mathematics as
:mod:`ktframe.transformer.model`, computed the way a CPU or GPU wants it."""

from ktframe.fast.model import ClusterSums, FastAttentionHead, FastHeadGroup, FastKMeansTransformer, FastLayer, KeyValueSums, accelerate, key_value_sums

__all__ = ["ClusterSums", "FastAttentionHead", "FastHeadGroup", "FastKMeansTransformer", "FastLayer", "KeyValueSums", "accelerate", "key_value_sums"]
