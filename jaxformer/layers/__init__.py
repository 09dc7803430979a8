"""The model definition, free of any module framework: parameter specs with logical axis names
(`params`, the one table every model's parameters come from), the head registry (`heads`) and the
three families' forward passes over those parameters (`forward`). The NNX modules
(`jaxformer.nnx`) hold the parameters and call `forward`."""

from jaxformer.layers.params import ParamSpec, block_spec, init_params

__all__ = ["ParamSpec", "block_spec", "init_params"]
