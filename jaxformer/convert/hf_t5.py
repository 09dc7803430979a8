"""T5 v1.0 and v1.1 (Raffel et al. 2020) ↔ jaxformer ``family="encoder_decoder"``.

HF names (``T5ForConditionalGeneration``): ``shared`` table; per stack ``{encoder,decoder}.block.{i}
.layer.0.SelfAttention.{q,k,v,o}`` (+ ``relative_attention_bias`` `[buckets, H]` in block 0 only,
shared by the stack's layers), ``layer.0.layer_norm``; decoder ``layer.1.EncDecAttention`` +
``layer_norm``; the FFN in the last layer entry, ``DenseReluDense.{wi,wo}`` (v1.0, ReLU) or
``{wi_0,wi_1,wo}`` (v1.1 gated-GELU: act(x·wi_0) ⊙ x·wi_1 = our ``wi``/``wi_gate``); final
``final_layer_norm``; ``lm_head`` tied to ``shared`` (v1.0, hidden states × d_model^-0.5 first) or
untied (v1.1). RMS norms without bias, no biases anywhere, unscaled attention logits.

transformers 5 always ties ``lm_head`` unless the checkpoint stores a different one, and records
the rescale as ``scale_decoder_outputs``; older configs only have ``tie_word_embeddings``. Both are
read. mT5 (``model_type`` "mt5", Xue et al. 2021) and Flan-T5 are v1.1 graphs; transformers 5
saves mT5 configs with ``tie_word_embeddings`` forced to true and never rescales them, so an "mt5"
config rescales only when ``scale_decoder_outputs`` says so. Exports are ``model_type`` "t5", or
"mt5" when the source was an mT5 and the logits are not rescaled (`keep_source_type`).

jaxformer's T5 reads one token table for the encoder and the decoder (``shared``). A checkpoint
whose ``encoder.embed_tokens`` / ``decoder.embed_tokens`` are copies of ``shared`` (transformers
saves them so) imports; one whose tables differ from ``shared`` is refused, naming them, since
dropping them would change the logits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.convert.mapping import (
    TO_HF_ACTIVATIONS,
    Rule,
    copy,
    from_hf_activation,
    is_tied,
    leftover_rule,
    linear,
    require,
)

MODEL_TYPE = "t5"
STACK_TABLES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
BUFFERS = re.compile(r"^(encoder|decoder)\.embed_tokens\.weight$"
                     r"|^decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.")


def _activation(proj: str) -> tuple[str, bool]:
    """HF ``feed_forward_proj`` ("relu", "gated-gelu", ...) → (activation, gated)."""
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise ValueError(f"T5 feed_forward_proj={proj!r} is invalid; use 'ACT' or 'gated-ACT'")
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]  # HF's special case
    return from_hf_activation(act, "feed_forward_proj"), len(parts) == 2


def _feed_forward_proj(cfg: ModelConfig) -> str:
    if not cfg.gated_ffn:
        return TO_HF_ACTIVATIONS[cfg.activation]
    # "gated-gelu" means the tanh approximation in HF; exact erf GELU is "gelu_python".
    return {"gelu_tanh": "gated-gelu", "gelu": "gated-gelu_python"}.get(
        cfg.activation, f"gated-{TO_HF_ACTIVATIONS[cfg.activation]}")


def config_from_hf(hf: Mapping, tensors: Mapping[str, np.ndarray], *, head: str | None,
                   num_classes: int | None) -> tuple[dict, str]:
    """``config.json`` (+ tensors: is ``lm_head`` tied?) → (ModelConfig kwargs, name prefix "")."""
    if head not in (None, "lm"):
        raise ValueError(f"head={head!r} is not available for T5; only 'lm'")
    if "decoder.final_layer_norm.weight" not in tensors:
        raise ValueError(f"only T5ForConditionalGeneration checkpoints are supported (encoder and "
                         f"decoder); architectures={hf.get('architectures')}")
    activation, gated = _activation(hf.get("feed_forward_proj", "relu"))
    own = [n for n in STACK_TABLES if n in tensors and not is_tied(tensors, n, "shared.weight")]
    if own:
        raise ValueError(f"this {hf.get('model_type', 't5')} checkpoint's {' and '.join(own)} "
                         "differ from shared.weight; jaxformer's T5 reads one token table "
                         "(shared.weight) for both stacks, so importing would change the logits: "
                         "save the checkpoint with the stacks' embed_tokens tied to shared")
    if "scale_decoder_outputs" in hf:
        rescale = bool(hf["scale_decoder_outputs"])
    elif hf.get("model_type") == "mt5":  # never rescaled: the published mT5 are untied, and
        rescale = False                  # transformers 5 forces its tie_word_embeddings to True
    else:
        rescale = hf.get("tie_word_embeddings", True) is not False
    tied = is_tied(tensors, "lm_head.weight", "shared.weight")
    if rescale and not tied:
        raise ValueError("this T5 checkpoint scales decoder outputs by d_model^-0.5 but has an "
                         "untied lm_head; jaxformer only rescales tied logits")
    rate = hf.get("dropout_rate", 0.1)
    layers = hf.get("num_layers", 6)
    cfg = dict(
        family="encoder_decoder", vocab_size=hf["vocab_size"], d_model=hf["d_model"],
        num_heads=hf["num_heads"], head_dim=hf["d_kv"], d_ff=hf["d_ff"], num_layers=layers,
        num_encoder_layers=layers, num_decoder_layers=hf.get("num_decoder_layers") or layers,
        max_len=hf.get("n_positions", 512), position="relative",
        relative_num_buckets=hf.get("relative_attention_num_buckets", 32),
        relative_max_distance=hf.get("relative_attention_max_distance", 128), norm="rms",
        norm_position="pre", norm_eps=hf.get("layer_norm_epsilon", 1e-6), activation=activation,
        gated_ffn=gated, use_bias=False, attention_scale=1.0, tie_embeddings=tied,
        rescale_tied_logits=rescale, dropout_rate=rate, attention_dropout_rate=rate,
        ffn_dropout_rate=rate, head="lm", init_scheme="t5", init_std=hf.get("initializer_factor", 1.0))
    return cfg, ""


def _attention(param: str, tensor: str, cfg: ModelConfig) -> list[Rule]:
    d, h, k, dh = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    return [linear(f"{param}/query/kernel", f"{tensor}.q.weight", (d,), (h, dh)),
            linear(f"{param}/key/kernel", f"{tensor}.k.weight", (d,), (k, dh)),
            linear(f"{param}/value/kernel", f"{tensor}.v.weight", (d,), (k, dh)),
            linear(f"{param}/out/kernel", f"{tensor}.o.weight", (h, dh), (d,))]


def _tied_copy(param: str, tensors: tuple[str, str], shape) -> Rule:
    """One table written under two names (export of a tied, unscaled LM head)."""
    s = tuple(shape)
    return Rule((param,), tensors, (s,), (s, s), lambda a, b: (a,), lambda x: (x, x))


def rules(cfg: ModelConfig, prefix: str = "", *, export: bool = False) -> list[Rule]:
    """Rules for every parameter of ``cfg`` (unrolled layout). On export, a tied LM head without
    the rescale also writes ``lm_head.weight`` so that every transformers version reads it right."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    if export and cfg.tie_embeddings and not cfg.rescale_tied_logits:
        out = [_tied_copy("token_embed/embedding", ("shared.weight", "lm_head.weight"), (v, d))]
    else:
        out = [copy("token_embed/embedding", "shared.weight", (v, d))]
    stacks = (("encoder", cfg.num_encoder_layers, False), ("decoder", cfg.num_decoder_layers, True))
    for stack, n, cross in stacks:
        out.append(copy(f"{stack}_relative_bias/embedding",
                        f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                        (cfg.relative_num_buckets, cfg.num_heads)))
        for i in range(n):
            b, t = f"{stack}/layer_{i}/", f"{stack}.block.{i}.layer."
            out += _attention(f"{b}self_attn", f"{t}0.SelfAttention", cfg)
            out.append(copy(f"{b}self_attn_norm/scale", f"{t}0.layer_norm.weight", (d,)))
            if cross:
                out += _attention(f"{b}cross_attn", f"{t}1.EncDecAttention", cfg)
                out.append(copy(f"{b}cross_attn_norm/scale", f"{t}1.layer_norm.weight", (d,)))
            j = 2 if cross else 1
            ff = f"{t}{j}.DenseReluDense."
            if cfg.gated_ffn:
                out += [linear(f"{b}ffn/wi/kernel", f"{ff}wi_0.weight", (d,), (f,)),
                        linear(f"{b}ffn/wi_gate/kernel", f"{ff}wi_1.weight", (d,), (f,))]
            else:
                out.append(linear(f"{b}ffn/wi/kernel", f"{ff}wi.weight", (d,), (f,)))
            out += [linear(f"{b}ffn/wo/kernel", f"{ff}wo.weight", (f,), (d,)),
                    copy(f"{b}ffn_norm/scale", f"{t}{j}.layer_norm.weight", (d,))]
        out.append(copy(f"{stack}_norm/scale", f"{stack}.final_layer_norm.weight", (d,)))
    if not cfg.tie_embeddings:
        out.append(linear("lm_head/kernel", "lm_head.weight", (d,), (v,)))
    return out


