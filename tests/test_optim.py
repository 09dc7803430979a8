"""The optimizer (decay mask on real models, clipping, frozen backbone, head lr) and the train
step's gradient accumulation."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.ops.losses import weighted_cross_entropy
from jaxformer.train.optim import (
    HEAD_PARAM_PREFIXES,
    OPTIMIZER_PRESETS,
    OptimizerSettings,
    decay_mask,
    default_optimizer_config,
    make_optimizer,
    optimizer_settings,
    param_labels,
)

TABLE_AXES = {"vocab", "length", "types", "relpos"}  # first logical axis of an embedding table
TOKENS = jnp.asarray(np.random.default_rng(0).integers(7, 128, (4, 10)), jnp.int32)


def init(name: str, abstract: bool = False, **overrides):
    """(model, params); ``abstract`` gives ShapeDtypeStructs without running the init."""
    cfg = ModelConfig.from_dict(preset(name, vocab_size=128, max_len=16, dropout_rate=0.0,
                                       attention_dropout_rate=0.0, **overrides))
    model = build_model(cfg)
    run = jax.eval_shape if abstract else (lambda f: jax.jit(f)())
    params = run(lambda: model.init(jax.random.key(0)))
    return model, params


def classifier_grads(model, params):
    labels = jnp.array([0, 1, 2, 1])

    def loss(p):
        logits = model.apply(p, TOKENS)
        total, weight = weighted_cross_entropy(logits, labels)
        return total / weight

    return jax.jit(jax.grad(loss))(params)


@pytest.fixture(scope="module")
def classifier():
    """A BERT-tiny classifier with scanned layers (rank-2 scanned biases) and the
    gradients of a cross-entropy loss."""
    model, params = init("bert_tiny", head="classify", num_classes=3, scan_layers=True)
    return model, params, classifier_grads(model, params)


def flat(tree, is_leaf=None) -> dict:
    leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]
    return {"/".join(str(k.key) for k in path): leaf for path, leaf in leaves}


def expected_decay(axes: tuple[str | None, ...]) -> bool:
    """Independent rule from logical axes: a projection (≥ 2 axes besides ``layers``, one of
    them ``embed``) that is not an embedding table. Attention biases `[heads, head_dim]` are rank 2
    but have no ``embed`` axis."""
    names = [n for n in axes if n != "layers"]
    return len(names) >= 2 and "embed" in names and names[0] not in TABLE_AXES


@pytest.mark.parametrize("name,overrides", [
    ("bert_tiny", dict(scan_layers=True, nsp_head=True)),
    ("bert_tiny", dict(head="classify")),
    ("t5_tiny", {}),
    ("gpt_tiny", dict(tie_embeddings=False, scan_layers=True)),
])
def test_decay_mask_on_real_models(name, overrides):
    model, params = init(name, abstract=True, **overrides)
    params = flat(params)
    axes = flat(model.logical_axes(), is_leaf=lambda x: isinstance(x, tuple))
    mask_plain = flat(decay_mask(model.abstract()))
    assert set(mask_plain) == set(params) == set(axes)
    for path in params:
        assert mask_plain[path] is expected_decay(axes[path]), path
    decayed = [p for p in params if mask_plain[p]]
    assert decayed and all(p.endswith("kernel") for p in decayed)
    assert not any(mask_plain[p] for p in params if p.endswith(("bias", "scale", "embedding")))


def run_updates(tx, params, grads_seq):
    state = tx.init(params)
    update = jax.jit(tx.update)
    for g in grads_seq:
        updates, state = update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def test_weight_decay_is_applied_only_where_masked(classifier):
    _, params, _ = classifier
    cfg = optimizer_settings(schedule="constant", peak_lr=0.1, weight_decay=0.5)
    tx, _ = make_optimizer(cfg, 64, 100, params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    new, _ = run_updates(tx, params, [zeros])  # Adam's step is 0 for zero gradients
    mask = decay_mask(params)
    jax.tree.map(lambda m, p, q: np.testing.assert_allclose(q, p * (1 - 0.05) if m else p,
                                                            rtol=1e-6), mask, params, new)


@pytest.mark.parametrize("scale", [0.1, 100.0])
def test_clipping_bounds_the_gradient_adam_sees(scale):
    rng = np.random.default_rng(0)
    params = {"a": {"kernel": jnp.ones((3, 4))}, "b": {"bias": jnp.ones(4)}}
    grads = jax.tree.map(lambda p: scale * jnp.asarray(rng.normal(size=p.shape), jnp.float32),
                         params)
    tx, _ = make_optimizer(optimizer_settings(schedule="constant", clip_norm=1.0), 8, 10)
    _, state = run_updates(tx, params, [grads])
    seen = jax.tree.map(lambda m: m / (1 - 0.9), optax.tree_utils.tree_get(state, "mu"))
    norm = float(optax.tree.norm(grads))
    factor = min(1.0, 1.0 / norm)
    jax.tree.map(lambda s, g: np.testing.assert_allclose(s, g * factor, rtol=1e-5), seen, grads)
    assert float(optax.tree.norm(seen)) <= 1.0 + 1e-5


@dataclasses.dataclass(frozen=True)
class TokenLogits:
    """logits = table[token]: a model (what the train step calls: ``apply(params, tokens, rng=…)``,
    as `jaxformer.models.Model`) whose cross-entropy gradient NumPy can write down."""

    vocab: int
    cfg = None  # not a jaxformer model: its logits are its own (no padded vocabulary)

    def init(self, rng: jax.Array) -> dict:
        return {"table": jax.random.normal(rng, (self.vocab, self.vocab))}

    def apply(self, params: dict, tokens, rng=None):
        return params["table"][tokens]


def test_scan_accumulation_weights_every_token_equally():
    """Micro-batches of 71 and 8 counted tokens: the accumulated step's gradient is the mean over
    all 79 tokens (float64 NumPy reference), not the mean of the two micro-batch means (optax
    ``MultiSteps``' rule, which weighs a token of the short micro-batch 71/8 times as much)."""
    import dataclasses

    from jaxformer.train.config import base_config, train_settings
    from jaxformer.train.state import TrainState
    from jaxformer.train.step import make_train_step

    vocab, length = 5, 80
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, (2, length))
    targets = rng.integers(0, vocab, (2, length))
    weights = np.zeros((2, length), np.float32)
    weights[0, :71], weights[1, :8] = 1, 1  # grad_accum_steps=2: micro-batch i holds row i
    model = TokenLogits(vocab)
    params = model.init(jax.random.key(0))
    tx = optax.sgd(1.0)
    state = TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params),
                       rng=jax.random.key_data(jax.random.key(0)))

    def prepare(batch, rng):
        return {"model_inputs": {"tokens": batch["inputs"]}, "targets": batch["targets"],
                "weights": batch["weights"]}

    run = dataclasses.replace(train_settings(base_config(), ModelConfig()),
                              optimizer=OptimizerSettings(grad_accum_steps=2))
    step = jax.jit(make_train_step(model, tx, prepare, lambda s: 1.0, run=run))
    new, metrics = step(state, {"inputs": jnp.asarray(tokens, jnp.int32),
                                "targets": jnp.asarray(targets, jnp.int32),
                                "weights": jnp.asarray(weights)})

    table = np.asarray(params["table"], np.float64)
    logits = table[tokens]                                            # [2, L, V]
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    dlogits = (np.exp(log_probs) - np.eye(vocab)[targets]) * weights[..., None]
    row_grads = [np.zeros_like(table) for _ in range(2)]              # per micro-batch sums
    for r in range(2):
        np.add.at(row_grads[r], tokens[r], dlogits[r])
    token_mean = (row_grads[0] + row_grads[1]) / 79
    mean_of_means = (row_grads[0] / 71 + row_grads[1] / 8) / 2
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    assert float(metrics["tokens"]) == 79
    np.testing.assert_allclose(float(metrics["loss"]), (nll * weights).sum() / 79, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(new.params["table"]), table - token_mean, rtol=1e-5,
                               atol=1e-6)
    rel = np.linalg.norm(mean_of_means - token_mean) / np.linalg.norm(token_mean)
    assert rel > 0.5, rel  # the two rules differ here


