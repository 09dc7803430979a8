"""The same model in three systems, for the peer benchmarks: jaxformer, Hugging Face Flax and
Hugging Face PyTorch (eager), one GPT, BERT and T5 each.

The jaxformer config is a preset (`gpt2_small`, `bert_base`, `t5_small`) resized to the bench's
sizes with dropout off; the Hugging Face config is its export (`jaxformer.convert`'s
``config_to_hf``), so the two have the same architecture and parameter count (reported, checked by
the bench). Hugging Face Flax models exist up to transformers 4.57.6 (`make peers` builds
``.venv-peers`` with it); when they cannot be imported, those peers are reported as missing.

Batches (``tokens`` etc. are int32 NumPy arrays, the same for every system):

* ``gpt`` (causal LM): ``tokens`` `[B, L + 1]`; inputs the first L, labels the last L.
* ``bert`` (MLM): ``tokens`` `[B, L]` inputs, ``labels`` `[B, L]`, ``weights`` `[B, L]` (1 on the
  15% predicted positions; the loss is over those, the logits over all L, as HF's MLM head does).
* ``t5`` (span corruption shapes): ``inputs`` `[B, L]`, ``targets`` `[B, L_t]`; the decoder reads
  the targets shifted right by one (start id 0).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert.hf import export_converter, save_hf
from jaxformer.models.presets import preset
from jaxformer.ops import weighted_cross_entropy

PRESETS = {"gpt": "gpt2_small", "bert": "bert_base", "t5": "t5_small"}
NO_DROPOUT = dict(dropout_rate=0.0, attention_dropout_rate=0.0, ffn_dropout_rate=0.0)
HF_CLASSES = {"gpt": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "t5": "T5ForConditionalGeneration"}


def add_model_args(parser) -> None:
    """The bench model's sizes (the defaults: the issue's GPT) and ``--no_torch``, on an
    ``argparse`` parser; `model_config` and `make_batch` read them."""
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--target_len", type=int, default=64, help="T5 decoder length")
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--d_ff", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--no_torch", action="store_true", help="skip the PyTorch peer")


def model_config(family: str, args, **overrides) -> ModelConfig:
    """The preset of ``family`` at the bench's sizes, float32, dropout off (BERT without pooler:
    its MLM head does not read it, nor does HF's ``BertForMaskedLM`` have one)."""
    extra = {"pooler": False} if family == "bert" else {}
    kw = dict(vocab_size=args.vocab, d_model=args.d_model, num_heads=args.heads, d_ff=args.d_ff,
              num_layers=args.layers, max_len=max(args.seq_len, 64), dtype="float32",
              param_dtype="float32", **NO_DROPOUT, **extra)
    return ModelConfig.from_dict(preset(PRESETS[family], **dict(kw, **overrides)))


