"""Training-step throughput of GPT, BERT and T5 against Hugging Face Flax and PyTorch, same run.

For each family (``--families``) three systems train the same model (`bench/peer_models.py`: same
architecture, same parameter count, float32, dropout off, AdamW lr 1e-4 weight decay 0.01):

* ``jaxformer``: the model (`build_model`: NNX, merged while tracing), a jitted forward + backward +
  `optax.adamw` step (buffers donated);
* ``hf-flax``: transformers' Flax model (4.57.6, in ``.venv-peers``: `make peers`) in the same
  jitted step, the same loss function (`jaxformer.ops.weighted_cross_entropy`) and optimizer;
* ``torch``: transformers' PyTorch model, eager, `torch.optim.AdamW`, its own loss.

Sizes (defaults, the issue's GPT): d_model 512, 8 heads, d_ff 2048, vocab 8192, batch 8, L 256;
6 layers (GPT, BERT; T5: 6 encoder + 6 decoder layers, 256 input and 64 target tokens — the
span-corruption shape of 15% noise, mean span 3). Tokens/s counts the model's input tokens per
step (GPT and BERT: B·L; T5: B·(L + L_t)).

Steps are timed round-robin (one step of each system per round) so that load on the shared
machine hits all alike; ratios (``vs hf-flax``, ``vs torch``) come from the same run. MFU divides
the model FLOPs (`bench/common.py`) by the float32 matmul peak measured in the same run. ``temp
MiB`` is the compiled step's temporary memory (`memory_analysis`).

Each system starts from its own fresh initialisation (jaxformer's ``init_scheme`` of the preset,
HF's ``_init_weights``: the same rules, other draws) and trains on one fixed batch; ``loss 0`` is
the loss at initialisation, ``loss N`` the one the last step computes (after ``1 + warmup + steps -
1`` updates). With the same rules the curves agree: T5 at the defaults 9.62 -> 8.01 (HF Flax 9.63 ->
8.10, PyTorch 9.55 -> 7.84); jaxformer's former flat 0.02 kernels gave 17.84 -> 9.22
(docs/benchmarks.md).

``--scan_compile 2,24`` also times compiling the jaxformer GPT step with ``scan_layers`` at 2 and 24
layers (the ratio should stay near 1: the scanned body is compiled once).

    .venv-peers/bin/python bench/train_families.py                    # all three, ~5 minutes
    .venv-peers/bin/python bench/train_families.py --families gpt --steps 10
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    compile_seconds,
    format_table,
    measure_matmul_peak,
    time_round_robin,
)
from peer_models import (  # noqa: E402
    add_model_args,
    bench_model,
    hf_flax_apply,
    jaxformer_apply,
    make_batch,
    mean_loss,
    model_config,
    torch_step,
    transformers_version,
    with_layers,
)

from jaxformer.flops import model_flops  # noqa: E402
from jaxformer.models import build_model  # noqa: E402

LR, WEIGHT_DECAY = 1e-4, 0.01


def count(tree) -> int:
    return sum(x.size for x in jax.tree_util.tree_leaves(tree))


def jitted_step(family: str, apply, tx, name: str = "step"):
    """The pure jitted AdamW step of ``apply(params, batch) -> logits``; params, state donated.
    ``name`` names the compiled HLO module (``jit_<name>``), which tells systems apart in a trace."""

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: mean_loss(family, apply(p, batch), batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    step.__name__ = step.__qualname__ = name
    return jax.jit(step, donate_argnums=(0, 1))


def prepare_jax(name: str, family: str, apply, params, batch) -> dict:
    """Compile the step; returns the entry (row + ``run``) of a JAX system."""
    tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
    opt_state = jax.jit(tx.init)(params)
    compiled, compile_s = compile_seconds(jitted_step(family, apply, tx), params, opt_state, batch)
    mem = compiled.memory_analysis()
    state = {"params": params, "opt": opt_state}

    def run():
        state["params"], state["opt"], loss = compiled(state["params"], state["opt"], batch)
        return loss

    return {"row": {"system": name, "compile_s": compile_s, "params": count(params),
                    "temp_mib": mem.temp_size_in_bytes / 2**20 if mem is not None else None},
            "run": run}


def prepare_family(family: str, args) -> tuple[list[dict], dict]:
    """The entries of ``family`` (jaxformer, hf-flax if installed, torch) and its FLOPs."""
    bench = bench_model(family, args)
    cfg, np_batch, batch, model = bench.cfg, bench.np_batch, bench.batch, bench.model
    params = bench.init(0)
    flops = model_flops(cfg, params, args.batch, args.seq_len, args.target_len)
    entries = [prepare_jax("jaxformer", family, jaxformer_apply(family, model), params, batch)]
    hf = hf_flax_apply(family, cfg)
    if hf is not None:
        entries.append(prepare_jax("hf-flax", family, hf[0], hf[1], batch))
    if not args.no_torch:
        run, n = torch_step(family, cfg, np_batch, LR, WEIGHT_DECAY)
        entries.append({"row": {"system": "torch", "params": n}, "run": run})
    for e in entries:
        e["row"].update(family=family, flops=flops["model_flops_per_step"],
                        tokens=flops["tokens_per_step"] + (args.batch * args.target_len
                                                           if family == "t5" else 0))
    return entries, flops


def scan_compile_times(args) -> dict:
    """Seconds to lower + compile the jaxformer GPT step with ``scan_layers`` per layer count."""
    out = {}
    for layers in (int(n) for n in args.scan_compile.split(",")):
        cfg = with_layers(model_config("gpt", args), layers, scan_layers=True)
        model = build_model(cfg)
        batch = {k: jnp.asarray(v) for k, v in make_batch("gpt", cfg, args).items()}
        params = jax.jit(model.init)(jax.random.key(0), batch["tokens"][:, :-1])
        tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
        step = jitted_step("gpt", jaxformer_apply("gpt", model), tx)
        out[layers] = compile_seconds(step, params, jax.jit(tx.init)(params), batch)[1]
    return out


def add_ratios(rows: list[dict], peak: float) -> None:
    for r in rows:
        r["tokens_per_s"] = r["tokens"] / r["step_s"]
        r["mfu"] = r["flops"] / r["step_s"] / peak
    for r in rows:
        same = {o["system"]: o for o in rows if o["family"] == r["family"]}
        for peer in ("hf-flax", "torch"):
            if peer in same:
                r[f"vs_{peer}"] = r["tokens_per_s"] / same[peer]["tokens_per_s"]


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--families", default="gpt,bert,t5")
    p.add_argument("--steps", type=int, default=4, help="timed steps per system")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps after the first")
    add_model_args(p)
    p.add_argument("--scan_compile", default="2,24",
                   help="layer counts whose scan_layers compile time is measured ('' skips)")
    p.add_argument("--matmul_n", type=int, default=2048)
    args = p.parse_args(argv)

    rows, flops = [], {}
    peak = measure_matmul_peak(args.matmul_n, jnp.float32)["peak_flops"]
    for family in args.families.split(","):
        entries, flops[family] = prepare_family(family, args)
        time_round_robin(entries, steps=args.steps, warmup=args.warmup)
        rows += [e["row"] for e in entries]
    peak = max(peak, measure_matmul_peak(args.matmul_n, jnp.float32)["peak_flops"])
    add_ratios(rows, peak)
    scan = scan_compile_times(args) if args.scan_compile else {}
    report = {
        "benchmark": "train_families", "backend": jax.default_backend(), "cpu_count": os.cpu_count(),
        "versions": {"jax": jax.__version__, "transformers": transformers_version()},
        "config": {k: getattr(args, k) for k in ("batch", "seq_len", "target_len", "d_model",
                                                 "layers", "heads", "d_ff", "vocab", "steps")},
        "matmul_peak_flops": peak, "results": [{k: v for k, v in r.items()} for r in rows],
        "scan_compile_s": scan,
    }
    if len(scan) >= 2:
        report["scan_compile_ratio"] = scan[max(scan)] / scan[min(scan)]
    print(json.dumps(report))
    print(f"\nmatmul peak {peak / 1e9:.1f} GFLOP/s (float32, {args.matmul_n}²), "
          f"jax {jax.__version__}, transformers {transformers_version()}")
    print(format_table(rows, [
        ("family", "family", ""), ("system", "system", ""), ("tokens_per_s", "tokens/s", ".0f"),
        ("step_s", "step s", ".3f"), ("vs_hf-flax", "vs hf-flax", ".2f"),
        ("vs_torch", "vs torch", ".2f"), ("mfu", "MFU", ".1%"), ("temp_mib", "temp MiB", ".0f"),
        ("compile_s", "compile s", ".1f"), ("params", "params", "d"),
        ("first_loss", "loss 0", ".3f"), ("final_loss", "loss N", ".3f")]))
    if scan:
        print("scan_layers compile s: " + ", ".join(f"{n} layers {s:.1f}" for n, s in scan.items())
              + (f"  (ratio {report['scan_compile_ratio']:.2f})" if len(scan) >= 2 else ""))
    return report


if __name__ == "__main__":
    main()
