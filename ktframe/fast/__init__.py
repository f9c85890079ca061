"""The fast path a variant chooses for its model (:func:`accelerate`): the same mathematics as
:mod:`ktframe.transformer.model`, computed the way a CPU or GPU wants it, by a plan that each module
of the definition is given."""

from ktframe.fast.model import ClusterSums, GroupPlan, HeadPlan, KeyValueSums, LayerPlan, ModelPlan, accelerate, key_value_sums

__all__ = ["ClusterSums", "GroupPlan", "HeadPlan", "KeyValueSums", "LayerPlan", "ModelPlan", "accelerate", "key_value_sums"]
