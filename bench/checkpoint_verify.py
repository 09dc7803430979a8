"""Cost of checkpoint verification: sha256 of every file (`jaxformer.checkpoint.verify.verify_step`),
against Orbax restoring the same step (the reference measured in the same run).

Saves a train-state-like tree of ``--gb`` GB of float32 (random, so incompressible) with the
trainer's `Checkpointer`, then times verification and restore ``--repeats`` times each (files in
the page cache after the save: this measures hashing, not the disk). Prints one JSON line and a
short table::

    python bench/checkpoint_verify.py --gb 1.0 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from jaxformer.host import skip_absent_tpu

skip_absent_tpu()  # no failed libtpu start-up on a CPU host (jaxformer.host)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gb", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temp dir)")
    args = p.parse_args(argv)

    from jaxformer.checkpoint import Checkpointer
    from jaxformer.checkpoint.verify import verify_step

    n_leaves = 16
    per_leaf = int(args.gb * 1e9 / 4 / n_leaves)
    rng = np.random.default_rng(0)
    state = {"params": {f"w{i}": rng.standard_normal(per_leaf, dtype=np.float32)
                        for i in range(n_leaves)}}
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        ckpt = Checkpointer(tmp, async_save=False)
        t0 = time.perf_counter()
        ckpt.save(1, state)
        save_s = time.perf_counter() - t0
        step_dir = Path(tmp) / "checkpoints" / "1"
        nbytes = sum(f.stat().st_size for f in step_dir.rglob("*") if f.is_file())
        verify, restore = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            verify_step(step_dir)
            verify.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            jax.block_until_ready(ckpt.restore(abstract, step=1, verified=True)[0])
            restore.append(time.perf_counter() - t0)
        ckpt.close()
    gb = nbytes / 1e9
    report = {"checkpoint_gb": round(gb, 3), "save_with_manifest_s": round(save_s, 3),
              "verify_s": round(statistics.median(verify), 3),
              "restore_s": round(statistics.median(restore), 3),
              "verify_s_per_gb": round(statistics.median(verify) / gb, 3),
              "restore_s_per_gb": round(statistics.median(restore) / gb, 3),
              "verify_over_restore": round(statistics.median(verify) / statistics.median(restore), 3),
              "repeats": args.repeats, "backend": jax.default_backend()}
    print(json.dumps(report))
    print(f"{'checkpoint':>12} {'verify':>10} {'restore':>10} {'verify/restore':>15}")
    print(f"{gb:>10.2f}GB {report['verify_s_per_gb']:>7.2f}s/GB {report['restore_s_per_gb']:>7.2f}s/GB "
          f"{report['verify_over_restore']:>15.2f}")


if __name__ == "__main__":
    main()
