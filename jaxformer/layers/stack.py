"""A stack of `Block`s: unrolled, or scanned with `nn.scan`, optionally rematerialised.

Scanning compiles one layer instead of ``num_layers`` (fast compiles for deep models) and stacks the
parameters along a leading ``layers`` axis; unrolled stacks name layers ``layer_0 … layer_{N-1}``.
Both compute the same function (tested). With ``cfg.share_layers`` (ALBERT, Lan et al. 2019) one
block named ``shared`` is applied ``num_layers`` times: a loop calling the same module, or an
``nn.scan`` that broadcasts its parameters. ``remat_policy`` trades compute for activation memory
(`jax.checkpoint` policies: "full" saves nothing, "dots" saves matmul outputs).
"""

from __future__ import annotations

import flax.linen as nn

from jaxformer.config import ModelConfig
from jaxformer.layers.block import Block
from jaxformer.ops.stack import REMAT_POLICIES


class Stack(nn.Module):
    """``num_layers`` blocks applied in order (each block's output feeds the next)."""

    cfg: ModelConfig
    num_layers: int
    causal: bool = False
    cross_attention: bool = False
    deterministic: bool = True
    decode: bool = False

    @nn.compact
    def __call__(self, x, positions=None, segment_ids=None, bias=None, encoder_out=None,
                 encoder_segment_ids=None, cross_bias=None, cache_index=None, two_stream=None):
        """`[B, L, D]` → `[B, L, D]`; with ``two_stream`` (XLNet's permutation LM, see
        `jaxformer.ops.stack.stack_block`) the pair (content, query stream) → the pair."""
        cfg = self.cfg
        block_cls = Block
        if cfg.remat_policy != "none":
            block_cls = nn.remat(Block, policy=REMAT_POLICIES[cfg.remat_policy],
                                 prevent_cse=not cfg.scan_layers)
        attrs = dict(cfg=cfg, causal=self.causal, cross_attention=self.cross_attention,
                     deterministic=self.deterministic, decode=self.decode)
        args = (positions, segment_ids, bias, encoder_out, encoder_segment_ids, cross_bias,
                cache_index, two_stream)
        if cfg.share_layers:
            return self._shared(block_cls, attrs, x, args)
        if cfg.scan_layers:
            scanned = nn.scan(
                block_cls,
                variable_axes={"params": 0, "cache": 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast,) * len(args),
                length=self.num_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = scanned(**attrs, name="layers")(x, *args)
            return x
        for i in range(self.num_layers):
            x, _ = block_cls(**attrs, name=f"layer_{i}")(x, *args)
        return x

    def _shared(self, block_cls, attrs, x, args):
        """One block's parameters for every layer (each call draws its own dropout key)."""
        if self.decode:
            raise ValueError("model.share_layers=True stacks do not decode (encoder family only)")
        if self.cfg.scan_layers:
            scanned = nn.scan(block_cls, variable_broadcast="params",
                              split_rngs={"params": False, "dropout": True},
                              in_axes=(nn.broadcast,) * len(args), length=self.num_layers)
            return scanned(**attrs, name="shared")(x, *args)[0]
        block = block_cls(**attrs, name="shared")
        for _ in range(self.num_layers):
            x, _ = block(x, *args)
        return x
