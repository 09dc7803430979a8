"""How far the training loss curves of two meshes drift apart, step by step, in float32 and in
float64 (docs/scaling.md, context parallelism; issue 60).

    python bench/context_drift.py             # T5 span corruption, 20 steps: data=4 vs context=4, fsdp=4
    python bench/context_drift.py --float64   # the same runs in float64
    python bench/context_drift.py --set data.tokenizer.max_train_texts=2000   # a quicker tokenizer

Each mesh is one ``train.py`` run of ``--config`` (default `configs/t5_pretrain_tiny.py`) for
``--steps`` steps with a loss logged every step, in a child process on simulated CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=N``), in a temporary workdir; the losses are
read back from its ``metrics.jsonl``. The first mesh of ``--meshes`` is the reference. Every run
trains the same tokenizer on the same texts and sees the same batches, so the curves differ only
by the order in which each mesh sums (matmuls split over devices, all-reduces, the ring's online
softmax). In float32 such a difference starts at rounding (~1e-7 of the loss) and training can
amplify it (Adam divides each gradient component by its own running scale, so a rounding
difference in a near-zero component becomes a difference of its whole update); ``--float64``
runs parameters and compute in float64 (``jax_enable_x64``; `ModelConfig` validates float32 /
bfloat16 / float16 only, so the child sets the built config's ``dtype`` and ``param_dtype`` to
float64 — the ops compute in their inputs' dtype), where the same curves agree to float64
rounding if the meshes compute the same function. Prints one JSON line per mesh, then the
relative difference to the reference at every step.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir)

# The child: train.py's command line, optionally with every ModelConfig in float64.
_CHILD = """
import sys
if sys.argv.pop(1) == "float64":
    import jax
    jax.config.update("jax_enable_x64", True)
    from jaxformer.config import ModelConfig
    build = ModelConfig.from_dict.__func__
    def from_dict(cls, d):
        cfg = build(cls, d)
        object.__setattr__(cfg, "dtype", "float64")
        object.__setattr__(cfg, "param_dtype", "float64")
        return cfg
    ModelConfig.from_dict = classmethod(from_dict)
from jaxformer.cli.train import run
run()
"""


def train_losses(config: str, mesh: str, steps: int, sets: list[str], float64: bool) -> list[float]:
    """The per-step training losses of one ``train.py`` run on ``mesh`` (``"context=4"``)."""
    axes = dict(part.split("=") for part in mesh.split(","))
    devices = math.prod(int(v) for v in axes.values())
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    with tempfile.TemporaryDirectory() as workdir:
        cmd = [sys.executable, "-c", _CHILD, "float64" if float64 else "float32",
               "--config", config, "--workdir", workdir, f"--config.num_train_steps={steps}",
               "--config.log_every_steps=1", "--config.eval.every_steps=1000000",
               "--config.checkpoint.every_steps=1000000", "--config.progress_bar=False",
               *(f"--config.mesh.{k}={v}" for k, v in axes.items()), *(f"--config.{s}" for s in sets)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, cwd=ROOT)
        if out.returncode:
            sys.exit(f"{mesh}: train.py failed\n{out.stderr[-3000:]}")
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    by_step = {r["step"]: r["loss"] for r in rows if "loss" in r}
    return [by_step[s] for s in range(1, steps + 1)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="configs/t5_pretrain_tiny.py")
    p.add_argument("--meshes", default="data=4;context=4;fsdp=4", help="';'-separated, first = reference")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--float64", action="store_true")
    p.add_argument("--set", action="append", default=[], help="a config override, e.g. data.seq_len=64")
    a = p.parse_args()
    meshes = a.meshes.split(";")
    losses = {}
    for mesh in meshes:
        losses[mesh] = train_losses(a.config, mesh, a.steps, a.set, a.float64)
        print(json.dumps({"config": a.config, "mesh": mesh, "float64": a.float64, "losses": losses[mesh]}),
              flush=True)
    ref = losses[meshes[0]]
    for mesh in meshes[1:]:
        rel = [abs(x - r) / abs(r) for x, r in zip(losses[mesh], ref)]
        worst = max(range(len(rel)), key=rel.__getitem__)
        print(f"\n{mesh} vs {meshes[0]}: max relative difference {rel[worst]:.3g} (step {worst + 1}); "
              "per step:\n  " + " ".join(f"{x:.1e}" for x in rel))


if __name__ == "__main__":
    main()
