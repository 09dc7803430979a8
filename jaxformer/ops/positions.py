"""Position information: sinusoidal, learned-table lookup, rotary (RoPE, with its long-context
frequency scalings), T5 relative buckets and ALiBi's linear biases.

All functions are pure; learned tables are passed in as arrays.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from jaxformer.ops.embedding import take_rows

Array = jnp.ndarray


def sinusoidal(positions: Array, d_model: int, *, max_timescale: float = 10_000.0,
               dtype=jnp.float32) -> Array:
    """Sinusoidal encodings of Vaswani et al. (2017), §3.5, interleaved exactly as the paper writes:

        PE(pos, 2i)   = sin(pos / max_timescale^(2i / d_model))
        PE(pos, 2i+1) = cos(pos / max_timescale^(2i / d_model))

    Args:
      positions: int or float array of any shape ``S`` (e.g. `[batch, length]`).
      d_model: encoding width (even).

    Returns:
      `S + [d_model]` in ``dtype``.
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal encodings need an even d_model, got {d_model}")
    # at least float32, float64 when the positions or the requested dtype are (under x64)
    ct = jnp.promote_types(jnp.promote_types(positions.dtype, jnp.float32), dtype)
    i2 = jnp.arange(0, d_model, 2, dtype=ct)  # the 2i of the formula
    inv = jnp.exp(-math.log(max_timescale) * i2 / d_model)
    angles = positions.astype(ct)[..., None] * inv  # S + [d/2]
    pe = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # S + [d/2, 2]
    return pe.reshape(*positions.shape, d_model).astype(dtype)


def sinusoidal_table(length: int, d_model: int, **kwargs) -> Array:
    """`[length, d_model]` table of `sinusoidal` for positions ``0 .. length-1``."""
    return sinusoidal(jnp.arange(length), d_model, **kwargs)


def lookup_positions(table: Array, positions: Array) -> Array:
    """Learned absolute positions: rows of `table` `[max_len, d]` at ``positions`` `S` → `S + [d]`.

    Positions outside ``[0, max_len)`` give NaN rather than silently reusing a row.
    """
    return take_rows(table, positions)