def test_frozen_backbone_moves_only_the_head(classifier):
    _, params, grads = classifier
    # Huge backbone gradients must neither move the backbone nor shrink the head's clipped update.
    grads = jax.tree.map(lambda lab, g: g if lab == "head" else g * 1e6, param_labels(grads), grads)
    cfg = optimizer_settings(schedule="constant", peak_lr=1e-2, weight_decay=0.1,
                                   clip_norm=1e3, freeze_backbone=True, head_lr_multiplier=2.0)
    tx, _ = make_optimizer(cfg, 64, 100, params)
    new, state = run_updates(tx, params, [grads])
    labels = flat(param_labels(params))
    old_f, new_f = flat(params), flat(new)
    head = [p for p in labels if labels[p] == "head"]
    assert {p.split("/")[0] for p in head} == {"pooler", "classifier"}
    for path in old_f:
        if path in head:
            assert not np.array_equal(old_f[path], new_f[path]), path
        else:
            np.testing.assert_array_equal(old_f[path], new_f[path], err_msg=path)
    mu = jax.tree_util.tree_leaves(optax.tree_utils.tree_get(state, "mu"))
    assert len(mu) == len(head)  # no optimizer state for the frozen backbone
    head_grads = [g for p, g in flat(grads).items() if p in head]
    mu_head = jax.tree_util.tree_leaves(optax.tree_utils.tree_get(state, "mu"))
    assert float(optax.tree.norm(head_grads)) < 1e3  # below the clip: Adam saw it unscaled
    np.testing.assert_allclose(float(optax.tree.norm(mu_head)) / 0.1,
                               float(optax.tree.norm(head_grads)), rtol=1e-5)


