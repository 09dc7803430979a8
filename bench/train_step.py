"""Training-step throughput of a GPT (`DecoderOnly`): jitted forward + backward + AdamW.

Default size (the README's): d_model 512, 6 layers, 8 heads, d_ff 2048, L 256, batch 8, vocab 8192,
learned positions, float32, dropout off. Reported per variant: tokens/s, compile seconds, the median
step time (after warm-up, `block_until_ready`) and MFU against the float32 matmul peak measured in
the same run (see `bench/common.py` for the FLOP accounting). With ``--peer`` the same model is
timed in PyTorch (Hugging Face `GPT2LMHeadModel`, eager, torch.optim.AdamW). Steps are timed
round-robin (one step of each variant per round), so that ratios survive a noisy, shared machine.

Variants: ``xla`` (baseline: `jaxformer.models.build_model`'s pure pair), ``scan`` (`lax.scan`
over layers), ``remat`` (full rematerialisation), ``chunked`` (memory-efficient attention),
``nodonate`` (baseline without buffer donation), ``bf16``
(bfloat16 compute, float32 parameters; MFU still against the float32 peak); ``nnx`` and
``nnx_scan``: the NNX class (`jaxformer.models.Transformer`) split by hand in the same pure jitted step
(``nnx.split`` once, ``nnx.merge(graphdef, params)`` inside the traced loss); ``nnx_jit``: the
stateful NNX idiom, `nnx.jit` over the model and an `nnx.Optimizer` updated in place (graph
traversal in Python on every call, flax issues 4045 / 4459). "same program as" names the first
variant whose compiled HLO (modulo value names) is identical: ``nnx`` compiles to ``xla``'s program.

    python bench/train_step.py --steps 5
    python bench/train_step.py --steps 10 --variants xla,scan,remat,chunked --peer
    python bench/train_step.py --steps 10 --variants xla,nnx,nnx_jit
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
from flax import nnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    compile_seconds,
    format_table,
    measure_matmul_peak,
    program_fingerprint,
    time_round_robin,
    train_step_flops,
)

from jaxformer.config import ModelConfig  # noqa: E402
from jaxformer.models import Transformer, build_model  # noqa: E402
from jaxformer.ops import weighted_cross_entropy  # noqa: E402

VARIANTS = {
    "xla": {},
    "scan": {"scan_layers": True},
    "remat": {"remat_policy": "full"},
    "chunked": {"attention_impl": "chunked", "attention_chunk_size": 128},
    "nodonate": {},
    "bf16": {"dtype": "bfloat16"},
    "nnx": {},
    "nnx_scan": {"scan_layers": True},
    "nnx_jit": {},
}


def model_config(args, **overrides) -> ModelConfig:
    kw = dict(
        family="decoder", vocab_size=args.vocab, d_model=args.d_model, num_heads=args.heads,
        d_ff=args.d_ff, num_layers=args.layers, max_len=args.seq_len, position="learned",
        norm="layer", norm_position="pre", norm_eps=1e-5, activation="gelu_tanh",
        tie_embeddings=True, dropout_rate=0.0, attention_dropout_rate=0.0, dtype=args.dtype,
        param_dtype="float32")
    return ModelConfig(**dict(kw, **overrides))


def next_token_loss(logits, tokens):
    total, count = weighted_cross_entropy(logits, tokens[:, 1:])
    return total / count


def make_step(apply, tx: optax.GradientTransformation, donate: bool):
    """The jitted step of a pure ``apply(params, tokens) -> logits`` (NNX via merge)."""

    def step(params, opt_state, tokens):
        loss_fn = lambda p: next_token_loss(apply(p, tokens[:, :-1]), tokens)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1) if donate else ())


def init_variant(name: str, cfg: ModelConfig, tokens):
    """(pure apply, params, the params tree): `build_model`'s functional pair, or (``nnx*``) the
    NNX class split by hand."""
    if name.startswith("nnx"):
        graphdef, state = nnx.split(Transformer(cfg, nnx.Rngs(params=0)))
        params = nnx.to_pure_dict(state)
        return (lambda p, t: nnx.merge(graphdef, p)(t)), params, params
    model = build_model(cfg)
    params = jax.jit(model.init)(jax.random.key(0))
    return model.apply, params, params


def prepare_nnx_jit(cfg: ModelConfig, tx: optax.GradientTransformation, tokens) -> dict:
    """`nnx.jit` over the model and an `nnx.Optimizer` that update in place (no AOT compile: the
    first call, compile included, is ``first_s``)."""
    model = Transformer(cfg, nnx.Rngs(params=0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

    @nnx.jit
    def step(model, optimizer, tokens):
        loss, grads = nnx.value_and_grad(lambda m: next_token_loss(m(tokens[:, :-1]), tokens))(model)
        optimizer.update(model, grads)
        return loss

    return {"run": lambda: step(model, optimizer, tokens), "params": model.param_dict(),
            "compile_s": None, "temp_bytes": None}


def prepare_variant(name: str, args) -> dict:
    """Compile the step of variant ``name``; returns its row (metadata) and a ``run`` callable."""
    cfg = model_config(args, **VARIANTS[name])
    tx = optax.adamw(1e-4, weight_decay=0.01)
    rng = np.random.default_rng(0)
    # L + 1 tokens per row: inputs are the first L, labels the last L (L positions are trained)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (args.batch, args.seq_len + 1)), jnp.int32)
    if name == "nnx_jit":
        out = prepare_nnx_jit(cfg, tx, tokens)
    else:
        apply, params, tree = init_variant(name, cfg, tokens)
        opt_state = jax.jit(tx.init)(params)
        compiled, compile_s = compile_seconds(make_step(apply, tx, donate=name != "nodonate"),
                                              params, opt_state, tokens)
        state = {"params": params, "opt": opt_state}

        def run():
            state["params"], state["opt"], loss = compiled(state["params"], state["opt"], tokens)
            return loss

        mem = compiled.memory_analysis()
        out = {"run": run, "params": tree, "compile_s": compile_s,
               "temp_bytes": getattr(mem, "temp_size_in_bytes", None) if mem is not None else None,
               "program": program_fingerprint(compiled)}
    flops = train_step_flops(cfg, out["params"], batch=args.batch, seq_len=args.seq_len)
    row = {"variant": name, "compile_s": out["compile_s"], "flops": flops["total"],
           "tokens": flops["tokens"], "model_tflops_per_step": flops["total"] / 1e12,
           "attention_flops_fraction": flops["attention"] / flops["total"],
           "temp_bytes": out["temp_bytes"], "program": out.get("program")}
    return {"row": row, "run": out["run"]}


def prepare_torch_peer(args) -> dict:
    """The same GPT-2-style model in PyTorch eager (HF `GPT2LMHeadModel`), AdamW, float32."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    conf = GPT2Config(vocab_size=args.vocab, n_positions=args.seq_len, n_embd=args.d_model,
                      n_layer=args.layers, n_head=args.heads, n_inner=args.d_ff,
                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      # GPT-2's default 50256 lies outside a small --vocab (transformers warns)
                      bos_token_id=args.vocab - 1, eos_token_id=args.vocab - 1)
    model = GPT2LMHeadModel(conf)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    tokens = torch.randint(0, args.vocab, (args.batch, args.seq_len))

    def run():
        out = model(input_ids=tokens, labels=tokens)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.item()

    row = {"variant": "torch-eager (peer)", "tokens": args.batch * args.seq_len,
           "threads": torch.get_num_threads()}
    return {"row": row, "run": run}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10, help="timed steps per variant")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps after the first call")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=256)
    p.add_argument("--d_model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d_ff", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--variants", default="xla", help=f"comma-separated, of {sorted(VARIANTS)}")
    p.add_argument("--peer", action="store_true", help="also time PyTorch eager (HF GPT-2)")
    p.add_argument("--matmul_n", type=int, default=2048)
    args = p.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        p.error(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")

    entries = [prepare_variant(n, args) for n in names]
    programs = {e["row"]["program"]: e["row"]["variant"] for e in reversed(entries)
                if e["row"]["program"]}
    for e in entries:  # e.g. nnx: "xla" when both compile to the same program
        e["row"]["same_program_as"] = programs.get(e["row"]["program"])
    if args.peer:
        entries.append(prepare_torch_peer(args))
    peak = measure_matmul_peak(args.matmul_n, jnp.float32)
    time_round_robin(entries, steps=args.steps, warmup=args.warmup)
    peak_after = measure_matmul_peak(args.matmul_n, jnp.float32)
    peak["peak_flops"] = max(peak["peak_flops"], peak_after["peak_flops"])
    rows = [e["row"] for e in entries]
    for r in rows:
        r["tokens_per_s"] = r["tokens"] / r["step_s"]
        if "flops" in r:
            r["mfu"] = r["flops"] / r["step_s"] / peak["peak_flops"]
        r["vs_first"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    report = {
        "benchmark": "train_step", "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()], "cpu_count": os.cpu_count(),
        "config": {k: getattr(args, k) for k in ("batch", "seq_len", "d_model", "layers", "heads",
                                                 "d_ff", "vocab", "dtype", "steps", "warmup")},
        "matmul_peak": peak, "results": rows,
    }
    print(json.dumps(report))
    print(f"\nbackend {report['backend']}  matmul peak {peak['peak_flops'] / 1e9:.1f} GFLOP/s "
          f"({args.matmul_n}² float32)  model {rows[0].get('model_tflops_per_step', 0):.4g} "
          "TFLOP/step")
    print(format_table(rows, [("variant", "variant", ""), ("tokens_per_s", "tokens/s", ".0f"),
                              ("step_s", "step s", ".3f"), ("compile_s", "compile s", ".1f"),
                              ("mfu", "MFU", ".1%"), ("vs_first", "ratio", ".2f"),
                              ("same_program_as", "same program as", "")]))
    return report


if __name__ == "__main__":
    main()
