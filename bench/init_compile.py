"""How long the trainer's first act takes: compiling and running the initialiser of a fresh train
state, per preset, on the default backend.

`jaxformer.train.state.create_train_state` jits ``init + optimizer init`` straight into the mesh's
shardings, so that each device draws only its own shards (what a pod needs). On the first H100 run
(issue 39, jax 0.11.2) jitting gpt2_medium's initialiser took minutes to compile; on GPUs the
trainer now draws on the host CPU instead (`jaxformer.train.state.draws_on_host`). Each (preset,
variant) runs in a fresh process under a time limit, so that a slow compile costs only its row.

Variants:

* ``default``: the trainer's path as it is (on a GPU: drawn by the host CPU, then placed);
* ``device``: drawn on the devices by one jitted program (``draws_on_host`` off: the path of TPUs,
  CPUs and several processes, and GPUs' before);
* ``autotune0``: ``device`` with ``--xla_gpu_autotune_level=0`` (no GEMM / fusion autotuning);
* ``unpartitionable``: ``device`` with ``jax_threefry_partitionable=False`` (the older
  random-bits lowering).

Per row, for two fresh states made one after the other: ``first_s`` and ``second_s``, each whole
call's seconds, and ``compile_s``, the XLA backend compiles of the first (jax.monitoring's
``backend_compile_duration`` events). `create_train_state` jits a new function per call, so the
second call compiles again (from the in-memory executable cache when the backend has one); the
rest of each call is tracing, lowering and running. One JSON line per row.

    python bench/init_compile.py --presets gpt2_small_bf16,gpt2_medium_bf16 --timeout 120
    python bench/init_compile.py --presets gpt_tiny --variants default,unpartitionable  # CPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

VARIANTS = ("default", "device", "autotune0", "unpartitionable")


def child(preset_name: str, variant: str) -> dict:
    """One row, in this process (the parent's subprocess)."""
    import jax
    import optax

    from jaxformer.config import ModelConfig
    from jaxformer.host import skip_absent_tpu
    from jaxformer.models import build_model
    from jaxformer.models.presets import preset
    from jaxformer.parallel.mesh import make_mesh
    from jaxformer.train import state as state_module

    skip_absent_tpu()  # no failed libtpu start-up on a CPU host (jaxformer.host)
    if variant != "default":  # drawn on the devices
        state_module.draws_on_host = lambda mesh: False
    if variant == "unpartitionable":
        jax.config.update("jax_threefry_partitionable", False)
    cfg = ModelConfig.from_dict(preset(preset_name))
    model = build_model(cfg)
    tx = optax.adamw(1e-4)
    mesh = make_mesh({"data": 1, "fsdp": -1})

    def fresh_state():
        return state_module.create_train_state(model, tx, mesh, seed=0)[0]

    compiles: list[float] = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **_: compiles.append(seconds)
        if event == "/jax/core/compile/backend_compile_duration" else None)
    times, compile_s = [], []
    for _ in range(2):
        compiles.clear()
        t0 = time.perf_counter()
        jax.block_until_ready(fresh_state())
        times.append(time.perf_counter() - t0)
        compile_s.append(sum(compiles))
    return {"preset": preset_name, "variant": variant, "backend": jax.default_backend(),
            "device": str(jax.devices()[0].device_kind),
            "drawn_on_host": state_module.draws_on_host(mesh), "first_s": times[0],
            "second_s": times[1], "compile_s": compile_s[0], "second_compile_s": compile_s[1],
            "jax": jax.__version__}


def run_row(preset_name: str, variant: str, timeout: float) -> dict:
    env = dict(os.environ)
    if variant == "autotune0":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()
    cmd = [sys.executable, os.path.abspath(__file__), "--child", preset_name, variant]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"preset": preset_name, "variant": variant, "error": f"over {timeout:.0f} s"}
    rows = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not rows:
        return {"preset": preset_name, "variant": variant, "error": out.stderr.strip()[-400:],
                "wall_s": time.perf_counter() - t0}
    return {**json.loads(rows[-1]), "wall_s": time.perf_counter() - t0}


def main(argv=None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--presets", default="gpt2_small_bf16,gpt2_medium_bf16")
    p.add_argument("--variants", default="default,device",
                   help=f"comma-separated, of {VARIANTS}")
    p.add_argument("--timeout", type=float, default=120, help="seconds per row")
    p.add_argument("--parallel", type=int, default=1,
                   help="rows run at once (compiles use the host's cores; rows share the device)")
    p.add_argument("--child", nargs=2, metavar=("PRESET", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child)), flush=True)
        return []
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        p.error(f"--variants: unknown {sorted(unknown)}; choose from {VARIANTS}")
    jobs = [(name, v) for name in args.presets.split(",") if name for v in variants]
    rows = []
    with ThreadPoolExecutor(max(1, args.parallel)) as pool:
        for row in pool.map(lambda job: run_row(*job, args.timeout), jobs):
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