def make_batch(family: str, cfg: ModelConfig, args, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = lambda *shape: rng.integers(2, cfg.vocab_size, shape).astype(np.int32)
    b, n = args.batch, args.seq_len
    if family == "gpt":
        return {"tokens": ids(b, n + 1)}
    if family == "bert":
        labels = ids(b, n)
        weights = (rng.random((b, n)) < 0.15).astype(np.float32)
        return {"tokens": np.where(weights > 0, 1, labels).astype(np.int32), "labels": labels,
                "weights": weights}
    return {"inputs": ids(b, n), "targets": ids(b, args.target_len)}


@dataclasses.dataclass(frozen=True)
class BenchModel:
    """One family's bench set-up: the jaxformer config and model, the fixed batch (NumPy and
    device arrays), and ``init(seed)`` -> the jaxformer parameters (jitted)."""

    cfg: ModelConfig
    model: Any
    np_batch: dict[str, np.ndarray]
    batch: dict[str, Any]
    init: Any


def bench_model(family: str, args) -> BenchModel:
    """The `BenchModel` of ``family`` at the sizes of ``args`` (`add_model_args`)."""
    from jaxformer.models import build_model

    cfg = model_config(family, args)
    np_batch = make_batch(family, cfg, args)
    batch = {k: jnp.asarray(v) for k, v in np_batch.items()}
    model = build_model(cfg)
    init = jax.jit(model.init)
    return BenchModel(cfg, model, np_batch, batch, lambda seed: init(jax.random.key(seed)))


def shift_right(targets):
    """Decoder inputs: ``targets`` `[B, L_t]` shifted right by one, start id 0 first."""
    return jnp.concatenate([jnp.zeros_like(targets[:, :1]), targets[:, :-1]], axis=1)


def mean_loss(family: str, logits, batch) -> Any:
    """The per-token mean loss every JAX system uses (`jaxformer.ops.weighted_cross_entropy`)."""
    if family == "gpt":
        total, count = weighted_cross_entropy(logits, batch["tokens"][:, 1:])
    elif family == "bert":
        total, count = weighted_cross_entropy(logits, batch["labels"], batch["weights"])
    else:
        total, count = weighted_cross_entropy(logits, batch["targets"])
    return total / count


def jaxformer_apply(family: str, model):
    """``(params, batch) -> logits`` of a jaxformer model (`jaxformer.models.build_model`)."""
    if family == "gpt":
        return lambda p, b: model.apply(p, b["tokens"][:, :-1])
    if family == "bert":
        return lambda p, b: model.apply(p, b["tokens"])
    return lambda p, b: model.apply(p, b["inputs"], shift_right(b["targets"]))


def hf_config(family: str, cfg: ModelConfig, transformers) -> Any:
    """The Hugging Face config of ``cfg`` (its export), for ``transformers`` (either version)."""
    hf, _ = export_converter(cfg).config_to_hf(cfg)
    hf = {k: v for k, v in hf.items() if k not in ("architectures", "dtype")}
    if family == "gpt":  # GPT-2's default 50256 lies outside a small vocab (transformers warns)
        hf.update(bos_token_id=cfg.vocab_size - 1, eos_token_id=cfg.vocab_size - 1)
    return transformers.AutoConfig.for_model(hf.pop("model_type"), **hf)


def hf_flax_apply(family: str, cfg: ModelConfig, seed: int = 0):
    """(``(params, batch) -> logits``, params) of the Hugging Face Flax model initialised from
    ``seed``, or None when transformers has no Flax models (transformers >= 5)."""
    import transformers

    cls = getattr(transformers, "Flax" + HF_CLASSES[family], None)
    if cls is None:
        return None
    model = cls(hf_config(family, cfg, transformers), seed=seed, dtype=jnp.float32)
    if family == "gpt":
        fn = lambda p, b: model(b["tokens"][:, :-1], params=p, train=False).logits
    elif family == "bert":
        fn = lambda p, b: model(b["tokens"], params=p, train=False).logits
    else:
        fn = lambda p, b: model(b["inputs"], decoder_input_ids=shift_right(b["targets"]),
                                params=p, train=False).logits
    return fn, model.params


def torch_step(family: str, cfg: ModelConfig, batch: dict[str, np.ndarray], lr: float, wd: float,
               seed: int = 0):
    """(one AdamW step of the Hugging Face PyTorch model, initialised from ``seed``, in eager mode
    -> loss, parameter count)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = getattr(transformers, HF_CLASSES[family])(hf_config(family, cfg, transformers))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    t = {k: torch.from_numpy(np.asarray(v, np.int64 if v.dtype.kind == "i" else v.dtype))
         for k, v in batch.items()}
    if family == "gpt":  # HF shifts labels inside: L inputs, L - 1 trained positions
        kwargs = {"input_ids": t["tokens"][:, :-1], "labels": t["tokens"][:, :-1]}
    elif family == "bert":
        labels = torch.where(t["weights"] > 0, t["labels"], -100)
        kwargs = {"input_ids": t["tokens"], "labels": labels}
    else:  # T5 shifts labels right into decoder inputs
        kwargs = {"input_ids": t["inputs"], "labels": t["targets"]}

    def run():
        loss = model(**kwargs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    return run, sum(p.numel() for p in model.parameters())


def hf_generators(cfg: ModelConfig, params, directory: str, *, new_tokens: int, beams: int):
    """``{"hf-flax": fn, "torch": fn}`` with ``fn(inputs [B, P] int32 NumPy) -> [B, new_tokens]``:
    Hugging Face ``generate`` (greedy when ``beams == 1``, else beam search; no EOS, so every row
    runs ``new_tokens`` steps) of the GPT or T5 ``cfg`` with jaxformer's ``params``, exported to
    ``directory`` (`jaxformer.convert.save_hf`) so that all three systems hold the same weights.
    The inputs are GPT prompts (continued) or T5 sources (the decoder starts from id 0). The Flax
    ``generate`` is jitted (one compile per input shape, outside the timing)."""
    import torch
    import transformers

    family = "gpt" if cfg.family == "decoder" else "t5"
    save_hf(cfg, params, directory)
    opts = dict(max_new_tokens=new_tokens, num_beams=beams, do_sample=False, pad_token_id=0,
                length_penalty=0.0)
    if family == "t5":
        opts["decoder_start_token_id"] = 0

    def generated(seq, ids):  # GPT returns the prompt first, T5 the decoder start token
        return seq[:, ids.shape[1]:] if family == "gpt" else seq[:, 1:]

    out = {}
    flax_cls = getattr(transformers, "Flax" + HF_CLASSES[family], None)
    if flax_cls is not None:
        flax_model = flax_cls.from_pretrained(directory, from_pt=True, dtype=jnp.float32)
        # Flax generate needs an EOS id: one past the vocabulary, which argmax never picks
        flax_model.generation_config.eos_token_id = cfg.vocab_size
        flax_gen = jax.jit(lambda p, ids: flax_model.generate(ids, params=p, **opts).sequences)
        out["hf-flax"] = lambda ids: generated(flax_gen(flax_model.params, jnp.asarray(ids)), ids)
    torch_model = getattr(transformers, HF_CLASSES[family]).from_pretrained(directory).eval()
    torch_model.generation_config.eos_token_id = None

    def torch_gen(ids):
        with torch.inference_mode():
            seq = torch_model.generate(torch.from_numpy(ids.astype(np.int64)), **opts,
                                       attention_mask=torch.ones(ids.shape, dtype=torch.long))
        return generated(seq, ids).numpy()

    out["torch"] = torch_gen
    return out


def transformers_version() -> str | None:
    """The installed transformers version (None when it is not installed)."""
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def with_layers(cfg: ModelConfig, layers: int, **overrides) -> ModelConfig:
    """``cfg`` with ``layers`` layers (each stack of an encoder-decoder) and ``overrides``."""
    return dataclasses.replace(cfg, num_layers=layers, **overrides)
