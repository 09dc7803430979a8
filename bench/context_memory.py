"""Per-device memory of the train step as the context axis grows (docs/scaling.md).

    python bench/context_memory.py --contexts 1,2,4,8                 # simulated CPU devices
    python bench/context_memory.py --contexts 8,64 --topology v5p     # TPU v5p, libtpu on this host

gpt2_medium (bf16) on one row of ``--seq_len`` tokens (default 32768), ``mesh.context=N`` on ``N``
devices, ``--layers`` layers (default 2: per-layer activations are what the context axis divides;
the full 24 layers take 10+ minutes per compile here and scale the same per layer). ``context=1``
runs ``attention_impl="chunked"`` (memory-linear attention on one device, the fair baseline);
``context > 1`` runs ring attention. Prints per-device bytes from XLA's buffer assignment
(`jaxformer.plan.compiled_memory`), and the collectives of the compiled HLO
(`jaxformer.compile.collectives`): keys/values move by collective-permute, none is all-gathered.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def _config(context: int, seq_len: int, layers: int):
    from jaxformer.plan import preset_config

    c = preset_config("gpt2_medium_bf16", batch=1, seq_len=seq_len, mesh=f"data=1,context={context}")
    c.model.num_layers, c.model.max_len = layers, seq_len
    c.model.attention_impl = "chunked" if context == 1 else "xla"
    c.model.remat_policy = "full"  # a layer's activations are recomputed in the backward pass
    return c


def measure(context: int, seq_len: int, layers: int, topology: str = "") -> dict:
    import jax

    from jaxformer.compile import collectives
    from jaxformer.parallel.mesh import make_mesh
    from jaxformer.plan import compile_on_topology, compile_train_step, compiled_memory

    config = _config(context, seq_len, layers)
    if topology:
        from jaxformer.parallel.topology import parse_topology

        compiled, seconds, _ = compile_on_topology(config, parse_topology(topology))
    else:
        mesh = make_mesh(dict(config.mesh), jax.devices()[:context])
        compiled, seconds = compile_train_step(config, mesh)
    comm = {k: v for k, v in collectives(compiled.as_text()).items() if v["count"]}
    return {"context": context, "seq_len": seq_len, "layers": layers,
            "platform": topology or "cpu", "compile_s": round(seconds, 1),
            **compiled_memory(compiled), "collectives": comm}


_TOPOLOGY = {("v5p", 8): "v5p:2x2x2", ("v5p", 64): "v5p:4x4x4", ("v5p", 4): "v5p:2x2x1",
             ("v5p", 16): "v5p:2x2x4", ("v5p", 32): "v5p:2x4x4"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="1,2,4,8")
    p.add_argument("--seq_len", type=int, default=32768)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--topology", default="", help="chip generation, e.g. v5p (default: CPU)")
    p.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        topo = _TOPOLOGY[(a.topology, a.child)] if a.topology else ""
        print(json.dumps(measure(a.child, a.seq_len, a.layers, topo)))
        return
    rows = []
    for n in map(int, a.contexts.split(",")):
        env = dict(os.environ, JAX_PLATFORMS="cpu",
                   XLA_FLAGS=f"--xla_force_host_platform_device_count={max(n, 1)}")
        out = subprocess.run([sys.executable, __file__, "--child", str(n), "--seq_len",
                              str(a.seq_len), "--layers", str(a.layers), "--topology", a.topology],
                             env=env, capture_output=True, text=True, check=False)
        if out.returncode:
            sys.exit(out.stderr[-3000:])
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]["temp_size"]
    print(f"\n{'context':>7} {'platform':>10} {'temp MiB':>10} {'x base':>7} {'args MiB':>9}  "
          "collectives (count)")
    for r in rows:
        comm = ", ".join(f"{k} {v['count']}" for k, v in r["collectives"].items())
        print(f"{r['context']:>7} {r['platform']:>10} {r['temp_size'] / 2**20:>10.1f} "
              f"{r['temp_size'] / base:>7.3f} {r['argument_size'] / 2**20:>9.1f}  {comm}")


if __name__ == "__main__":
    main()
