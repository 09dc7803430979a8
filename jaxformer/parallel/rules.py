"""Logical axis rules: the one table that maps parameter/activation axis names to mesh axes.

=================  ===============  ===========================================================
logical axis        mesh axes        why
=================  ===============  ===========================================================
batch               (data, fsdp,     data parallelism; FSDP shards the batch as well, and so
                    expert)          does expert parallelism outside the experts (MaxText)
embed               fsdp             ZeRO-3 / FSDP: every weight with a d_model axis is split
                                     and all-gathered where a layer uses it (Rajbhandari et al.
                                     2020; Zhao et al. 2023)
vocab               tensor           vocabulary-parallel embedding and logits
heads, kv_heads     tensor           Megatron column split of Q/K/V, row split of the output
                                     projection (Shoeybi et al. 2019)
mlp                 tensor           Megatron column split of W_i, row split of W_o
head_dim, layers,   (replicated)     per-head width, the scanned layer axis, learned positions
length
classes, relpos,    (replicated)     small tables
types
act_length          context          activations' sequence axis: context parallelism, attention
                                     as ring attention (Liu et al. 2023;
                                     `jaxformer.parallel.context`); size 1 unless mesh.context>1
act_embed           (replicated)     activations' d_model axis
expert, act_expert  expert           MoE experts' weights `[E, ...]` and their dispatched tokens
                                     `[G, E, C, D]` (GShard, Lepikhin et al. 2020): the reshard
                                     from the batch to the experts is an all-to-all
act_expert_batch    (data, fsdp)     the dispatched tokens' group axis: the batch less the expert
                                     axis, which the experts took
router_expert       (replicated)     the router's `[D, E]` columns (small; float32)
=================  ===============  ===========================================================

Parameters carry logical names (`jaxformer.models.spec`); `param_shardings` turns an abstract
parameter tree and its logical names into `NamedSharding`s for a mesh, and optimizer moments follow their
parameters (`match_shardings_by_path`). Activations carry logical names through
`flax.linen.with_logical_constraint` in the layers; `jaxformer.parallel.partition.sharded_jit`
activates this table while tracing. A name missing from the table is replicated. Every function
taking ``rules`` checks them with `check_rules`: a rule for a retired name (``kv``, now
``head_dim``) would otherwise match nothing and silently replicate what it meant to shard.
"""

from __future__ import annotations

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

LOGICAL_AXIS_RULES: Rules = (
    ("batch", ("data", "fsdp", "expert")),
    ("embed", "fsdp"),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
    ("length", None),
    ("classes", None),
    ("relpos", None),
    ("types", None),
    ("act_length", "context"),
    ("act_embed", None),
    ("expert", "expert"),
    ("act_expert", "expert"),
    ("act_expert_batch", ("data", "fsdp")),
    ("router_expert", None),
)
# Logical names the library used before, and what it calls them now.
RETIRED_AXES = {"kv": "head_dim"}


def check_rules(rules: Rules) -> Rules:
    """``rules`` unchanged, or ValueError if a rule names a retired logical axis (`RETIRED_AXES`)."""
    for rule in rules:
        new = RETIRED_AXES.get(rule[0])
        if new is not None:
            raise ValueError(f"logical axis rule {tuple(rule)!r} names {rule[0]!r}, which is now "
                             f"called {new!r} (the per-head width, next to 'kv_heads'); write "
                             f"{(new, *rule[1:])!r}")
    return rules


def _mesh_axis_size(mesh: Mesh, axes) -> int:
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    size = 1
    for a in axes:
        size *= mesh.shape[a]
    return size