# RoPE frequency scalings for contexts longer than pre-training's (`RopeScaling.kind`).
ROPE_SCALINGS = ("none", "linear", "dynamic", "llama3", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """How RoPE's frequencies are stretched beyond the pre-training context ``original_max_len``.

    * ``linear`` (position interpolation, Chen et al. 2023): every frequency / ``factor``.
    * ``dynamic`` (NTK-aware, bloc97 / emozilla 2023, as HF's "dynamic"): for a call whose longest
      position is ``n > original_max_len``, the base ``theta`` becomes
      ``theta · (factor · n / original_max_len − (factor − 1))^(dim / (dim − 2))``; shorter calls
      are unscaled. Keys cached by an earlier call keep the frequencies they were rotated with.
    * ``llama3`` (Meta's Llama 3.1 recipe): wavelengths above ``original_max_len / low_freq_factor``
      / ``factor``, below ``original_max_len / high_freq_factor`` unchanged, a linear blend in
      ``original_max_len / wavelength`` between.
    * ``yarn`` (Peng et al. 2023, "YaRN", §3.2 eq. 18–20): frequencies that turn fewer than
      ``beta_slow`` times over ``original_max_len`` are interpolated (/ ``factor``), more than
      ``beta_fast`` times kept, a linear ramp over the dimensions between (bounds floored /
      ceiled); cos and sin are multiplied by ``attention_factor`` (§3.4's √(1/t), default
      ``0.1 ln(factor) + 1``), i.e. the attention logits by its square.
    """

    kind: str = "none"
    factor: float = 1.0
    original_max_len: int | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None

    @property
    def cos_sin_scale(self) -> float:
        """The factor on cos and sin (YaRN's attention temperature; 1 otherwise)."""
        if self.kind != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0


def rope_frequencies(dim: int, *, theta: float = 10_000.0, scaling: RopeScaling | None = None,
                     dtype=jnp.float32, seq_len: int | Array | None = None) -> Array:
    """RoPE's angular frequencies ``theta^(-2i/dim)``, ``i < dim/2`` (Su et al. 2021, eq. 15), with
    ``scaling`` applied (`RopeScaling`; ``seq_len``, the call's longest position + 1, for
    "dynamic"): `[dim // 2]` in ``dtype``."""
    half = dim // 2
    s = scaling or RopeScaling()
    if s.kind == "dynamic" and seq_len is not None:
        n = jnp.maximum(jnp.asarray(seq_len, dtype), s.original_max_len)
        theta = theta * (s.factor * n / s.original_max_len - (s.factor - 1)) ** (dim / (dim - 2))
    inv = theta ** (-jnp.arange(half, dtype=dtype) * 2.0 / dim)
    if s.kind in ("none", "dynamic"):
        return inv
    if s.kind == "linear":
        return inv / s.factor
    if s.kind == "llama3":
        wavelen = 2 * math.pi / inv
        smooth = (s.original_max_len / wavelen - s.low_freq_factor) / (
            s.high_freq_factor - s.low_freq_factor)
        blended = (1 - smooth) * inv / s.factor + smooth * inv
        low_wavelen = s.original_max_len / s.low_freq_factor
        high_wavelen = s.original_max_len / s.high_freq_factor
        return jnp.where(wavelen > low_wavelen, inv / s.factor,
                         jnp.where(wavelen < high_wavelen, inv, blended))
    if s.kind == "yarn":
        def dim_of(rotations):  # the dimension turning ``rotations`` times over the context
            return dim * math.log(s.original_max_len / (rotations * 2 * math.pi)) / (
                2 * math.log(theta))
        low = max(math.floor(dim_of(s.beta_fast)), 0)
        high = min(math.ceil(dim_of(s.beta_slow)), dim - 1)
        high = high + 0.001 if high == low else high
        ramp = jnp.clip((jnp.arange(half, dtype=dtype) - low) / (high - low), 0, 1)
        return inv / s.factor * ramp + inv * (1 - ramp)
    raise ValueError(f"RopeScaling.kind={s.kind!r} is invalid: choose one of {ROPE_SCALINGS}")


def apply_rope(x: Array, positions: Array, *, theta: float = 10_000.0,
               rotary_dim: int | None = None, scaling: RopeScaling | None = None) -> Array:
    """Rotary position embedding (Su et al. 2021, "RoFormer", eq. 34), half-split layout.

    Pairs feature ``i`` with feature ``i + rotary_dim/2`` and rotates each pair by
    ``pos · theta^(-2i/rotary_dim)``, so ⟨RoPE(q, m), RoPE(k, n)⟩ depends on m − n only;
    ``scaling`` stretches the frequencies (`rope_frequencies`) and may scale cos and sin.

    Args:
      x: `[batch, length, heads, head_dim]`.
      positions: `[batch, length]` ints (either axis may be 1 to broadcast).
      theta: base wavelength.
      rotary_dim: number of leading features rotated (even); default ``head_dim``.
      scaling: long-context frequency scaling (`RopeScaling`); default none.

    Returns:
      same shape and dtype as ``x``.
    """
    d = x.shape[-1] if rotary_dim is None else rotary_dim
    if d % 2 or not 0 < d <= x.shape[-1]:
        raise ValueError(f"RoPE needs an even rotary dimension in (0, head_dim={x.shape[-1]}], "
                         f"got {d}")
    if x.ndim != 4 or jnp.ndim(positions) != 2 or any(
            p not in (1, n) for p, n in zip(jnp.shape(positions), x.shape[:2])):
        raise ValueError(f"apply_rope takes x [batch, length, heads, head_dim] and positions "
                         f"[batch, length]; got x {tuple(x.shape)}, positions "
                         f"{tuple(positions.shape)}")
    half = d // 2
    ct = jnp.promote_types(x.dtype, jnp.float32)  # rotate in float32 (float64 for float64 x)
    seq_len = jnp.max(positions) + 1 if scaling is not None and scaling.kind == "dynamic" else None
    inv = rope_frequencies(d, theta=theta, scaling=scaling, dtype=ct, seq_len=seq_len)
    ang = positions.astype(ct)[..., None, None] * inv  # [b, l, 1, half]
    sin, cos = jnp.sin(ang), jnp.cos(ang)
    if scaling is not None and scaling.cos_sin_scale != 1.0:
        sin, cos = sin * scaling.cos_sin_scale, cos * scaling.cos_sin_scale
    xr, rest = x[..., :d].astype(ct), x[..., d:]
    x1, x2 = xr[..., :half], xr[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
    return jnp.concatenate([out, rest], axis=-1) if rest.shape[-1] else out


def relative_position_bucket(relative_position: Array, *, bidirectional: bool = True,
                             num_buckets: int = 32, max_distance: int = 128) -> Array:
    """T5 relative position buckets (Raffel et al. 2020, §2.1; the Mesh-TF implementation).

    ``relative_position = key_pos - query_pos``. Bidirectional: half the buckets are for keys
    before the query, half for keys after. Within a direction's ``n`` buckets (all ``num_buckets``
    when ``bidirectional`` is False, where future positions map to bucket 0), the first ``n/2``
    are exact distances ``0 .. n/2-1`` and the rest grow logarithmically up to ``max_distance``,
    beyond which distances share the last bucket.

    Returns:
      int32 buckets in ``[0, num_buckets)``, same shape as the input.
    """
    n = -relative_position
    ret = jnp.zeros_like(n)
    if bidirectional:
        num_buckets //= 2
        ret = ret + (n < 0).astype(jnp.int32) * num_buckets
        n = jnp.abs(n)
    else:
        n = jnp.maximum(n, 0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    val_if_large = max_exact + (
        jnp.log(jnp.maximum(n, 1).astype(jnp.float32) / max_exact)
        / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).astype(jnp.int32)
    val_if_large = jnp.minimum(val_if_large, num_buckets - 1)
    return (ret + jnp.where(is_small, n, val_if_large)).astype(jnp.int32)


def relative_position_bias(table: Array, q_positions: Array, kv_positions: Array, *,
                           bidirectional: bool = True, max_distance: int = 128) -> Array:
    """Additive attention bias from a learned bucket table.

    Args:
      table: `[num_buckets, heads]`.
      q_positions: `[batch, q_len]` (or `[q_len]`) ints.
      kv_positions: `[batch, kv_len]` (or `[kv_len]`) ints.

    Returns:
      `[batch, heads, q_len, kv_len]` (batch is 1 for 1-D positions), dtype of ``table``.
    """
    if q_positions.ndim == 1:
        q_positions, kv_positions = q_positions[None], kv_positions[None]
    rel = kv_positions[:, None, :] - q_positions[:, :, None]
    buckets = relative_position_bucket(rel, bidirectional=bidirectional,
                                       num_buckets=table.shape[0], max_distance=max_distance)
    return jnp.transpose(table[buckets], (0, 3, 1, 2))


def alibi_slopes(num_heads: int, dtype=jnp.float32) -> Array:
    """ALiBi's per-head slopes ``m_h`` (Press et al. 2022, "Train Short, Test Long", §3): `[heads]`.

    For ``n`` heads, ``n`` a power of two, the geometric sequence that starts at ``2^(-8/n)`` and
    has that ratio: ``m_h = 2^(-8h/n)``, ``h = 1..n`` (8 heads: 1/2, 1/4, …, 1/256). Otherwise,
    with ``c`` the largest power of two below ``n``: the ``c`` slopes of ``c`` heads, then the
    odd-numbered slopes ``2^(-8h/(2c))``, ``h = 1, 3, 5, …``, of ``2c`` heads for the remaining
    ``n - c`` heads — the rule of the authors' code (``get_slopes``, ofirpress/
    attention_with_linear_biases) that BLOOM uses (HF ``_get_alibi_slopes``).
    """
    if not isinstance(num_heads, int) or num_heads <= 0:
        raise ValueError(f"ALiBi needs a positive number of heads, got {num_heads!r}")
    c = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = [2.0 ** (-8.0 * h / c) for h in range(1, c + 1)]
    slopes += [2.0 ** (-8.0 * h / (2 * c)) for h in range(1, 2 * (num_heads - c), 2)]
    return jnp.asarray(slopes, dtype)


def alibi_bias(q_positions: Array, kv_positions: Array, num_heads: int, *,
               bidirectional: bool = False, dtype=jnp.float32) -> Array:
    """ALiBi's additive attention bias (Press et al. 2022, §3): no parameters, no position embedding.

    Causal: ``bias[b, h, i, j] = −m_h · (q_i − k_j)`` for query position ``q_i`` and key position
    ``k_j`` (slopes ``m_h``: `alibi_slopes`); keys after the query (``k_j > q_i``) get a positive
    value, which the causal mask hides. Bidirectional (an encoder; the paper is causal only):
    ``−m_h · |q_i − k_j|``, the symmetric form MosaicBERT uses (Portes et al. 2023, "MosaicBERT:
    A Bidirectional Encoder Optimized for Fast Pretraining").
    Positions, not indices: packed rows restarting per segment and decoding (query at its absolute
    position, each cache slot at its own) get the distances of their tokens.

    Args:
      q_positions: `[batch, q_len]` (or `[q_len]`) ints.
      kv_positions: `[batch, kv_len]` (or `[kv_len]`) ints.
      num_heads: query heads ``H``.

    Returns:
      `[batch, heads, q_len, kv_len]` (batch is 1 for 1-D positions) in ``dtype``.
    """
    if q_positions.ndim == 1:
        q_positions, kv_positions = q_positions[None], kv_positions[None]
    distance_BxLxS = (q_positions[:, :, None] - kv_positions[:, None, :]).astype(dtype)
    if bidirectional:
        distance_BxLxS = jnp.abs(distance_BxLxS)
    return -alibi_slopes(num_heads, dtype)[None, :, None, None] * distance_BxLxS[:, None]
