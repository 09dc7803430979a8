"""Training-step throughput and MFU of GPT-2 small / medium, BERT-base and T5-base in bfloat16 on
an accelerator, per attention implementation the backend can run.

Each model is the ``<preset>_bf16`` preset (`jaxformer.models.presets`: bfloat16 compute, float32
parameters, no attention dropout) trained by the trainer's own jitted step
(`jaxformer.train.step.make_train_step`, AdamW) on its objective: ``clm`` for GPT-2, ``mlm`` for
BERT, ``seq2seq`` for T5 (inputs ``--seq_len``, targets ``--seq_len // 4``, as span corruption
leaves them), on random tokens packed two documents per row (segment ids, as the data pipeline
packs them). Implementations (``--impls auto``): ``xla`` plus the backend's fused kernel
(`jaxformer.ops.kernel_choice.fastest_attention`: ``cudnn`` on a CUDA GPU, ``splash`` on a
TPU: what ``attention_impl="auto"`` picks for the model, `ModelConfig.attention_kernel`). Steps
of one model's implementations are timed round-robin (`bench/train_step.py`), and MFU is model FLOPs
(`jaxformer.flops`: 6·N·tokens + attention, causal halved) / step time / the bfloat16 matmul peak
measured in the same run, before and after (the best of both).

    python bench/accelerator.py                       # on a GPU / TPU
    python bench/accelerator.py --tiny                # CPU smoke run: tiny models, ~1 CPU-minute
    python bench/accelerator.py --models gpt2_medium --impls xla,cudnn --batch 16 --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    format_table,
    measure_copy_bandwidth,
    measure_matmul_peak,
    time_calls,
)
from gpu_profile import print_profile, profile_step  # noqa: E402
from train_step import time_round_robin  # noqa: E402

from jaxformer.config import ModelConfig  # noqa: E402
from jaxformer.decode import GenerationConfig, generate_padded  # noqa: E402
from jaxformer.flops import model_flops  # noqa: E402
from jaxformer.models import build_model  # noqa: E402
from jaxformer.models.presets import preset  # noqa: E402
from jaxformer.objectives import bind_objective  # noqa: E402
from jaxformer.train.state import TrainState, init_params_on_host  # noqa: E402
from jaxformer.train.step import make_train_step  # noqa: E402
from jaxformer.vocab import SpecialTokens  # noqa: E402

# model → (preset, its --tiny stand-in, objective)
MODELS = {
    "gpt2_medium": ("gpt2_medium_bf16", "gpt_tiny", "clm"),
    "gpt2_small": ("gpt2_small_bf16", "gpt_tiny", "clm"),
    "bert_base": ("bert_base_bf16", "bert_tiny", "mlm"),
    "t5_base": ("t5_base_bf16", "t5_tiny", "seq2seq"),
}
TINY_OVERRIDES = dict(dtype="bfloat16", param_dtype="float32", attention_dropout_rate=0.0)


def model_config(name: str, impl: str, args) -> ModelConfig:
    """The model's bf16 preset (or, with ``--tiny``, its tiny preset in bf16) with ``impl``;
    ValueError (naming the field) where the kernel cannot compute the model."""
    full, tiny, _ = MODELS[name]
    overrides = dict(attention_impl=impl, max_len=max(args.seq_len, 128))
    if args.scan_layers:
        overrides["scan_layers"] = True
    if name.startswith("t5"):
        overrides.pop("max_len")  # relative positions: no table to size
    if impl == "chunked":
        overrides["attention_chunk_size"] = min(512, args.seq_len)
    return ModelConfig.from_dict(preset(tiny, **TINY_OVERRIDES, **overrides) if args.tiny
                                 else preset(full, **overrides))


def init_on_host(cfg: ModelConfig):
    """Fresh parameters drawn by the host CPU, then put on the default device, as the trainer does
    on GPUs (`jaxformer.train.state.draws_on_host`: the GPU's compile of the initialiser is 6–8×
    slower, `bench/init_compile.py`)."""
    key_data = np.asarray(jax.random.key_data(jax.random.key(0)))
    return jax.device_put(init_params_on_host(build_model(cfg), key_data), jax.devices()[0])


def packed_batch(cfg: ModelConfig, objective: str, args) -> dict:
    """Random tokens, two documents per row (segment ids 1 and 2, positions restarting)."""
    rng = np.random.default_rng(0)
    lengths = {"inputs": args.seq_len}
    if objective == "seq2seq":
        lengths["targets"] = max(args.seq_len // 4, 2)
    batch = {}
    for key, n in lengths.items():
        half = n // 2
        batch[key] = rng.integers(200, cfg.vocab_size, (args.batch, n), dtype=np.int32)
        batch[f"{key}_segment_ids"] = np.repeat([[1] * half + [2] * (n - half)], args.batch, 0)
        batch[f"{key}_positions"] = np.repeat([list(range(half)) + list(range(n - half))],
                                              args.batch, 0)
    return {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}


def prepare(name: str, impl: str, args) -> dict:
    """Compile the train step of ``name`` with ``impl``: ``{"row", "run"}``."""
    cfg = model_config(name, impl, args)
    tx = optax.adamw(1e-4, weight_decay=0.01)
    step_fn = make_train_step(build_model(cfg), tx,
                              bind_objective(MODELS[name][2], None, SpecialTokens(cfg.vocab_size)),
                              optax.constant_schedule(1e-4))
    params = init_on_host(cfg)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params,
                       opt_state=jax.jit(tx.init)(params), rng=jax.random.key_data(jax.random.key(1)))
    batch = packed_batch(cfg, MODELS[name][2], args)
    compiled = jax.jit(step_fn, donate_argnums=(0,)).lower(state, batch).compile()
    holder = {"state": state}

    def run():
        holder["state"], metrics = compiled(holder["state"], batch)
        return metrics["loss"]

    target = batch["targets"].shape[1] if "targets" in batch else args.seq_len
    flops = model_flops(cfg, params, args.batch, args.seq_len, target)
    row = {"model": name, "impl": impl, "flops": flops["model_flops_per_step"],
           "tokens": flops["tokens_per_step"],
           "params_m": sum(x.size for x in jax.tree.leaves(params)) / 1e6,
           **compiled_memory(compiled)}
    return {"row": row, "run": run, "compiled": compiled}


def compiled_memory(compiled) -> dict:
    """GiB of the compiled step's temporaries and its high-water mark (arguments + outputs +
    temporaries − donated buffers the outputs reuse), from XLA's buffer assignment."""
    mem = compiled.memory_analysis()
    if mem is None:
        return {"temp_gib": None, "hbm_gib": None}
    total = (mem.argument_size_in_bytes + mem.output_size_in_bytes + mem.temp_size_in_bytes
             - mem.alias_size_in_bytes)
    return {"temp_gib": mem.temp_size_in_bytes / 2**30, "hbm_gib": total / 2**30}


