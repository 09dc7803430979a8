"""Which ``mesh.tensor`` sizes each preset's parameters divide (docs/scaling.md's table).

    python bench/tensor_sizes.py              # JSON lines, then the markdown table
    python bench/tensor_sizes.py --markdown   # the table only, as docs/scaling.md quotes it

For every preset (the ``_bf16`` twins have the same shapes and are left out) and every size
``t`` = 2 … 128, the preset's parameter tree (`jaxformer.models.spec.model_spec`, shapes and
logical axes) is sharded on an abstract mesh ``tensor=t`` by the trainer's own check
(`jaxformer.parallel.rules.logical_to_shardings`): ``t`` is listed when nothing is refused. The
rules send ``heads``, ``kv_heads``, ``mlp`` (d_ff) and ``vocab`` (the stored rows, padded to
``model.vocab_pad_multiple``) to ``tensor``, so ``t`` must divide all four. Each preset is checked
with one layer (its layers have the same shapes). No device and no compile: about a second.
"""

from __future__ import annotations

import argparse
import json

import jax
from jax.sharding import AbstractMesh, PartitionSpec

from jaxformer.config import ModelConfig
from jaxformer.models.presets import PRESETS
from jaxformer.models.spec import ParamSpec, model_spec
from jaxformer.parallel.mesh import MESH_AXES
from jaxformer.parallel.rules import logical_to_shardings

SIZES = range(2, 129)  # the tensor sizes tried


def accepted_sizes(cfg: ModelConfig, sizes=SIZES) -> list[int]:
    """The sizes ``t`` for which ``cfg``'s parameters shard on a mesh ``tensor=t``."""
    spec = model_spec(cfg)
    is_spec = lambda x: isinstance(x, ParamSpec)  # noqa: E731
    logical = jax.tree.map(lambda s: PartitionSpec(*s.axes), spec, is_leaf=is_spec)
    shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, cfg.param_dtype), spec,
                          is_leaf=is_spec)
    out = []
    for t in sizes:
        mesh = AbstractMesh(tuple(t if a == "tensor" else 1 for a in MESH_AXES), MESH_AXES)
        try:
            logical_to_shardings(logical, shapes, mesh)
        except ValueError:
            continue
        out.append(t)
    return out


def rows() -> list[dict]:
    out = []
    for name in sorted(p for p in PRESETS if not p.endswith("_bf16")):
        cfg = ModelConfig.from_dict(PRESETS[name])
        one_layer = ModelConfig.from_dict(dict(PRESETS[name], num_layers=1))  # layers are alike
        out.append({"preset": name, "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads,
                    "d_ff": cfg.d_ff,  # an image model (ViT) has no token table
                    "vocab_rows": None if cfg.image_size else cfg.padded_vocab_size,
                    "tensor": accepted_sizes(one_layer)})
    return out


def markdown(table: list[dict]) -> str:
    lines = ["| preset | heads | kv heads | d_ff | vocabulary rows "
             "| `mesh.tensor` that divides them (2 … 128) |", "|---|---:|---:|---:|---:|---|"]
    for r in table:
        sizes = ", ".join(map(str, r["tensor"])) or "none"
        lines.append(f"| {r['preset']} | {r['heads']} | {r['kv_heads']} | {r['d_ff']:,} | "
                     f"{'—' if r['vocab_rows'] is None else format(r['vocab_rows'], ',')} | {sizes} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true", help="print the table only")
    a = p.parse_args()
    table = rows()
    if not a.markdown:
        for r in table:
            print(json.dumps(r))
        print()
    print(markdown(table))


if __name__ == "__main__":
    main()