# What a checkpoint tensor no rule used is: "ignore", "drop" or "unknown" (mapping.leftover_rule).
leftover = leftover_rule(BUFFERS)


def config_to_hf(cfg: ModelConfig) -> tuple[dict, str]:
    """ModelConfig → (``config.json`` dict, ""); ValueError if not T5-shaped."""
    require(cfg, "T5", family="encoder_decoder", position="relative", norm="rms",
            norm_position="pre", embedding_norm=False, use_bias=False, attention_scale=1.0,
            num_kv_heads=cfg.num_heads, scale_embeddings=False, lm_head_bias=False,
            type_vocab_size=0, head="lm", activation=tuple(TO_HF_ACTIVATIONS))
    rescale = cfg.rescale_tied_logits
    hf = {
        "model_type": MODEL_TYPE, "architectures": ["T5ForConditionalGeneration"],
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "d_kv": cfg.head_dim,
        "d_ff": cfg.d_ff, "num_layers": cfg.num_encoder_layers,
        "num_decoder_layers": cfg.num_decoder_layers, "num_heads": cfg.num_heads,
        "relative_attention_num_buckets": cfg.relative_num_buckets,
        "relative_attention_max_distance": cfg.relative_max_distance,
        "dropout_rate": cfg.dropout_rate, "layer_norm_epsilon": cfg.norm_eps,
        "initializer_factor": cfg.init_std if cfg.init_scheme == "t5" else 1.0,
        "feed_forward_proj": _feed_forward_proj(cfg),
        "is_encoder_decoder": True, "tie_word_embeddings": rescale,
        "scale_decoder_outputs": rescale, "n_positions": cfg.max_len, "pad_token_id": 0,
        "eos_token_id": 1, "decoder_start_token_id": 0, "dtype": "float32",
    }
    return hf, ""


def keep_source_type(hf: dict, source_type: str | None, cfg: ModelConfig) -> dict:
    """``config_to_hf``'s ``hf`` as ``model_type`` "mt5" (``MT5ForConditionalGeneration``) when the
    source model was an mT5 (``source_type``) and its logits are not rescaled, which mT5 never
    does; else ``hf`` ("t5")."""
    if source_type != "mt5" or cfg.rescale_tied_logits:
        return hf
    return {**hf, "model_type": "mt5", "architectures": ["MT5ForConditionalGeneration"]}