def test_head_learning_rate_multiplier(classifier):
    _, params, grads = classifier
    cfg = optimizer_settings(schedule="constant", peak_lr=1e-3, head_lr_multiplier=10.0)
    tx, schedule = make_optimizer(cfg, 64, 100, params)
    new, _ = run_updates(tx, params, [grads])
    labels = flat(param_labels(params))
    step = {p: np.abs(np.asarray(a) - np.asarray(b)).max()
            for (p, a), b in zip(flat(params).items(), flat(new).values())}
    # Adam's first step moves each weight by lr·g/(|g|+ε) ≈ lr wherever the gradient is non-zero.
    for group, lr in (("head", 1e-2), ("backbone", 1e-3)):
        biggest = max(s for p, s in step.items() if labels[p] == group)
        np.testing.assert_allclose(biggest, lr, rtol=1e-3)
    assert float(schedule(0)) == pytest.approx(1e-3)


def test_presets_build_and_step():
    params = {"dense": {"kernel": jnp.ones((4, 4)), "bias": jnp.zeros(4)}}
    grads = jax.tree.map(jnp.ones_like, params)
    for name in OPTIMIZER_PRESETS:
        cfg = optimizer_settings(name)
        tx, schedule = make_optimizer(cfg, 64, 20_000)
        new, _ = run_updates(tx, params, [grads, grads])
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(new))
        assert float(schedule(cfg.warmup_steps)) > 0
    assert set(default_optimizer_config().head_param_prefixes) == set(HEAD_PARAM_PREFIXES)


def test_config_errors(classifier):
    _, params, _ = classifier
    cases = [
        (dict(name="sgd"), r"optimizer.name='sgd' is invalid: choose one of \('adamw',\)"),
        (dict(grad_accum_steps=0), "grad_accum_steps=0"),
        (dict(clip_norm=-1.0), r"optimizer.clip_norm=-1.0 is invalid: must be >= 0"),
        (dict(schedule="warmup_linear", peak_lr=-3e-4), r"optimizer.peak_lr=-0.0003 is invalid: must be pos"),
        (dict(schedule="constant", peak_lr=0.0), r"optimizer.peak_lr=0.0 is invalid: must be positive"),
        (dict(scale=-1.0), r"optimizer.scale=-1.0 is invalid: must be positive"),
        (dict(schedule="warmup_cosine", end_lr=-1e-5), r"optimizer.end_lr=-1e-05 is invalid: must be >= 0"),
        (dict(b2=1.0), r"optimizer.b2=1.0 is invalid: must lie in \[0, 1\)"),
        (dict(freeze_backbone=True, head_param_prefixes=("nope",)), "head_param_prefixes"),
    ]
    for overrides, match in cases:
        with pytest.raises(ValueError, match=match):
            make_optimizer(optimizer_settings(**overrides), 64, 100, params)
    with pytest.raises(ValueError, match="unknown optimizer config keys \\['lr'\\]"):
        default_optimizer_config(lr=1.0)
    with pytest.raises(ValueError, match="unknown optimizer preset"):
        default_optimizer_config("adafactor")