def decode_row(batch: int, args, bandwidth: float) -> dict:
    """Cached greedy decoding of GPT-2 small (bfloat16 parameters and compute, the trainer's
    ``generate_padded``): ``--decode_new`` tokens after a ``--decode_prompt``-token prompt, every
    row to the end (no EOS). Beside it the HBM roofline: each step must read every weight once and
    the keys and values written so far (on average prompt + new / 2 positions), so
    ``tokens/s ≤ batch · bandwidth / (weight bytes + cache bytes)`` at the bandwidth measured in
    this run."""
    prompt_len, new = args.decode_prompt, args.decode_new
    cfg = ModelConfig.from_dict(preset(
        "gpt2_small_bf16" if not args.tiny else "gpt_tiny", dtype="bfloat16",
        param_dtype="bfloat16", dropout_rate=0.0, attention_dropout_rate=0.0,
        max_len=prompt_len + new))
    model = build_model(cfg)
    params = init_on_host(cfg)
    prompts = jnp.asarray(np.random.default_rng(1).integers(
        200, cfg.vocab_size, (batch, prompt_len)), jnp.int32)
    lengths = jnp.full((batch,), prompt_len, jnp.int32)
    gen = GenerationConfig(max_new_tokens=new, eos_id=None)
    t = time_calls(lambda: generate_padded(model, params, prompts, lengths, gen).tokens,
                   steps=args.decode_repeats, warmup=1)
    weight_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    kv_heads = cfg.num_kv_heads or cfg.num_heads
    cache_bytes = (2 * cfg.num_layers * batch * (prompt_len + new / 2) * kv_heads
                   * (cfg.head_dim or cfg.d_model // cfg.num_heads) * 2)
    roofline = batch * bandwidth / (weight_bytes + cache_bytes)
    tokens_per_s = batch * new / t["median"]
    return {"model": "gpt2_small" if not args.tiny else "gpt_tiny", "batch": batch,
            "prompt": prompt_len, "new_tokens": new, "tokens_per_s": tokens_per_s,
            "step_ms": t["median"] / new * 1e3, "roofline_tokens_per_s": roofline,
            "of_roofline": tokens_per_s / roofline, "weight_mib": weight_bytes / 2**20,
            "cache_mib": cache_bytes / 2**20}


def profile_of(entry: dict, args, name: str) -> dict:
    """``{"profile": ...}`` of the entry's compiled step (`gpu_profile.profile_step`), or
    ``{"profile_error": ...}``: a failed trace must not cost the benchmark's figures."""
    try:
        os.makedirs(args.profile, exist_ok=True)
        return {"profile": profile_step(entry["run"], entry["compiled"], steps=args.profile_steps,
                                        out=args.profile, name=name)}
    except Exception as e:  # noqa: BLE001 (reported in the row and printed)
        print(f"profile of {name} failed: {type(e).__name__}: {e}", flush=True)
        return {"profile_error": f"{type(e).__name__}: {e}"}


def implementations(name: str, args) -> list[str]:
    if args.impls != "auto":
        return [i for i in args.impls.split(",") if i]
    kernel = model_config(name, "auto", args).attention_kernel  # the backend's, for this model
    return ["xla"] + ([kernel] if kernel != "xla" else [])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {list(MODELS)}")
    p.add_argument("--impls", default="auto", help="comma-separated attention_impl values, or "
                   "'auto': xla + the backend's fused kernel (cudnn on CUDA GPUs, splash on TPUs)")
    p.add_argument("--batch", type=int, default=None, help="rows per step (default 16; --tiny 4)")
    p.add_argument("--seq_len", type=int, default=None,
                   help="tokens per row (default: GPT-2 1024, BERT / T5 inputs 512; --tiny 64)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per implementation")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after the first call")
    p.add_argument("--matmul_n", type=int, default=8192, help="side of the bf16 peak matmul")
    p.add_argument("--scan_layers", action="store_true",
                   help="scan over the layers (one compiled layer: compiles several times faster)")
    p.add_argument("--profile", default="", metavar="DIR",
                   help="after timing, trace --profile_steps steps of each model / implementation "
                   "and print where the device time goes (bench/gpu_profile.py); traces under DIR")
    p.add_argument("--profile_steps", type=int, default=3)
    p.add_argument("--decode_batches", default="1,32",
                   help="batch sizes of the cached-decoding rows (GPT-2 small, bf16); '' for none")
    p.add_argument("--decode_prompt", type=int, default=128, help="prompt tokens per row")
    p.add_argument("--decode_new", type=int, default=256, help="generated tokens per row")
    p.add_argument("--decode_repeats", type=int, default=3, help="timed generate calls")
    p.add_argument("--tiny", action="store_true",
                   help="tiny models (gpt_tiny, bert_tiny, t5_tiny in bf16), batch 4, length 64, "
                   "256² peak matmul: a CPU smoke run (under a minute of CPU, mostly compiling)")
    args = p.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    if set(names) - set(MODELS):
        p.error(f"unknown models {sorted(set(names) - set(MODELS))}; choose from {list(MODELS)}")
    if args.tiny:
        args.matmul_n = min(args.matmul_n, 256)
    peak = measure_matmul_peak(args.matmul_n, jnp.bfloat16)
    bandwidth = measure_copy_bandwidth(2**22 if args.tiny else 2**30)
    decode = []
    for b in (b for b in args.decode_batches.split(",") if b):
        decode.append(decode_row(int(b), args, bandwidth["bytes_per_s"]))
        print(json.dumps({"partial_decode": decode[-1]}), flush=True)
    rows, refused = [], []
    for name in names:
        local = argparse.Namespace(**vars(args))
        local.batch = args.batch or (4 if args.tiny else 16)
        local.seq_len = args.seq_len or (64 if args.tiny else 1024 if name.startswith("gpt") else 512)
        entries = []
        for impl in implementations(name, args):
            try:
                entries.append(prepare(name, impl, local))
            except ValueError as e:  # refused before compiling (config or backend)
                refused.append({"model": name, "impl": impl, "reason": str(e)})
        time_round_robin(entries, steps=args.steps, warmup=args.warmup)
        for e in entries:
            e["row"].update(batch=local.batch, seq_len=local.seq_len)
            rows.append(e["row"])
            if args.profile:
                e["row"].update(profile_of(e, args, f"{name}_{e['row']['impl']}"))
            print(json.dumps({"partial": {k: v for k, v in e["row"].items() if k != "profile"}}),
                  flush=True)
        del entries
    peak_after = measure_matmul_peak(args.matmul_n, jnp.bfloat16)
    peak["peak_flops"] = max(peak["peak_flops"], peak_after["peak_flops"])
    for r in rows:
        r["tokens_per_s"] = r["tokens"] / r["step_s"]
        r["mfu"] = r["flops"] / r["step_s"] / peak["peak_flops"]
    report = {"benchmark": "accelerator", "backend": jax.default_backend(),
              "devices": [str(d) for d in jax.devices()],
              "device_kind": jax.devices()[0].device_kind, "tiny": args.tiny,
              "matmul_peak": peak, "copy_bandwidth": bandwidth, "results": rows,
              "decode": decode, "refused": refused}
    print(json.dumps(report))
    print(f"\n{report['device_kind']} ({report['backend']})  bf16 matmul peak "
          f"{peak['peak_flops'] / 1e12:.2f} TFLOP/s ({args.matmul_n}²)")
    print(format_table(rows, [("model", "model", ""), ("impl", "attention", ""),
                              ("batch", "batch", "d"), ("seq_len", "length", "d"),
                              ("tokens_per_s", "tokens/s", ".0f"), ("step_s", "step s", ".4f"),
                              ("mfu", "MFU", ".1%"), ("temp_gib", "temp GiB", ".2f"),
                              ("hbm_gib", "step GiB", ".2f")]))
    if decode:
        print(f"\ncached greedy decoding; HBM copy bandwidth {bandwidth['bytes_per_s'] / 1e9:.0f} GB/s")
        print(format_table(decode, [("model", "model", ""), ("batch", "batch", "d"),
                                    ("prompt", "prompt", "d"), ("new_tokens", "new", "d"),
                                    ("tokens_per_s", "tokens/s", ".0f"), ("step_ms", "step ms", ".2f"),
                                    ("roofline_tokens_per_s", "roofline tok/s", ".0f"),
                                    ("of_roofline", "of roofline", ".1%")]))
    for r in refused:
        print(f"refused: {r['model']} / {r['impl']}: {r['reason']}")
    for r in rows:
        if "profile" in r:
            print_profile(f"{r['model']} / {r['impl']}", r["profile"], top=12)
    return report


if __name__ == "__main__":
    main()
