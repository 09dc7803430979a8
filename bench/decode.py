"""Greedy decoding throughput with the KV cache vs recomputing the whole prefix every step.

Both paths are jit-compiled loops on the same parameters and produce the same tokens (checked and
reported as ``tokens_match``):

* cached: `jaxformer.decode.generate_padded` — one prefill call over the prompt, then one
  single-token step per new token inside a `lax.while_loop` (per step O(layers · d² + L · d)).
* uncached: each step runs the full causal forward over the prefix written so far and takes the
  argmax at its last position (per step O(L · layers · d² + L² · d)). To be fair to it, the prefix
  buffer is cut to the next multiple of ``--bucket`` columns (one compiled `fori_loop` per bucket
  width, not the full final length every step), and the LM head projects only the last position.

Models: ``gpt_tiny`` (the preset, ``max_len`` raised to fit prompt + new tokens) and ``gpt_d512``
(d_model 512, 6 layers, 8 heads, d_ff 2048, vocab 8192). Float32, dropout off, random weights
(N(0, 0.02²); speed does not depend on the values). Compilation is excluded from both timings (AOT
``lower().compile()`` for the uncached buckets; a warm-up call for the cached path, then the median
of ``--repeats`` calls).

    python bench/decode.py                       # both models, batch 1 and 2, 256 new tokens
    python bench/decode.py --models gpt_d512 --batch 4 --new_tokens 128
    .venv-peers/bin/python bench/decode.py --peers     # vs Hugging Face Flax and PyTorch generate
    .venv-peers/bin/python bench/decode.py --peers --models t5_d512 --batch 8
    python bench/decode.py --scaling --models gpt_d512    # throughput at batch 1, 8, 32
    python bench/decode.py --refill --models gpt_d512     # outputs of mixed lengths: refill or not

With ``--peers`` (default then: ``gpt_d512``, batch 1 and 8, greedy and beam-4) the cached path is
timed against Hugging Face ``generate`` of the same weights (exported with
`jaxformer.convert.save_hf`): ``FlaxGPT2LMHeadModel`` (jitted; transformers 4.57.6, `make peers`)
and PyTorch ``GPT2LMHeadModel`` (eager, inference mode); ``--models t5_d512`` (T5 v1.0 small's
shape at vocab 8192, 6 + 6 layers; the prompt is the source) against ``FlaxT5ForConditionalGeneration``
and ``T5ForConditionalGeneration``. No EOS: every row decodes all
``--new_tokens``. Calls alternate round-robin; ``same tokens`` is the fraction of generated tokens
equal to jaxformer's (greedy must agree up to float near-ties; beams may differ where scores tie).

At batch 1 on a CPU the cached step is bound by reading the weights (a matrix-vector product per
weight per token) while the uncached forward runs efficient matrix-matrix products over the prefix,
so the ratio is smallest there; it grows with the batch (the cached step stays memory-bound).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import block, format_table, machine, round_robin_times, time_calls  # noqa: E402
from peer_models import hf_generators  # noqa: E402

from jaxformer.config import ModelConfig  # noqa: E402
from jaxformer.decode import GenerationConfig, generate_batches, generate_padded  # noqa: E402
from jaxformer.models import build_model  # noqa: E402
from jaxformer.models.presets import preset  # noqa: E402

NO_DROPOUT = dict(dropout_rate=0.0, attention_dropout_rate=0.0, ffn_dropout_rate=0.0)


def model_config(name: str, max_len: int) -> ModelConfig:
    if name == "gpt_tiny":
        return ModelConfig.from_dict(preset("gpt_tiny", max_len=max_len, **NO_DROPOUT))
    sizes = dict(vocab_size=8192, d_model=512, num_heads=8, d_ff=2048, num_layers=6,
                 max_len=max_len, **NO_DROPOUT)
    if name == "gpt_d512":
        return ModelConfig.from_dict(preset("gpt2_small", **sizes))
    if name == "t5_d512":  # T5 (v1.0 small's shape): 6 encoder and 6 decoder layers
        return ModelConfig.from_dict(preset("t5_small", **sizes))
    raise ValueError(f"unknown model {name!r}; choose gpt_tiny, gpt_d512 or t5_d512 (--peers)")


def random_params(model, seed: int = 0):
    """N(0, 0.02²) weights (norm scales 1, biases 0) on the abstract shapes: no init compile."""
    jnp.ones((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0)))
    rng = np.random.default_rng(seed)

    def draw(path, s):
        name = str(path[-1].key)
        if name in ("scale", "bias"):
            return jnp.full(s.shape, 1.0 if name == "scale" else 0.0, s.dtype)
        return jnp.asarray(rng.normal(0.0, 0.02, s.shape), s.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def uncached_greedy(cfg: ModelConfig, params, prompt: np.ndarray, new_tokens: int, bucket: int):
    """Greedy decoding without a cache: returns (tokens `[B, new_tokens]`, seconds, compile s)."""
    if not cfg.tie_embeddings or cfg.lm_head_bias or cfg.rescale_tied_logits:
        raise ValueError("the uncached baseline's last-position head assumes a plain tied LM head")
    backbone = build_model(dataclasses.replace(cfg, head="none"))  # same params, hidden states
    b, p = prompt.shape
    total = p + new_tokens

    def run(params, buf, t0, t1, *, width):
        def body(t, buf):
            h = backbone.apply(params, buf[:, :width])  # [B, W, D], causal
            last = lax.dynamic_index_in_dim(h, p + t - 1, axis=1, keepdims=False)
            logits = last @ params["token_embed"]["embedding"].T
            tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            return lax.dynamic_update_index_in_dim(buf, tok, p + t, axis=1)

        return lax.fori_loop(t0, t1, body, buf)

    buf = jnp.zeros((b, total), jnp.int32).at[:, :p].set(jnp.asarray(prompt))
    plan, t = [], 0
    while t < new_tokens:  # step t reads a prefix of p + t tokens
        width = min(total, -(-(p + t) // bucket) * bucket)
        t_end = min(new_tokens, width - p + 1)
        plan.append((width, t, t_end))
        t = t_end
    start = time.perf_counter()
    compiled = {w: jax.jit(run, static_argnames="width").lower(
        params, buf, jnp.int32(0), jnp.int32(1), width=w).compile() for w, _, _ in plan}
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    for width, t0, t1 in plan:
        buf = compiled[width](params, buf, jnp.int32(t0), jnp.int32(t1))
    buf = jax.block_until_ready(buf)
    return np.asarray(buf[:, p:]), time.perf_counter() - start, compile_s


def bench_model(name: str, batch: int, args) -> dict:
    cfg = model_config(name, max_len=args.prompt_len + args.new_tokens)
    model = build_model(cfg)
    params = random_params(model)
    rng = np.random.default_rng(1)
    prompt = rng.integers(7, cfg.vocab_size, (batch, args.prompt_len)).astype(np.int32)
    lengths = jnp.full((batch,), args.prompt_len, jnp.int32)
    gen = GenerationConfig(max_new_tokens=args.new_tokens, eos_id=None)
    call = lambda: generate_padded(model, params, jnp.asarray(prompt), lengths, gen).tokens
    cached = time_calls(call, steps=args.repeats, warmup=0)
    cached_tokens = np.asarray(call())
    uncached_tokens, uncached_s, uncached_compile = uncached_greedy(
        cfg, params, prompt, args.new_tokens, args.bucket)
    n = batch * args.new_tokens
    return {
        "model": name, "d_model": cfg.d_model, "layers": cfg.num_layers, "vocab": cfg.vocab_size,
        "batch": batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "cached_s": cached["median"], "cached_first_call_s": cached["first"],
        "uncached_s": uncached_s, "uncached_compile_s": uncached_compile,
        "cached_tokens_per_s": n / cached["median"], "uncached_tokens_per_s": n / uncached_s,
        "speedup": uncached_s / cached["median"],
        "tokens_match": float(np.mean(cached_tokens == uncached_tokens)),
    }


def bench_peers(name: str, batch: int, strategy: str, args) -> list[dict]:
    """Rows of jaxformer's cached decoding and the Hugging Face peers' ``generate``, timed
    round-robin (``--repeats`` calls each after one untimed call)."""
    cfg = model_config(name, max_len=args.prompt_len + args.new_tokens)
    model = build_model(cfg)
    params = random_params(model)
    prompt = np.random.default_rng(1).integers(7, cfg.vocab_size, (batch, args.prompt_len)
                                               ).astype(np.int32)
    beams = 4 if strategy == "beam" else 1
    gen = GenerationConfig(strategy=strategy, beam_size=beams, max_new_tokens=args.new_tokens,
                           eos_id=None)
    lengths = jnp.full((batch,), args.prompt_len, jnp.int32)
    systems = {"jaxformer": lambda: generate_padded(model, params, jnp.asarray(prompt), lengths,
                                                    gen).tokens}
    with tempfile.TemporaryDirectory() as tmp:
        peers = hf_generators(cfg, params, tmp, new_tokens=args.new_tokens, beams=beams)
    systems.update({k: (lambda f=f: f(prompt)) for k, f in peers.items()
                    if not (args.skip_torch and k == "torch")})
    outputs = {k: np.asarray(block(f())) for k, f in systems.items()}  # compiles
    times = round_robin_times(systems, args.repeats)
    rows = []
    for k in systems:
        step_s = statistics.median(times[k])
        rows.append({"model": name, "batch": batch, "strategy": strategy, "system": k,
                     "seconds": step_s, "tokens_per_s": batch * args.new_tokens / step_s,
                     "same_tokens": float(np.mean(outputs[k] == outputs["jaxformer"]))})
    for r in rows:
        for peer in ("hf-flax", "torch"):
            other = [o for o in rows if o["system"] == peer]
            if other:
                r[f"vs_{peer}"] = r["tokens_per_s"] / other[0]["tokens_per_s"]
    return rows


def main_peers(args) -> None:
    rows = []
    for m in args.models.split(","):
        for b in args.batch.split(","):
            for s in args.strategies.split(","):
                done = bench_peers(m, int(b), s, args)
                print(json.dumps({"partial": done}), file=sys.stderr, flush=True)
                rows += done
    print(json.dumps({"benchmark": "decode_peers", "machine": args.machine,
                      "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                      "results": rows}))
    print(format_table(rows, [
        ("model", "model", "s"), ("batch", "B", "d"), ("strategy", "strategy", "s"),
        ("system", "system", "s"), ("tokens_per_s", "tok/s", ".1f"),
        ("vs_hf-flax", "vs hf-flax", ".2f"), ("vs_torch", "vs torch", ".2f"),
        ("same_tokens", "same tokens", ".3f")]))


def main_scaling(args) -> None:
    """jaxformer's greedy throughput at each ``--batch``, timed round-robin in one run, and its
    ratio to the first batch size's (how throughput grows with the batch)."""
    cfg = model_config(args.models.split(",")[0], max_len=args.prompt_len + args.new_tokens)
    model = build_model(cfg)
    params = random_params(model)
    gen = GenerationConfig(max_new_tokens=args.new_tokens, eos_id=None)
    calls = {}
    for b in map(int, args.batch.split(",")):
        prompt = jnp.asarray(np.random.default_rng(1).integers(7, cfg.vocab_size,
                                                               (b, args.prompt_len)), jnp.int32)
        lengths = jnp.full((b,), args.prompt_len, jnp.int32)
        calls[b] = lambda p=prompt, n=lengths: generate_padded(model, params, p, n, gen).tokens
        block(calls[b]())  # compiles
    times = round_robin_times(calls, args.repeats)
    rows = [{"model": cfg.family, "batch": b,
             "tokens_per_s": b * args.new_tokens / statistics.median(t)} for b, t in times.items()]
    for r in rows:
        r["vs_first_batch"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    print(json.dumps({"benchmark": "decode_scaling", "machine": args.machine,
                      "new_tokens": args.new_tokens,
                      "results": rows}))
    print(format_table(rows, [("batch", "B", "d"), ("tokens_per_s", "tok/s", ".1f"),
                              ("vs_first_batch", "vs first batch", ".2f")]))


def mixed_length_set(model, params, args) -> tuple[list[list[int]], int, list[int]]:
    """(prompts, eos_id, output lengths): ``--prompts`` random prompts (4–16 tokens) whose greedy
    outputs end at lengths spread evenly over 1 … ``--new_tokens``. Random weights emit no
    natural EOS, so one is chosen: ``8 · --prompts`` candidates are decoded without EOS, the EOS
    is the token that first occurs at the most distinct steps among them, and for each of
    ``--prompts`` evenly spaced target lengths the unused candidate ending closest to it is taken
    (outputs without the EOS end at ``--new_tokens``), in random order."""
    rng = np.random.default_rng(1)
    vocab, n = model.cfg.vocab_size, args.new_tokens
    cands = [rng.integers(7, vocab, rng.integers(4, 17)).tolist() for _ in range(8 * args.prompts)]
    free = np.array(generate_batches(model, params, cands, GenerationConfig(
        max_new_tokens=n, eos_id=None), batch_size=32))

    def lengths(tok):
        hit = free == tok
        return np.where(hit.any(1), hit.argmax(1) + 1, n)

    eos = max(np.unique(free).tolist(), key=lambda t: len(np.unique(lengths(t))))
    ends, pick = lengths(eos), []
    for target in (np.arange(args.prompts) + 0.5) * n / args.prompts:
        gap = np.abs(ends - target).astype(float)
        gap[pick] = np.inf
        pick.append(int(np.argmin(gap)))
    pick = rng.permutation(pick)  # arrival order unrelated to the output length
    return [cands[i] for i in pick], int(eos), ends[pick].tolist()


def main_refill(args) -> None:
    """tokens/s of `generate_batches` on a set whose outputs end at very different lengths: fixed
    batches (each runs to its longest row) vs refilled rows (`jaxformer.decode.refill`), timed
    round-robin; both must give the same outputs."""
    cfg = model_config(args.models.split(",")[0], max_len=args.prompt_len + args.new_tokens)
    model = build_model(cfg)
    params = random_params(model)
    prompts, eos, lengths = mixed_length_set(model, params, args)
    gen = GenerationConfig(max_new_tokens=args.new_tokens, eos_id=eos)
    batch = int(args.batch.split(",")[0])
    calls = {"batches": lambda: generate_batches(model, params, prompts, gen, batch_size=batch)}
    for seg in map(int, args.segment.split(",")):
        calls[f"refill (segment {seg})"] = lambda seg=seg: generate_batches(
            model, params, prompts, gen, batch_size=batch, refill=True, segment=seg)
    outputs = {k: f() for k, f in calls.items()}  # compiles
    times = round_robin_times(calls, args.repeats)
    tokens = sum(lengths)
    rows = [{"model": cfg.family, "batch": batch, "system": k, "prompts": len(prompts),
             "tokens": tokens, "seconds": statistics.median(t),
             "tokens_per_s": tokens / statistics.median(t),
             "same_outputs": outputs[k] == outputs["batches"]} for k, t in times.items()]
    for r in rows:
        r["vs_batches"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
    print(json.dumps({"benchmark": "decode_refill", "machine": args.machine,
                      "new_tokens": args.new_tokens, "eos_id": eos, "output_lengths": lengths,
                      "results": rows}))
    print(f"output lengths (EOS included): mean {np.mean(lengths):.0f}, min {min(lengths)}, "
          f"max {max(lengths)}")
    print(format_table(rows, [("system", "system", "s"), ("batch", "B", "d"),
                              ("tokens_per_s", "tok/s", ".1f"), ("vs_batches", "vs batches", ".2f"),
                              ("same_outputs", "same outputs", "")]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peers", action="store_true", help="against Hugging Face generate (see above)")
    ap.add_argument("--scaling", action="store_true",
                    help="jaxformer's greedy tokens/s per --batch, round-robin (default 1,8,32)")
    ap.add_argument("--refill", action="store_true",
                    help="mixed output lengths: generate_batches with and without refill")
    ap.add_argument("--prompts", type=int, default=32, help="with --refill")
    ap.add_argument("--segment", default="16,32",
                    help="with --refill: steps between refills (comma-separated: one row each)")
    ap.add_argument("--models", default=None,
                    help="default gpt_tiny,gpt_d512 (--peers: gpt_d512; t5_d512 with --peers only)")
    ap.add_argument("--batch", default=None, help="comma-separated; default 1,2 (--peers: 1,8)")
    ap.add_argument("--strategies", default="greedy,beam", help="with --peers")
    ap.add_argument("--skip_torch", action="store_true",
                    help="with --peers: HF Flax only (PyTorch's eager generate is slow on a loaded CPU)")
    ap.add_argument("--prompt_len", type=int, default=16)
    ap.add_argument("--new_tokens", type=int, default=256)
    ap.add_argument("--bucket", type=int, default=32, help="uncached prefix buffer granularity")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls of the cached path")
    args = ap.parse_args(argv)
    args.models = args.models or ("gpt_d512" if args.peers else "gpt_tiny,gpt_d512")
    args.batch = args.batch or ("1,8" if args.peers else "1,8,32" if args.scaling
                                else "8" if args.refill else "1,2")
    args.machine = machine()  # recorded in every JSON below: ratios move with the machine
    print(json.dumps({"machine": args.machine}), file=sys.stderr, flush=True)
    if args.refill:
        return main_refill(args)
    if args.scaling:
        return main_scaling(args)
    if args.peers:
        return main_peers(args)
    rows = [bench_model(m, int(b), args) for m in args.models.split(",")
            for b in args.batch.split(",")]
    print(json.dumps({"benchmark": "decode", "machine": args.machine,
                      "devices": [str(d) for d in jax.devices()][:1], "results": rows}, indent=2))
    print(format_table(rows, [
        ("model", "model", "s"), ("batch", "B", "d"), ("new_tokens", "new", "d"),
        ("cached_tokens_per_s", "cached tok/s", ".1f"),
        ("uncached_tokens_per_s", "uncached tok/s", ".1f"), ("speedup", "speed-up", ".1f"),
        ("tokens_match", "same tokens", ".3f")]))


if __name__ == "__main__":
    main()
