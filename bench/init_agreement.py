"""Do jaxformer, Hugging Face Flax and PyTorch start and learn alike from their own fresh inits?

Issue 37's check of the per-family initialisation (`ModelConfig.init_scheme`): with the same
rules, each system's loss at initialisation and after a few AdamW steps should agree. One draw per
system cannot settle a difference of a few percent (two HF systems, same rules, were 3.4% apart
after 6 steps on one draw each), so every system is initialised from ``--seeds`` seeds (jaxformer:
``jax.random.key(s)``; HF Flax: ``seed=s``; PyTorch: ``torch.manual_seed(s)``) and the losses
are reported as mean ± standard error over them. The models, the batch (one fixed batch, seed 0)
and the optimizer (AdamW lr 1e-4, weight decay 0.01, dropout off, float32) are those of
`bench/train_families.py` (`bench/peer_models.py`); nothing is timed here.

``loss 0`` is the loss of the fresh init, ``loss N`` the loss after ``--steps`` updates on the
batch. ``vs jaxformer`` is each peer's mean ``loss N`` relative to jaxformer's, with the standard
error of the difference of the two means.

    PYTHONPATH=. .venv-peers/bin/python bench/init_agreement.py                # all three, 3 seeds
    PYTHONPATH=. .venv-peers/bin/python bench/init_agreement.py --families t5 --seeds 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import jax
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import format_table  # noqa: E402
from peer_models import (  # noqa: E402
    add_model_args,
    bench_model,
    hf_flax_apply,
    jaxformer_apply,
    torch_step,
    transformers_version,
)
from train_families import LR, WEIGHT_DECAY, jitted_step  # noqa: E402

from demo.stats import mean_se  # noqa: E402


def jax_losses(step, tx, params, batch, steps: int) -> tuple[float, float]:
    """(loss at ``params``, loss after ``steps`` AdamW updates) with the jitted ``step``."""
    opt_state = jax.jit(tx.init)(params)
    losses = []
    for _ in range(steps + 1):
        params, opt_state, loss = step(params, opt_state, batch)
        losses.append(float(loss))
    return losses[0], losses[-1]


def family_losses(family: str, args) -> dict[str, dict[str, list[float]]]:
    """``{system: {"first": [per seed], "last": [per seed]}}`` for ``family``."""
    bench = bench_model(family, args)
    cfg, np_batch, batch = bench.cfg, bench.np_batch, bench.batch
    tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
    steps = {"jaxformer": jitted_step(family, jaxformer_apply(family, bench.model), tx, "jaxformer")}
    out: dict[str, dict[str, list[float]]] = {}

    def record(system: str, first: float, last: float) -> None:
        row = out.setdefault(system, {"first": [], "last": []})
        row["first"].append(first)
        row["last"].append(last)
        print(f"{family} {system} seed {args.first_seed + len(row['first']) - 1}: {first:.4f} -> "
              f"{last:.4f}",
              file=sys.stderr, flush=True)

    for seed in range(args.first_seed, args.first_seed + args.seeds):
        record("jaxformer", *jax_losses(steps["jaxformer"], tx, bench.init(seed), batch, args.steps))
        hf = hf_flax_apply(family, cfg, seed=seed)
        if hf is not None:  # one compiled step for every seed: the architecture is the same
            steps.setdefault("hf-flax", jitted_step(family, hf[0], tx, "hf_flax"))
            record("hf-flax", *jax_losses(steps["hf-flax"], tx, hf[1], batch, args.steps))
        if not args.no_torch:
            run, _ = torch_step(family, cfg, np_batch, LR, WEIGHT_DECAY, seed=seed)
            losses = [run() for _ in range(args.steps + 1)]
            record("torch", losses[0], losses[-1])
    return out


def summarise(family: str, losses: dict[str, dict[str, list[float]]]) -> list[dict]:
    """One row per system: mean ± SE of the first and last losses, the last vs jaxformer's."""
    ours = mean_se(losses["jaxformer"]["last"])
    rows = []
    for system, seen in losses.items():
        first, last = mean_se(seen["first"]), mean_se(seen["last"])
        row = {"family": family, "system": system, "first": first, "last": last}
        if system != "jaxformer":
            row["vs_jaxformer"] = last["mean"] / ours["mean"] - 1
            row["vs_jaxformer_se"] = math.hypot(last["se"], ours["se"]) / ours["mean"]
        rows.append(row)
    return rows


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default="gpt,bert,t5")
    p.add_argument("--seeds", type=int, default=3, help="initialisations per system")
    p.add_argument("--first_seed", type=int, default=0, help="seeds first_seed, first_seed + 1, …")
    p.add_argument("--steps", type=int, default=6, help="AdamW updates before 'loss N'")
    add_model_args(p)
    p.add_argument("--json", default=None, help="also write the report here")
    args = p.parse_args(argv)
    if args.seeds < 2:
        p.error(f"--seeds={args.seeds}: a standard error needs at least 2")

    rows = []
    for family in args.families.split(","):
        rows += summarise(family, family_losses(family, args))
    report = {"benchmark": "init_agreement", "backend": jax.default_backend(),
              "versions": {"jax": jax.__version__, "transformers": transformers_version()},
              "config": {k: getattr(args, k) for k in ("seeds", "first_seed", "steps", "batch", "seq_len",
                                                       "target_len", "d_model", "layers", "heads",
                                                       "d_ff", "vocab")},
              "results": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    print(json.dumps(report))
    table = [{"family": r["family"], "system": r["system"],
              "first": f"{r['first']['mean']:.3f} ± {r['first']['se']:.3f}",
              "last": f"{r['last']['mean']:.3f} ± {r['last']['se']:.3f}",
              "vs": (f"{r['vs_jaxformer']:+.1%} ± {r['vs_jaxformer_se']:.1%}"
                     if "vs_jaxformer" in r else "")} for r in rows]
    print(f"\n{args.seeds} seeds, {args.steps} AdamW steps (lr {LR}), one fixed batch")
    print(format_table(table, [("family", "family", ""), ("system", "system", ""),
                               ("first", "loss 0", ""), ("last", f"loss {args.steps}", ""),
                               ("vs", "vs jaxformer", "")]))
    return report


if __name__ == "__main__":
    main()
