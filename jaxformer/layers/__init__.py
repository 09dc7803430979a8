"""Parameter specs with logical axis names: the one table every model's parameters come from."""

from jaxformer.layers.params import ParamSpec, block_spec, init_params

__all__ = ["ParamSpec", "block_spec", "init_params"]
