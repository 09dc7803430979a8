"""Parameter specifications: shapes, logical axis names and initialisers, in one table.

A spec is a nested dict whose leaves are `ParamSpec`. The same spec

* initialises a plain pytree without any module system (`init_params`), for users of the pure
  functions in `jaxformer.ops.blocks`, and
* is the model's parameter tree (`jaxformer.models.model.Model`: ``init``, ``abstract``, and the
  logical names, which a mesh shards by rules, `jaxformer.parallel`) and `Transformer`'s
  `nnx.Param`s, the names carried as their ``out_sharding`` metadata.

`model_spec` lists a whole model by part: the one parameter tree of the models, checkpoints and the
HF converters.

Logical axis names used across the library: ``vocab``, ``embed`` (d_model), ``heads``, ``kv_heads``,
``head_dim``, ``mlp`` (d_ff), ``classes``, ``relpos`` (relative buckets), ``length``
(learned positions), ``types``, ``factored_embed`` (ALBERT's embedding width E, replicated);
``layers`` is prepended by scanned stacks; ``expert`` (the experts of an MoE FFN) and
``router_expert`` (the router's output columns, replicated).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxformer.config import ModelConfig

DISTRIBUTIONS = ("normal", "truncated_normal", "uniform", "zeros", "ones")


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    """One parameter: its shape, logical axes and initialiser (one of `DISTRIBUTIONS`; ``std`` is
    its standard deviation; for ``truncated_normal`` the one before truncation; ``uniform`` is
    symmetric, on ±std·sqrt(3))."""

    shape: tuple[int, ...]
    axes: tuple[str | None, ...]
    init: str = "normal"
    std: float = 0.02

    def initializer(self):
        if self.init == "normal":
            return nn.initializers.normal(self.std)
        if self.init == "truncated_normal":  # cut at ±2 std, not rescaled: TF's truncated_normal
            return nn.initializers.truncated_normal(self.std, lower=-2.0, upper=2.0)
        if self.init == "uniform":
            limit = self.std * 3 ** 0.5
            return lambda key, shape, dtype=jnp.float32: jax.random.uniform(
                key, shape, dtype, -limit, limit)
        if self.init == "zeros":
            return nn.initializers.zeros_init()
        if self.init == "ones":
            return nn.initializers.ones_init()
        raise ValueError(f"ParamSpec.init={self.init!r} is invalid: choose one of {DISTRIBUTIONS}")


# --------------------------------------------------------------------------------------------------
# Fresh initialisation by family (`ModelConfig.init_scheme`): every weight's rule is decided here.

ROLES = ("query", "key", "value", "out", "ffn_in", "ffn_out", "head", "projection", "embedding",
         "relative_bias")
_RESIDUAL_OUTPUTS = ("out", "ffn_out")  # kernels whose output is added to the residual stream


def initializer_of(cfg: ModelConfig, role: str, fan_in: int, residuals: int = 0) -> tuple[str, float]:
    """(distribution, std) of a fresh weight of ``role`` (one of `ROLES`) under ``cfg.init_scheme``.

    ``fan_in`` is the kernel's input width (prod of its input dims: ``out`` `[H, Dh, D]` has H·Dh);
    ``residuals`` the residual sublayers of its stack (`residual_sublayers`, the N of GPT-2).
    Norm scales start at 1 and biases at 0 in every scheme (their specs say so directly).

    ===========  ======================  ============================================================
    scheme       weight                  rule (source)
    ===========  ======================  ============================================================
    normal       kernels / tables        N(0, init_std) / N(0, embed_init_std): jaxformer's own init
                                         before issue 37, kept for configs saved without the field
                                         (their fresh parts start as before)
    gpt2         out, ffn_out            N(0, init_std / sqrt(N)), N = 2·n_layer residual sublayers
                                         (Radford et al. 2019 §2.3; HF GPT2PreTrainedModel._init_weights
                                         on ``c_proj``); N = 3 per layer with cross-attention
                 other kernels / tables  N(0, init_std) / N(0, embed_init_std) (HF: every Conv1D,
                                         Linear and Embedding at initializer_range, ``wpe`` included;
                                         OpenAI's released model.py draws wpe at 0.01, not followed)
    bert         kernels / tables        truncated normal, std init_std / embed_init_std before the
                                         cut at ±2 std (actual std 0.88×): Google's BERT and ALBERT
                                         ``modeling.py`` ``create_initializer`` =
                                         ``tf.truncated_normal_initializer(initializer_range)``, used
                                         for every dense, embedding, pooler and classifier (HF PyTorch
                                         draws normal_(initializer_range) instead: a port's shortcut)
    t5           query                   N(0, init_std · (d_model·head_dim)^-1/2): the 1/sqrt(head_dim)
                                         attention scale T5 leaves out is folded into q's init (Mesh
                                         TensorFlow; HF T5PreTrainedModel._init_weights)
                 relative_bias           N(0, init_std · d_model^-1/2) (HF ``relative_attention_bias``)
                 other kernels           N(0, init_std · fan_in^-1/2): k, v, wi d_model; o H·Dh; wo d_ff
                                         (HF); heads and ALBERT's projection by the same fan-in rule
                                         (HF's T5ClassificationHead, qa_outputs; Mesh TF's dense layers;
                                         HF draws an untied lm_head at init_std·1, logits of std
                                         sqrt(d_model) at init: not followed)
                 embedding               N(0, embed_init_std), = init_std = initializer_factor 1.0 (HF
                                         ``shared``)
    transformer  kernels                 uniform on ±init_std·sqrt(3 / fan_in), std init_std·fan_in^-1/2
                                         (tensor2tensor transformer_base: initializer
                                         "uniform_unit_scaling", initializer_gain 1.0; the paper names
                                         no init)
                 tables                  N(0, embed_init_std), d_model^-1/2 in the presets (t2t's
                                         symbol modality; inputs are scaled by sqrt(d_model), §3.4)
    ===========  ======================  ============================================================

    ``init_std`` is the base scale: the kernels' std, or the factor of the fan-in rules of t5 (HF
    ``initializer_factor``) and transformer (t2t's ``initializer_gain``).
    """
    if role not in ROLES:
        raise ValueError(f"role={role!r} is invalid: choose one of {ROLES}")
    scheme, table = cfg.init_scheme, role in ("embedding", "relative_bias")
    if scheme == "t5" and role != "embedding":
        fan = {"query": cfg.d_model * cfg.head_dim, "relative_bias": cfg.d_model}.get(role, fan_in)
        return "normal", cfg.init_std * fan ** -0.5
    if scheme == "transformer" and not table:
        return "uniform", cfg.init_std * fan_in ** -0.5
    std = cfg.embed_init_std if table else cfg.init_std
    if scheme == "gpt2" and role in _RESIDUAL_OUTPUTS:
        if residuals <= 0:
            raise ValueError(f"init_scheme='gpt2' scales {role!r} by its stack's residual sublayers; "
                             f"got residuals={residuals} (pass residual_sublayers(cfg, ...))")
        std /= residuals ** 0.5
    return ("truncated_normal" if scheme == "bert" else "normal"), std


def residual_sublayers(cfg: ModelConfig, *, cross_attention: bool = False) -> int:
    """Residual sublayers of the stack a block belongs to (GPT-2's N): 2 per layer (attention, FFN),
    3 in the decoder of an encoder-decoder (cross-attention), times that stack's layer count."""
    if cross_attention:
        return 3 * cfg.num_decoder_layers
    return 2 * (cfg.num_encoder_layers if cfg.family == "encoder_decoder" else cfg.num_layers)



def _kernel(cfg: ModelConfig, shape, axes, role: str, fan_in: int, residuals: int = 0) -> ParamSpec:
    return ParamSpec(tuple(shape), tuple(axes), *initializer_of(cfg, role, fan_in, residuals))


def _dense(cfg: ModelConfig, shape, axes, bias_shape, bias_axes, role: str, fan_in: int,
           residuals: int = 0) -> dict:
    out = {"kernel": _kernel(cfg, shape, axes, role, fan_in, residuals)}
    if cfg.use_bias or (cfg.qkv_bias and role in ("query", "key", "value")):
        out["bias"] = ParamSpec(tuple(bias_shape), tuple(bias_axes), "zeros")
    return out


FACTORED_EMBED = "factored_embed"  # the width E of ALBERT's factorised embedding


def embedding_width(cfg: ModelConfig) -> tuple[int, str]:
    """(width, logical axis) of the embedding tables: (E, ``factored_embed``) with
    ``cfg.embedding_size`` (ALBERT), else (d_model, ``embed``)."""
    if cfg.embedding_size is None:
        return cfg.d_model, "embed"
    return cfg.embedding_size, FACTORED_EMBED


def norm_spec(cfg: ModelConfig, width: int | None = None, axis: str = "embed") -> dict:
    """A norm over ``width`` features (default d_model) on logical ``axis``."""
    d = width or cfg.d_model
    out = {"scale": ParamSpec((d,), (axis,), "ones")}
    if cfg.norm == "layer" and cfg.norm_bias:
        out["bias"] = ParamSpec((d,), (axis,), "zeros")
    return out


def attention_spec(cfg: ModelConfig, residuals: int) -> dict:
    """q, k, v `[D, H(kv), Dh]` and out `[H, Dh, D]` of a stack of ``residuals`` sublayers."""
    d, h, k, dh = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    heads, kv_heads = ("heads", "head_dim"), ("kv_heads", "head_dim")
    return {
        "query": _dense(cfg, (d, h, dh), ("embed", *heads), (h, dh), heads, "query", d),
        "key": _dense(cfg, (d, k, dh), ("embed", *kv_heads), (k, dh), kv_heads, "key", d),
        "value": _dense(cfg, (d, k, dh), ("embed", *kv_heads), (k, dh), kv_heads, "value", d),
        "out": _dense(cfg, (h, dh, d), (*heads, "embed"), (d,), ("embed",), "out", h * dh, residuals),
    }


def ffn_spec(cfg: ModelConfig, residuals: int, width: int | None = None) -> dict:
    """wi (and wi_gate) `[D, F]`, wo `[F, D]` of a stack of ``residuals`` sublayers; F = ``width``
    (default d_ff)."""
    d, f = cfg.d_model, width or cfg.d_ff
    out = {"wi": _dense(cfg, (d, f), ("embed", "mlp"), (f,), ("mlp",), "ffn_in", d)}
    if cfg.gated_ffn:
        out["wi_gate"] = _dense(cfg, (d, f), ("embed", "mlp"), (f,), ("mlp",), "ffn_in", d)
    out["wo"] = _dense(cfg, (f, d), ("mlp", "embed"), (d,), ("embed",), "ffn_out", f, residuals)
    return out


def moe_ffn_spec(cfg: ModelConfig, residuals: int) -> dict:
    """An MoE FFN (`jaxformer.ops.moe`): router `[D, E]`; wi (and wi_gate) `[E, D, F]`, wo
    `[E, F, D]` with ``E`` = num_experts on logical axis ``expert``, F = moe_d_ff; the shared
    experts' dense FFN `[D, S·F]` (``num_shared_experts`` = S) and its gate `[D, 1]`."""
    d, f, e = cfg.d_model, cfg.moe_d_ff, cfg.num_experts
    expert_in = ("expert", "embed", "mlp"), ("expert", "mlp")
    out = {"router": {"kernel": _kernel(cfg, (d, e), ("embed", "router_expert"), "ffn_in", d)},
           "wi": _dense(cfg, (e, d, f), expert_in[0], (e, f), expert_in[1], "ffn_in", d)}
    if cfg.gated_ffn:
        out["wi_gate"] = _dense(cfg, (e, d, f), expert_in[0], (e, f), expert_in[1], "ffn_in", d)
    out["wo"] = _dense(cfg, (e, f, d), ("expert", "mlp", "embed"), (e, d), ("expert", "embed"),
                       "ffn_out", f, residuals)
    if cfg.num_shared_experts:
        out["shared"] = ffn_spec(cfg, residuals, cfg.num_shared_experts * f)
    if cfg.shared_expert_gate:
        out["shared_gate"] = {"kernel": _kernel(cfg, (d, 1), ("embed", None), "ffn_in", d)}
    return out


def block_spec(cfg: ModelConfig, *, cross_attention: bool = False, moe: bool = False) -> dict:
    """Spec of one `jaxformer.ops.blocks.transformer_block`; ``moe``: its FFN is `moe_ffn_spec`."""
    n = residual_sublayers(cfg, cross_attention=cross_attention)
    spec = {"self_attn": attention_spec(cfg, n), "self_attn_norm": norm_spec(cfg)}
    if cross_attention:
        spec["cross_attn"] = attention_spec(cfg, n)
        spec["cross_attn_norm"] = norm_spec(cfg)
    spec["ffn"] = moe_ffn_spec(cfg, n) if moe else ffn_spec(cfg, n)
    spec["ffn_norm"] = norm_spec(cfg)
    return spec


def _table(cfg: ModelConfig, rows: int, axes: tuple[str, str], cols: int | None = None,
           role: str = "embedding") -> ParamSpec:
    """A `[rows, cols]` lookup table (cols default d_model), initialised as ``role``."""
    return ParamSpec((rows, cols or cfg.d_model), axes, *initializer_of(cfg, role, rows))


def token_embed_spec(cfg: ModelConfig) -> dict:
    """The `[vocab, E]` token table, E = d_model or ``embedding_size`` (also the tied output
    projection); vocab = ``cfg.padded_vocab_size`` (``vocab_pad_multiple``), as for every table
    on the ``vocab`` axis."""
    width, axis = embedding_width(cfg)
    return {"embedding": _table(cfg, cfg.padded_vocab_size, ("vocab", axis), width)}


def input_embedding_spec(cfg: ModelConfig) -> dict:
    """Learned positions, token types and BERT's embedding norm, all E wide, then ALBERT's
    `[E, d_model]` ``projection`` when ``embedding_size`` is set (`jaxformer.ops.inputs`)."""
    width, axis = embedding_width(cfg)
    spec = {}
    if cfg.position == "learned":
        rows = cfg.max_len + cfg.position_offset  # RoBERTa / BART keep rows before position 0
        spec["pos_embedding"] = _table(cfg, rows, ("length", axis), width)
    if cfg.type_vocab_size:
        spec["type_embedding"] = _table(cfg, cfg.type_vocab_size, ("types", axis), width)
    if cfg.embedding_norm:
        spec["norm"] = norm_spec(cfg, width, axis)
    if cfg.embedding_size is not None:
        d = cfg.d_model
        spec["projection"] = _dense(cfg, (width, d), (axis, "embed"), (d,), ("embed",), "projection",
                                    width)
    return spec


def image_embedding_spec(cfg: ModelConfig) -> dict:
    """The Vision Transformer's input (`jaxformer.ops.patches.image_inputs`): the patch projection
    ``patch_embedding`` {kernel `[P, P, C, D]`, bias `[D]`}, the class vector ``class_embedding``
    `[D]` (``class_token``) and the learned positions ``pos_embedding`` `[image_length, D]`."""
    p, c, d = cfg.patch_size, cfg.num_channels, cfg.d_model
    spec = {"patch_embedding": {
        "kernel": _kernel(cfg, (p, p, c, d), (None, None, None, "embed"), "projection", p * p * c),
        "bias": ParamSpec((d,), ("embed",), "zeros")}}
    if cfg.class_token:
        spec["class_embedding"] = ParamSpec((d,), ("embed",), *initializer_of(cfg, "embedding", 1))
    if cfg.position == "learned":
        spec["pos_embedding"] = _table(cfg, cfg.image_length, ("length", "embed"))
    return spec


def relative_bias_spec(cfg: ModelConfig) -> dict:
    """T5's `[buckets, heads]` relative position table, one per stack."""
    return {"embedding": _table(cfg, cfg.relative_num_buckets, ("relpos", "heads"), cfg.num_heads,
                                "relative_bias")}


def head_dense_spec(cfg: ModelConfig, d_out: int, axes: tuple[str, str], bias: bool) -> dict:
    """A `[d_model, d_out]` kernel (+ `[d_out]` bias) of an output head."""
    out = {"kernel": _kernel(cfg, (cfg.d_model, d_out), axes, "head", cfg.d_model)}
    if bias:
        out["bias"] = ParamSpec((d_out,), axes[1:], "zeros")
    return out


def lm_head_spec(cfg: ModelConfig) -> dict:
    """Tied: at most a `[vocab]` bias; untied: a `[d_model, vocab]` kernel (`jaxformer.ops.heads`)."""
    vocab = cfg.padded_vocab_size
    if cfg.tie_embeddings:
        return {"bias": ParamSpec((vocab,), ("vocab",), "zeros")} if cfg.lm_head_bias else {}
    return head_dense_spec(cfg, vocab, ("embed", "vocab"), cfg.lm_head_bias)


def mlm_head_spec(cfg: ModelConfig) -> dict:
    """BERT's transform (dense + norm, with ``mlm_transform``; the dense biased with ``use_bias``)
    and the LM head as ``decoder``."""
    spec = {}
    width, axis = embedding_width(cfg)
    if cfg.mlm_transform:  # ALBERT: d_model -> E, so that the tied E-wide table decodes
        axes = ("embed", "mlp" if cfg.embedding_size is None else axis)
        spec = {"dense": head_dense_spec(cfg, width, axes, cfg.use_bias),
                "norm": norm_spec(cfg, width, axis)}
    decoder = lm_head_spec(cfg)
    if cfg.embedding_size is not None and not cfg.tie_embeddings:  # decodes the E-wide transform
        decoder["kernel"] = _kernel(cfg, (width, cfg.padded_vocab_size), (axis, "vocab"), "head",
                                    width)
    return {**spec, "decoder": decoder} if decoder else spec


def stacked(spec: Mapping, n: int) -> dict:
    """``spec`` with every leaf stacked ``n`` times on a leading ``layers`` axis (scanned stacks)."""
    return jax.tree.map(lambda s: dataclasses.replace(s, shape=(n, *s.shape), axes=("layers", *s.axes)),
                        dict(spec), is_leaf=lambda s: isinstance(s, ParamSpec))


def stack_spec(cfg: ModelConfig, num_layers: int, *, cross_attention: bool = False) -> dict:
    """``num_layers`` blocks: ``{"layers": stacked}`` with ``cfg.scan_layers``, else ``layer_i``;
    with ``cfg.share_layers`` (ALBERT) one block ``{"shared": block}`` in either layout."""
    block = lambda i: block_spec(cfg, cross_attention=cross_attention, moe=cfg.moe_layer(i))  # noqa: E731
    if cfg.share_layers:  # validated: moe_every = 1 with shared or scanned stacks
        return {"shared": block(0)}
    if cfg.scan_layers:
        return {"layers": stacked(block(0), num_layers)}
    return {f"layer_{i}": block(i) for i in range(num_layers)}


def model_spec(cfg: ModelConfig) -> dict:
    """Every parameter of ``cfg``'s model, by top-level part: exactly the tree of the NNX
    ``build_model(cfg).init(...)["params"]`` and of the NNX model's `nnx.Param` state.

    Parts: ``token_embed`` (not for images); per stack ``S`` (``encoder``/``decoder``) its input
    embedding (``embed``, `image_embedding_spec`'s for images; ``S_embed`` in encoder-decoder
    models), the blocks ``S``, ``S_relative_bias`` (relative positions) and ``S_norm`` (pre-LN);
    ``jump_embed`` (``permutation_lm``); then the
    head's parts (``lm_head``, ``mlm_head``, ``pooler``, ``nsp_head``, ``classifier``,
    ``token_classifier``, ``qa_outputs``). Parts without parameters are left out.
    """
    stacks = {"encoder": [("encoder", "embed", cfg.num_layers, False)],
              "decoder": [("decoder", "embed", cfg.num_layers, False)],
              "encoder_decoder": [("encoder", "encoder_embed", cfg.num_encoder_layers, False),
                                  ("decoder", "decoder_embed", cfg.num_decoder_layers, True)]}
    spec = {} if cfg.image_size else {"token_embed": token_embed_spec(cfg)}  # ViT: pixels, no vocabulary
    for name, embed_name, n, cross in stacks[cfg.family]:
        spec[embed_name] = image_embedding_spec(cfg) if cfg.image_size else input_embedding_spec(cfg)
        if cfg.position == "relative":
            spec[f"{name}_relative_bias"] = relative_bias_spec(cfg)
        spec[name] = stack_spec(cfg, n, cross_attention=cross)
        if cfg.norm_position == "pre":
            spec[f"{name}_norm"] = norm_spec(cfg)
    if cfg.permutation_lm:  # XLNet's query-stream jump offsets (`jaxformer.ops.permutation`)
        spec["jump_embed"] = {"embedding": _table(cfg, 2 * cfg.max_len - 1, ("length", "embed"),
                                                  cfg.d_model)}
    classes = ("embed", "classes")
    if cfg.head == "lm":
        spec["lm_head"] = lm_head_spec(cfg)
    elif cfg.head == "mlm":
        spec["mlm_head"] = mlm_head_spec(cfg)
    elif cfg.head == "token_classify":
        spec["token_classifier"] = head_dense_spec(cfg, cfg.num_classes, classes, True)
    elif cfg.head == "span":
        spec["qa_outputs"] = head_dense_spec(cfg, 2, classes, True)
    if cfg.pooler and (cfg.head in ("classify", "none") or cfg.nsp_head):
        spec["pooler"] = head_dense_spec(cfg, cfg.d_model, ("embed", "mlp"), True)
    if cfg.nsp_head:
        spec["nsp_head"] = head_dense_spec(cfg, 2, classes, True)
    if cfg.prediction_head:  # ModernBERT's dense + norm before the (token) classifier
        spec["prediction_head"] = {"dense": head_dense_spec(cfg, cfg.d_model, ("embed", "mlp"),
                                                            cfg.use_bias), "norm": norm_spec(cfg)}
    if cfg.head == "classify":
        spec["classifier"] = head_dense_spec(cfg, cfg.num_classes, classes, True)
    return {k: v for k, v in spec.items() if v}


def init_params(rng: jax.Array, spec: Mapping, dtype=jnp.float32) -> dict:
    """Initialise a plain pytree from a spec (no Flax), e.g. ``init_params(key, block_spec(cfg))``."""
    leaves, treedef = jax.tree_util.tree_flatten(spec, is_leaf=lambda x: isinstance(x, ParamSpec))
    keys = jax.random.split(rng, len(leaves))
    values = [s.initializer()(k, s.shape, dtype) for s, k in zip(leaves, keys)]
    return jax.tree_util.tree_unflatten(treedef, values)
