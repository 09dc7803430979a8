"""Fresh initialisation per family (`jaxformer.models.spec.initializer_of`): every parameter's std
against Hugging Face PyTorch's ``_init_weights`` for the same config, and the step-0 loss of every
family preset against the uniform ln(vocab).

The HF side is a fresh ``transformers`` model built from the ``config.json`` jaxformer exports
(`save_hf`), read back into jaxformer's names with the converters (`load_hf`): its per-tensor
statistics and T5's step-0 losses are committed golden files (`tests/make_golden.py`, which
recomputes them with the installed transformers under ``make test-hf``); nothing is downloaded.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from golden import init_stats

from jaxformer.config import ModelConfig
from jaxformer.convert.mapping import flatten, unflatten
from jaxformer.models import build_model
from jaxformer.models.presets import PRESETS, preset
from jaxformer.models.spec import initializer_of, residual_sublayers

# The std of a normal cut at ±2 std, as a fraction of its std before the cut.
TRUNCATED_STD = 0.8796256610342398
# Deliberate differences from HF PyTorch, by init_scheme: (our std / HF's std, reason).
DELIBERATE = {
    "bert": (TRUNCATED_STD, "Google's BERT and ALBERT (modeling.py create_initializer) draw every "
             "weight from tf.truncated_normal_initializer(initializer_range), cut at ±2 std; HF "
             "PyTorch draws normal_(initializer_range)"),
}
_SIZES = dict(d_model=256, num_heads=8, d_ff=1024, num_layers=4, vocab_size=1024, max_len=128)
HF_CASES = {
    "gpt2": preset("gpt_tiny", **_SIZES),
    "bert": preset("bert_tiny", **_SIZES),
    "albert": preset("albert_tiny", **dict(_SIZES, embedding_size=128)),
    "t5": preset("t5_tiny", **_SIZES),
    # BERT's pooler and classifier (GPT-2's classify head has no HF export to compare with)
    "bert_classify": preset("bert_tiny", **dict(_SIZES, head="classify", num_classes=64)),
}


def fresh(cfg: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """jaxformer's fresh init, flat ``{path: array}``."""
    params = build_model(cfg).init(jax.random.key(seed))
    return {k: np.asarray(v) for k, v in flatten(params).items()}


def _hf_fresh(name: str, cfg: ModelConfig) -> dict[str, tuple[float, float]]:
    """HF PyTorch's fresh init of the same config, {jaxformer path: (mean, std)} (golden)."""
    golden = init_stats()[name]
    # as configs load: a field added since the golden files were made takes its default
    assert ModelConfig.from_dict(golden["config"]) == cfg, (
        f"HF_CASES[{name!r}] changed: regenerate the golden files (python tests/make_golden.py)")
    return {path: tuple(v) for path, v in golden["stats"].items()}


