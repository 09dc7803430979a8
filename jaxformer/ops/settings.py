"""The type of the model settings that the block, stack, input and head functions read.

Those functions take a `jaxformer.config.ModelConfig` and read its fields (``cfg.norm``,
``cfg.dropout_rate``, …). `jaxformer.config` sits above ops (it validates against the ops'
tables: activations, attention implementations, RoPE scalings, remat policies), so ops never import
it, not even for a type hint: any object with those fields serves.
"""

from typing import Any

ModelSettings = Any  # a jaxformer.config.ModelConfig, read field by field
