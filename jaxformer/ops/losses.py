"""Cross-entropy over integer labels with label smoothing and z-loss; weighted sums for any objective.

Label smoothing (Vaswani et al. 2017, §5.4, citing Szegedy et al. 2016): the target distribution
puts 1−ε on the true class and ε/(|V|−1) on every other class — the convention of Mesh TensorFlow /
T5X and fairseq — and the loss is the cross entropy H(q, p) = −Σ_j q_j log p_j against it.
(Szegedy et al. and `optax.smooth_labels` spread ε/|V| over *all* classes, the true one included:
their ε equals ours times |V|/(|V|−1).) The z-loss (Chowdhery et al. 2022, PaLM §5) adds
``z_loss · log²Z`` with Z the softmax normaliser, keeping logits from drifting.

`blockwise_cross_entropy` is the same loss from the head's inputs ``h`` `[N, D]` and the output
projection ``w`` `[V, D]` without a `[N, V]` logits array: the vocabulary is walked in blocks of
columns, keeping an online log-sum-exp (Milakov & Gimelshein 2018), and the backward pass
recomputes each block's logits (the memory-efficient cross-entropy of Wijmans et al. 2024, "Cut
your losses in large-vocabulary language models", in plain `lax.scan` form).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxformer.ops.varying import grad_like, vary_like

Array = jnp.ndarray


def cross_entropy_with_integer_labels(logits: Array, labels: Array, *, label_smoothing: float = 0.0,
                                      z_loss: float = 0.0, num_classes: int | None = None) -> Array:
    """Per-position loss.

    Args:
      logits: `[..., vocab]` (any float dtype; computed in float32, or float64 for float64).
      labels: `[...]` ints in ``[0, vocab)``.
      label_smoothing: ε in [0, 1).
      z_loss: coefficient of log²Z (0 disables).
      num_classes: the real classes C when the last axis is padded past them (a padded vocabulary,
        `jaxformer.ops.heads.mask_padded_vocab`, whose columns ``>= C`` have probability 0):
        labels must be in ``[0, C)`` and smoothing spreads ε over these C only; None = vocab.

    Returns:
      `[...]` float32 (float64 for float64 logits) losses; NaN where a label is outside
      ``[0, C)`` (−1 included, which an index would wrap to the last class).
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
    vocab = logits.shape[-1] if num_classes is None else num_classes
    log_z = jax.nn.logsumexp(logits, axis=-1)
    # log p_j = logits_j − log Z is never materialised as a `[..., vocab]` array: the gradient then
    # stays one fused softmax − one-hot (≈1.7x faster LM head + loss on XLA:CPU)
    logit_true = jnp.take_along_axis(logits, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    logp_true = jnp.where((labels >= 0) & (labels < vocab), logit_true - log_z, jnp.nan)
    if label_smoothing > 0.0:
        off = label_smoothing / (vocab - 1)
        real = logits if vocab == logits.shape[-1] else jnp.where(  # the padding columns left out
            jnp.arange(logits.shape[-1]) < vocab, logits, 0.0)
        sum_logp = jnp.sum(real, axis=-1) - vocab * log_z
        loss = -(1.0 - label_smoothing) * logp_true - off * (sum_logp - logp_true)
    else:
        loss = -logp_true
    if z_loss > 0.0:
        loss = loss + z_loss * jnp.square(log_z)
    return loss


def weighted_cross_entropy(logits: Array, labels: Array, weights: Array | None = None, *,
                           label_smoothing: float = 0.0, z_loss: float = 0.0,
                           num_classes: int | None = None) -> tuple[Array, Array]:
    """Sum of per-position losses times ``weights`` and the sum of weights.

    Returning the two sums (not their ratio) lets callers normalise over a global batch, across
    gradient-accumulation micro-batches or hosts, exactly. ``weights`` `[...]`, the shape of
    ``labels`` (e.g. 1 on masked positions for MLM, 0 on padding), defaults to all ones. Positions
    of weight 0 contribute exactly 0, whatever their label (an ignore index such as −100 included);
    a weighted label outside the vocabulary (``[0, num_classes)`` when given: a padded vocabulary,
    see `cross_entropy_with_integer_labels`) makes the sum NaN.
    """
    loss = cross_entropy_with_integer_labels(logits, labels, label_smoothing=label_smoothing,
                                             z_loss=z_loss, num_classes=num_classes)
    w = _weights(weights, labels, loss.dtype)
    return jnp.sum(jnp.where(w != 0, loss * w, 0.0)), jnp.sum(w)


def blockwise_cross_entropy(h: Array, w: Array, bias: Array | None, labels: Array, *,
                            block_size: int, label_smoothing: float = 0.0, z_loss: float = 0.0,
                            num_classes: int | None = None) -> tuple[Array, Array]:
    """`cross_entropy_with_integer_labels` of the logits ``h · wᵀ + bias`` and their argmax, walking
    the vocabulary ``block_size`` columns at a time: no `[..., V]` array is formed, forward or
    backward (a `jax.custom_vjp` whose backward recomputes each block's logits).

    Each block's logits are computed as `jaxformer.ops.embedding.attend` computes the full ones
    (``w`` cast to ``h.dtype``, the product in ``h.dtype``, the bias added, then float32), so the
    loss is today's up to the order of the float32 sums.

    Args:
      h: `[..., D]` the head's input (the tied projection's input: after the MLM transform and
        T5's d_model^-0.5 rescale).
      w: `[V', D]` the output projection (the token table when tied, the kernel's transpose if not).
      bias: `[V']` or None.
      labels: `[...]` ints in ``[0, C)``.
      block_size: the most columns a block holds: the V' columns are cut into ⌈V'/block_size⌉
        equal blocks (`_block_width`), the last padded with zero rows, masked out.
      label_smoothing, z_loss: as in `cross_entropy_with_integer_labels`.
      num_classes: the real classes C (columns ``>= C`` are a padded vocabulary: probability 0,
        as `jaxformer.ops.heads.mask_padded_vocab` makes them); None = V'.

    Returns:
      (`[...]` float32 losses, NaN where a label is outside ``[0, C)``; `[...]` int32 argmax of the
      logits over the C real classes, the first on ties).
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if block_size < 1:
        raise ValueError(f"block_size must be a positive number of vocabulary columns, got {block_size}")
    batch_shape = labels.shape
    h_NxD = h.reshape(-1, h.shape[-1])
    vocab = w.shape[0] if num_classes is None else num_classes
    bias_V = jnp.zeros((w.shape[0],), h.dtype) if bias is None else bias
    loss, pred = _blockwise_ce(h_NxD, w, bias_V, labels.reshape(-1).astype(jnp.int32),
                               (_block_width(w.shape[0], block_size), float(label_smoothing),
                                float(z_loss), vocab))
    return loss.reshape(batch_shape), pred.reshape(batch_shape)


def _block_width(columns: int, block_size: int) -> int:
    """Columns per block: ``columns`` cut into ⌈columns/block_size⌉ equal blocks, each a multiple of
    128 (a TPU lane tile) when wider than 128, so that padding stays under one tile a block
    (GPT-2's 50,304 columns at 8,192: 7 blocks of 7,296, 768 padding rows, not 7,040)."""
    n = -(-columns // block_size)
    width = -(-columns // n)
    return -(-width // 128) * 128 if width > 128 else width


def _blocks(w: Array, bias: Array, block: int, dtype) -> tuple[Array, Array]:
    """``w`` `[V', D]` and ``bias`` `[V']` cast to the compute ``dtype`` (as `attend` casts the
    table; cast first, the padded copy is in that dtype) as `[n, block, D]` and `[n, block]`,
    zero-padded."""
    w, bias = w.astype(dtype), bias.astype(dtype)
    n = -(-w.shape[0] // block)
    pad = n * block - w.shape[0]
    w = jnp.pad(w, ((0, pad), (0, 0))) if pad else w
    bias = jnp.pad(bias, (0, pad)) if pad else bias
    return w.reshape(n, block, w.shape[1]), bias.reshape(n, block)


def _block_logits(h_NxD: Array, w_KxD: Array, b_K: Array, start: Array, vocab: int
                  ) -> tuple[Array, Array]:
    """(float32 `[N, K]` logits of one block (``w_KxD``, ``b_K`` in ``h``'s dtype) with the columns
    ``>= vocab`` at −∞, their column ids `[K]`)."""
    logits = jnp.einsum("nd,kd->nk", h_NxD, w_KxD)
    logits = (logits + b_K).astype(jnp.promote_types(h_NxD.dtype, jnp.float32))
    cols = start + jnp.arange(w_KxD.shape[0])
    return jnp.where(cols < vocab, logits, -jnp.inf), cols


def _ce_forward(h_NxD, w, bias, labels, static):
    """One pass over the blocks: (losses `[N]`, argmax `[N]`, log Z `[N]`)."""
    block, eps, z_loss, vocab = static
    w_blocks, b_blocks = _blocks(w, bias, block, h_NxD.dtype)
    n = h_NxD.shape[0]
    dtype = jnp.promote_types(h_NxD.dtype, jnp.float32)

    def body(carry, xs):
        m, s, true, total, best, arg = carry
        i, w_KxD, b_K = xs
        logits, cols = _block_logits(h_NxD, w_KxD, b_K, i * block, vocab)
        m_new = jnp.maximum(m, jnp.max(logits, axis=1))
        s = s * jnp.exp(m - m_new) + jnp.sum(jnp.exp(logits - m_new[:, None]), axis=1)
        true = true + jnp.sum(jnp.where(cols == labels[:, None], logits, 0.0), axis=1)
        total = total + jnp.sum(jnp.where(cols < vocab, logits, 0.0), axis=1)
        block_best = jnp.max(logits, axis=1)
        better = block_best > best  # strict: the first maximum wins, as jnp.argmax
        arg = jnp.where(better, (i * block + jnp.argmax(logits, axis=1)).astype(jnp.int32), arg)
        return (m_new, s, true, total, jnp.maximum(best, block_best), arg), None

    low = jnp.full((n,), -jnp.inf, dtype)
    zeros = jnp.zeros((n,), dtype)
    init = (low, zeros, zeros, zeros, low, jnp.zeros((n,), jnp.int32))
    init = vary_like(init, h_NxD, w, bias, labels)  # under shard_map: the body's outputs vary
    (m, s, true, total, _, arg), _ = jax.lax.scan(
        body, init, (jnp.arange(w_blocks.shape[0], dtype=jnp.int32), w_blocks, b_blocks))
    log_z = m + jnp.log(s)
    logp_true = jnp.where((labels >= 0) & (labels < vocab), true - log_z, jnp.nan)
    if eps > 0.0:
        off = eps / (vocab - 1)
        loss = -(1.0 - eps) * logp_true - off * (total - vocab * log_z - logp_true)
    else:
        loss = -logp_true
    if z_loss > 0.0:
        loss = loss + z_loss * jnp.square(log_z)
    return loss, arg, log_z


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _blockwise_ce(h_NxD, w, bias, labels, static):
    loss, arg, _ = _ce_forward(h_NxD, w, bias, labels, static)
    return loss, arg


def _blockwise_ce_fwd(h_NxD, w, bias, labels, static):
    loss, arg, log_z = _ce_forward(h_NxD, w, bias, labels, static)
    return (loss, arg), (h_NxD, w, bias, labels, log_z)


def _blockwise_ce_bwd(static, res, cotangents):
    """∂loss/∂logit_j = p_j (1 + 2 z log Z) − (1 − ε − ε') [j = label] − ε' [j < C], ε' = ε/(C−1),
    recomputed block by block; ``h``'s gradient summed over the blocks in float32."""
    block, eps, z_loss, vocab = static
    h_NxD, w, bias, labels, log_z = res
    g = cotangents[0].astype(log_z.dtype)
    off = eps / (vocab - 1) if eps > 0.0 else 0.0
    scale = g * (1.0 + 2.0 * z_loss * log_z)
    w_blocks, b_blocks = _blocks(w, bias, block, h_NxD.dtype)

    def body(dh, xs):
        i, w_KxD, b_K = xs
        logits, cols = _block_logits(h_NxD, w_KxD, b_K, i * block, vocab)
        p = jnp.exp(logits - log_z[:, None])
        d = (scale[:, None] * p - (g * (1.0 - eps - off))[:, None] * (cols == labels[:, None])
             - (g * off)[:, None] * (cols < vocab))
        d_NxK = d.astype(h_NxD.dtype)  # as the full logits' gradient, cast back to h's dtype
        dh = dh + jnp.einsum("nk,kd->nd", d_NxK, w_KxD, preferred_element_type=dh.dtype)
        dw_KxD = jnp.einsum("nk,nd->kd", d_NxK, h_NxD).astype(w.dtype)
        return dh, (dw_KxD, jnp.sum(d_NxK, axis=0).astype(bias.dtype))

    dh0 = vary_like(jnp.zeros(h_NxD.shape, log_z.dtype), h_NxD, w, bias, labels, log_z, g)
    dh, (dw, db) = jax.lax.scan(body, dh0,
                                (jnp.arange(w_blocks.shape[0], dtype=jnp.int32), w_blocks, b_blocks))
    v = w.shape[0]
    return (grad_like(dh, h_NxD), grad_like(dw.reshape(-1, w.shape[1])[:v], w),
            grad_like(db.reshape(-1)[:v], bias), None)


_blockwise_ce.defvjp(_blockwise_ce_fwd, _blockwise_ce_bwd)


def weighted_blockwise_cross_entropy(h: Array, w: Array, bias: Array | None, labels: Array,
                                     weights: Array | None = None, *, block_size: int,
                                     label_smoothing: float = 0.0, z_loss: float = 0.0,
                                     num_classes: int | None = None
                                     ) -> tuple[Array, Array, Array]:
    """`weighted_cross_entropy` and `weighted_accuracy`'s correct sum in one `blockwise_cross_entropy`
    pass: (loss sum, correct sum, weight sum)."""
    loss, pred = blockwise_cross_entropy(h, w, bias, labels, block_size=block_size,
                                         label_smoothing=label_smoothing, z_loss=z_loss,
                                         num_classes=num_classes)
    wt = _weights(weights, labels, loss.dtype)
    correct = jnp.sum((pred == labels).astype(jnp.float32) * wt.astype(jnp.float32))
    return jnp.sum(jnp.where(wt != 0, loss * wt, 0.0)), correct, jnp.sum(wt)


def weighted_accuracy(logits: Array, labels: Array, weights: Array | None = None) -> tuple[Array, Array]:
    """Sum of correct argmax predictions times ``weights`` and the sum of weights."""
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    w = _weights(weights, labels, jnp.float32)
    return jnp.sum(correct * w), jnp.sum(w)


def _weights(weights: Array | None, labels: Array, dtype) -> Array:
    """``weights`` as ``dtype`` (all ones when None); their shape must be the labels'."""
    if weights is None:
        return jnp.ones(labels.shape, dtype)
    if tuple(weights.shape) != tuple(labels.shape):
        raise ValueError(f"weights {tuple(weights.shape)} must have the labels' shape "
                         f"{tuple(labels.shape)} (a broadcast weight would be summed fewer times "
                         "than the losses)")
    return weights.astype(dtype)


def soft_target_kl(student_logits: Array, teacher_logits: Array, temperature: float) -> Array:
    """Per-position KL(softmax(teacher/T) ‖ softmax(student/T)) (Hinton et al. 2015, §2; DistilBERT's
    L_ce, Sanh et al. 2019, §3), not yet multiplied by T².

    Args:
      student_logits, teacher_logits: `[..., classes]` (computed in float32, or float64 for float64).
      temperature: T > 0.

    Returns:
      `[...]` Σ_j p_j (log p_j − log q_j), p the teacher's and q the student's softened
      distributions; exactly 0 where the two logits are equal.
    """
    dtype = jnp.promote_types(student_logits.dtype, jnp.float32)
    log_q = jax.nn.log_softmax(student_logits.astype(dtype) / temperature, axis=-1)
    log_p = jax.nn.log_softmax(teacher_logits.astype(dtype) / temperature, axis=-1)
    p = jnp.exp(log_p)
    return jnp.sum(jnp.where(p > 0, p * (log_p - log_q), 0.0), axis=-1)


def cosine_distance(a: Array, b: Array, eps: float = 1e-8) -> Array:
    """Per-position 1 − cos(a, b) over the last axis, `[..., D]` → `[...]` (DistilBERT's L_cos,
    PyTorch's ``CosineEmbeddingLoss`` with target 1: the norms' product clipped at ``eps``)."""
    dtype = jnp.promote_types(a.dtype, jnp.float32)
    a, b = a.astype(dtype), b.astype(dtype)
    norms = jnp.linalg.norm(a, axis=-1) * jnp.linalg.norm(b, axis=-1)
    return 1.0 - jnp.sum(a * b, axis=-1) / jnp.maximum(norms, eps)