@pytest.mark.parametrize("name", sorted(HF_CASES))
def test_every_parameter_std_matches_hf_pytorch_fresh_init(name):
    """Per tensor: std within 5% of HF's (or 3 standard errors, 3/sqrt(2n), for tensors too small
    to estimate to 5%), times the deliberate ratio of `DELIBERATE`; constant tensors (norm scales,
    biases) equal."""
    cfg = ModelConfig.from_dict(HF_CASES[name])
    ours, theirs = fresh(cfg), _hf_fresh(name, cfg)
    assert sorted(ours) == sorted(theirs)
    ratio = DELIBERATE.get(cfg.init_scheme, (1.0, ""))[0]
    bad = []
    for path in sorted(ours):
        a, (b_mean, b_std) = ours[path], theirs[path]
        if b_std == 0:
            if a.std() != 0 or a.mean() != b_mean:
                bad.append(f"{path}: ours mean {a.mean():.4g} std {a.std():.4g}, HF constant {b_mean:.4g}")
            continue
        tol = max(0.05, 3 / math.sqrt(2 * a.size))
        if abs(a.std() / (b_std * ratio) - 1) > tol:
            bad.append(f"{path}: std ours {a.std():.5f}, HF {b_std:.5f} x {ratio:.3f}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("name", ["gpt_tiny", "t5_tiny", "albert_tiny", "transformer_tiny"])
def test_both_stack_layouts_and_the_nnx_class_initialise_alike(name):
    """One rule table: the unrolled and scanned stacks and the NNX class (`Transformer`) draw each
    tensor with the same distribution (the scanned ``layers/…`` tensor pools the unrolled
    ``layer_i/…``)."""
    from jaxformer.convert.mapping import unstack_layers
    from jaxformer.models import Transformer

    cfg = ModelConfig.from_dict(preset(name, num_layers=4, d_ff=512))
    layouts = {
        "unrolled": fresh(cfg),
        "scanned": flatten(unstack_layers(unflatten(fresh(cfg.replace(scan_layers=True))))),
        "nnx": flatten(Transformer(cfg, 1).param_dict()),
    }
    ref = layouts["unrolled"]
    for layout, flat in layouts.items():
        assert sorted(flat) == sorted(ref), layout
        for path, x in flat.items():
            want = np.std(ref[path])
            got = np.std(np.asarray(x))
            assert got == pytest.approx(want, rel=max(0.1, 4 / math.sqrt(2 * ref[path].size)),
                                        abs=1e-7), (layout, path)


def test_the_rules_are_the_published_ones():
    """The scales HF's ``_init_weights`` names, stated once (the test above checks the tensors)."""
    t5 = ModelConfig.from_dict(preset("t5_small"))
    d, dkv, h, f = t5.d_model, t5.head_dim, t5.num_heads, t5.d_ff
    assert initializer_of(t5, "query", d) == ("normal", pytest.approx((d * dkv) ** -0.5))
    assert initializer_of(t5, "key", d) == ("normal", pytest.approx(d ** -0.5))
    assert initializer_of(t5, "out", h * dkv) == ("normal", pytest.approx((h * dkv) ** -0.5))
    assert initializer_of(t5, "ffn_out", f) == ("normal", pytest.approx(f ** -0.5))
    assert initializer_of(t5, "relative_bias", 32) == ("normal", pytest.approx(512 ** -0.5))  # 0.044
    assert initializer_of(t5, "embedding", 32128) == ("normal", 1.0)
    gpt = ModelConfig.from_dict(preset("gpt2_medium"))
    n = residual_sublayers(gpt)
    assert n == 48
    assert initializer_of(gpt, "ffn_out", 4096, n) == ("normal", pytest.approx(0.02 / 48 ** 0.5))
    assert initializer_of(gpt, "ffn_in", 1024, n) == ("normal", 0.02)
    assert initializer_of(ModelConfig.from_dict(preset("bert_base")), "head", 768) == (
        "truncated_normal", 0.02)
    with pytest.raises(ValueError, match="residuals=0"):
        initializer_of(gpt, "out", 1024)
    with pytest.raises(ValueError, match="model.init_scheme='xavier' is invalid"):
        ModelConfig.from_dict(preset("gpt_tiny", init_scheme="xavier"))


def test_old_configs_without_init_scheme_load_with_the_previous_init():
    """A config.json written before the field existed loads (fresh parts start as they did then),
    and a resume that changes only the init settings is allowed."""
    from jaxformer.config import resumable_fields
    old = {k: v for k, v in ModelConfig.from_dict(preset("t5_tiny")).to_dict().items()
           if k != "init_scheme"}
    old.update(init_std=0.02, embed_init_std=1.0)
    cfg = ModelConfig.from_dict(old)
    assert cfg.init_scheme == "normal"
    assert fresh(cfg)["encoder/layer_0/ffn/wo/kernel"].std() == pytest.approx(0.02, rel=0.05)
    assert {"init_scheme", "init_std", "embed_init_std"} <= set(resumable_fields())


# --------------------------------------------------------------------------------------------------
# Step 0: a fresh model knows nothing, so it should say so: loss ≈ ln(vocab), no copying.

# A real batch: the opening of Sonnet 18 as bytes (every tiny / mini vocabulary is > 256).
TEXT = (b"Shall I compare thee to a summer's day? Thou art more lovely and more temperate: Rough "
        b"winds do shake the darling buds of May, And summer's lease hath all too short a date; "
        b"Sometime too hot the eye of heaven shines, And often is his gold complexion dimm'd; And "
        b"every fair from fair sometime declines, By chance or nature's changing course untrimm'd")
FAMILY_PRESETS = sorted(n for n in PRESETS if n.endswith(("_tiny", "_mini")))


def text_rows(rows: int, length: int) -> np.ndarray:
    """`[rows, length + 1]` int32 byte ids of `TEXT`, each row starting 23 bytes after the last."""
    ids = np.frombuffer(TEXT, np.uint8).astype(np.int32)
    return np.stack([ids[i * 23:i * 23 + length + 1] for i in range(rows)])


def step0(cfg: ModelConfig, seed: int = 0, rows: int = 8, length: int = 48) -> tuple[float, float]:
    """(mean cross-entropy in nats, mean probability given to each position's own input token)
    of a fresh model on byte tokens of `TEXT`. Decoders predict the next token, encoder-decoders
    the target (their decoder input is the target shifted right), MLM encoders the 15% of tokens
    replaced by a mask id (the own-token probability is read at the other positions)."""
    x = text_rows(rows, length)
    model = build_model(cfg)
    if cfg.family == "decoder":
        inputs, targets = x[:, :-1], x[:, 1:]
        weights = np.ones(targets.shape, np.float32)
    elif cfg.family == "encoder_decoder":
        inputs, targets = (x[:, :-1], x[:, 1:]), x[:, 1:]
        inputs = (inputs[0], np.concatenate([np.zeros((rows, 1), np.int32), targets[:, :-1]], 1))
        weights = np.ones(targets.shape, np.float32)
    else:
        masked = np.random.default_rng(seed).random((rows, length)) < 0.15
        targets = x[:, :-1]
        inputs = np.where(masked, cfg.vocab_size - 1, targets)
        weights = masked.astype(np.float32)
    args = inputs if isinstance(inputs, tuple) else (inputs,)
    params = build_model(cfg).init(jax.random.key(seed))
    logp = jax.nn.log_softmax(model.apply(params, *args).astype(jnp.float32), -1)
    loss = -(np.take_along_axis(logp, targets[..., None], -1)[..., 0] * weights).sum() / weights.sum()
    own_in = args[-1]  # the token each output position reads at its own position
    own = np.exp(np.take_along_axis(logp, own_in[..., None], -1)[..., 0])
    keep = 1 - weights if cfg.family == "encoder" else np.ones_like(weights)
    return float(loss), float((own * keep).sum() / keep.sum())


# Unit-std logits at init: T5 (tied table of std 1, hidden states rescaled by d_model^-1/2) and
# tensor2tensor's Transformer (std d_model^-1/2 table, layer-normed hidden states). Logits of std s
# cost about s²/2 nats over ln(vocab) by themselves, so their published inits start 0.5-0.6 nats up
# (HF PyTorch's T5 too: 6.80 at t5_tiny, 9.6 at d_model 512 / vocab 8192): allowed 1 nat.
UNIT_LOGITS = {"t5": 1.0, "transformer": 1.0}


@pytest.mark.parametrize("name", FAMILY_PRESETS)
def test_a_fresh_model_starts_at_the_uniform_loss_and_does_not_copy(name):
    """Step-0 loss (mean of 3 inits) within 0.5 nats of ln(vocab) (`UNIT_LOGITS`: 1 nat); each
    position's own input token has p < 0.5. (T5's former flat 0.02 kernels under std-1 embeddings
    gave 8.07 nats here against ln(512) = 6.24, p = 0.74; 17.8 and p = 0.9996 at vocab 8192.)"""
    cfg = ModelConfig.from_dict(preset(name, dropout_rate=0.0, attention_dropout_rate=0.0))
    losses, owns = zip(*(step0(cfg, seed) for seed in range(3)))
    assert abs(np.mean(losses) - math.log(cfg.vocab_size)) < UNIT_LOGITS.get(cfg.init_scheme, 0.5), (
        losses, math.log(cfg.vocab_size))
    assert max(owns) < 0.5, owns


T5_STEP0_CONFIG = preset("t5_tiny", dropout_rate=0.0, ffn_dropout_rate=0.0)


def test_t5_starts_where_hf_pytorch_starts():
    """T5's step-0 loss, mean of 3 inits, is HF PyTorch's (T5ForConditionalGeneration, fresh, 3
    seeds; golden) on the same batch within 0.25 nats (the spread of one init is about ±0.2)."""
    cfg = ModelConfig.from_dict(T5_STEP0_CONFIG)
    golden = init_stats()["t5_step0"]
    assert ModelConfig.from_dict(golden["config"]) == cfg, (
        "T5_STEP0_CONFIG changed: run python tests/make_golden.py")
    ours = np.mean([step0(cfg, seed)[0] for seed in range(3)])
    theirs = golden["losses"]
    assert abs(ours - np.mean(theirs)) < 0.25, (ours, theirs)
