"""Thin Flax Linen modules: they declare parameters (with logical axis names) and call `jaxformer.ops`."""

from jaxformer.layers.block import Block
from jaxformer.layers.params import ParamSpec, block_spec, init_params
from jaxformer.layers.stack import Stack

__all__ = ["Block", "Stack", "ParamSpec", "block_spec", "init_params"]