def logical_to_shardings(logical_specs, abstract_values, mesh: Mesh,
                         rules: Rules = LOGICAL_AXIS_RULES):
    """Map a tree of logical `PartitionSpec`s to `NamedSharding`s, checking divisibility.

    Raises ValueError naming the parameter, its shape and the mesh axes when a sharded dimension is
    not divisible by the mesh axes it is mapped to.
    """
    mesh_specs = nn.logical_to_mesh(logical_specs, check_rules(rules))

    def check(path, spec, logical, value):
        spec = spec if isinstance(spec, PartitionSpec) else PartitionSpec()
        logical = logical if isinstance(logical, PartitionSpec) else PartitionSpec()
        for i, (dim, axes) in enumerate(zip(value.shape, spec)):
            n = _mesh_axis_size(mesh, axes)
            if dim % n:
                names = "×".join((axes,) if isinstance(axes, str) else axes)
                fix = "choose mesh sizes that divide it"
                if i < len(logical) and logical[i] == "vocab":  # Megatron pads it: so do we
                    fix += (f", or pad the vocabulary: model.vocab_pad_multiple={n} (or 128, "
                            "which tensor = 2 … 128 divide)")
                raise ValueError(
                    f"parameter {jax.tree_util.keystr(path)} of shape {value.shape} cannot be sharded "
                    f"as {spec} on mesh {dict(mesh.shape)}: dimension {i} (size {dim}) is not "
                    f"divisible by mesh.{names}={n}; {fix}")
        return NamedSharding(mesh, spec)

    is_spec = lambda x: isinstance(x, PartitionSpec) or x is None  # noqa: E731
    return jax.tree_util.tree_map_with_path(check, mesh_specs, logical_specs, abstract_values,
                                            is_leaf=is_spec)


def param_shardings(logical_axes, abstract_params, mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES):
    """Shardings for an abstract parameter tree (`jax.ShapeDtypeStruct` or array leaves) from the
    tree of its logical axis names (a tuple per leaf, `jaxformer.models.Model.logical_axes`)."""
    specs = jax.tree.map(lambda axes: PartitionSpec(*axes), logical_axes,
                         is_leaf=lambda x: isinstance(x, tuple))
    return logical_to_shardings(specs, abstract_params, mesh, rules)


def batch_sharding(mesh: Mesh, ndim: int = 2, rules: Rules = LOGICAL_AXIS_RULES) -> NamedSharding:
    """Batch arrays `[batch, ...]`: leading axis by the ``batch`` rule, the rest replicated."""
    spec = nn.logical_to_mesh_axes(("batch",) + (None,) * (ndim - 1), check_rules(rules))
    return NamedSharding(mesh, spec)


def batch_shards(mesh: Mesh, rules: Rules = LOGICAL_AXIS_RULES) -> int:
    """Number of ways the batch axis is split on ``mesh`` (data × fsdp × expert with the default
    rules)."""
    return _mesh_axis_size(mesh, nn.logical_to_mesh_axes(("batch",), check_rules(rules))[0])


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def match_shardings_by_path(tree, param_shardings_tree, params_abstract, mesh: Mesh):
    """Shardings for a tree that mirrors parameters (e.g. optimizer moments).

    A leaf whose key path ends with a parameter's key path and has the same shape gets that
    parameter's sharding; everything else (step counters, scalars) is replicated.
    """
    table = {}
    for (path, sh), (_, val) in zip(
            jax.tree_util.tree_flatten_with_path(param_shardings_tree)[0],
            jax.tree_util.tree_flatten_with_path(params_abstract)[0]):
        table[_names(path)] = (sh, val.shape)

    def pick(path, leaf):
        names = _names(path)
        for i in range(len(names)):
            hit = table.get(names[i:])
            if hit is not None and hit[1] == getattr(leaf, "shape", None):
                return hit[0]
        return replicated(mesh)

    return jax.tree_util.tree_map_with_path(pick, tree)


def _names(path) -> tuple[str, ...]:
    out = []
    for k in path:
        if isinstance(k, jax.tree_util.DictKey):
            out.append(str(k.key))
        elif isinstance(k, jax.tree_util.GetAttrKey):
            out.append(k.name)
        elif isinstance(k, jax.tree_util.SequenceKey):
            out.append(f"[{k.idx}]")
        else:
            out.append(str(k))
    return tuple(out)
