"""Model FLOPs of a training step and the peak rate they are divided by: the one MFU accounting of
the planner (`jaxformer.plan`), the compile report (`jaxformer.compile`), the benchmarks (bench/)
and the trainer's own logs (`jaxformer.train.throughput`).

`model_flops`: the accounting of Kaplan et al. (2020) §2.1 and PaLM (Chowdhery et al. 2022,
App. B), as MaxText logs it::

    6 · Σ_p |p| · tokens(p)  +  Σ_attention 12 · B · T_q · T_k · H · Dh · (½ if causal)

i.e. 6N per token for every matmul weight: the ``kernel`` of each projection, and the token table
where it is also the output projection (tied LM / MLM head). Forward is ``2·N`` per token (a
multiply and an add per weight); backward is twice that (gradients with respect to activations and
to weights). Lookup tables (positions, token types, relative-position buckets, a token table used
only for lookup), biases and norm scales are not matmuls and are left out. Plus ``QKᵀ`` and ``AV``
of each attention layer, ``2·T_q·T_k·H·Dh`` each forward; a causal mask makes half of the score
matrix useless, so causal self-attention counts half (the work a fused kernel skips; the plain XLA
path still does it, which MFU then shows). Encoder parameters see the ``seq_len`` input tokens,
decoder parameters and the output projection the ``target_len`` target tokens, the pooler and
sequence-classifier heads one row each; an MoE FFN's experts k / E of their weights per token
(the active parameters; capacity slots left empty and dropped tokens are not subtracted), its
router in full. Padding counts as tokens: the step computes it. An MLM head
that reads only ``predictions`` gathered positions per row (BERT's ``max_predictions_per_seq``,
`jaxformer.objectives.mlm.max_predictions`) counts those rows, not ``seq_len``: its transform and
output projection run at `[B, P, D]` (as MaxText, the FLOPs the program computes; the one-hot
gather that selects them is not a model FLOP). `train_step_flops` reads ``predictions`` from a
training config, for the trainer's logs and the compile report's roofline alike.

`device_peak_flops`: the published dense bf16 rate of the device's chip (`topology.CHIPS`), or on a
host without one (a CPU) the float32 matmul rate measured here (`measure_matmul_peak`), so that MFU
is a ratio against a reference of the same machine.
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxformer.config import ModelConfig
from jaxformer.models.head_parts import PER_ROW_MODULES
from jaxformer.objectives.mlm import max_predictions
from jaxformer.parallel.topology import CHIPS, Chip

# jax's device_kind of each chip of `CHIPS` (jax._src.tpu_info.chip_version_from_device_kind names
# the TPUs; the GPUs' are the names CUDA reports, as in parallel/gpu_targets/*.txtpb).
DEVICE_KINDS = {"TPU v4": "v4", "TPU v5 lite": "v5e", "TPU v5e": "v5e", "TPU v5": "v5p",
                "TPU v5p": "v5p", "TPU v6 lite": "v6e", "TPU v6e": "v6e",
                "NVIDIA H100 80GB HBM3": "h100", "NVIDIA H200": "h200"}


def _expert_kernel(names: list[str], leaf) -> bool:
    """Whether a kernel is an MoE FFN's experts' `[E, …]` (`jaxformer.ops.moe`; a scanned stack
    adds the ``layers`` axis): ``ffn/{wi,wi_gate,wo}/kernel`` with the extra expert axis."""
    return (len(names) >= 3 and names[-3] == "ffn" and names[-2] in ("wi", "wi_gate", "wo")
            and len(leaf.shape) == 3 + ("layers" in names))


def model_flops(model_cfg: ModelConfig, params: Any, batch: int, seq_len: int,
                target_len: int, predictions: int = 0) -> dict:
    """Training FLOPs (forward + backward) of one step of ``batch`` rows by the formula in the
    module docstring; ``params`` is any tree with the model's parameter shapes (arrays or
    ShapeDtypeStructs); ``predictions``: the positions per row an MLM head reads (0: all
    ``seq_len``). Returns ``model_flops_per_step`` (= dense + attention),
    ``dense_flops_per_step``, ``attention_flops_per_step``, ``tokens_per_step`` and
    ``flops_per_token``."""
    m = model_cfg
    enc_dec = m.family == "encoder_decoder"
    src, tgt = batch * seq_len, batch * (target_len if enc_dec else seq_len)
    output_matmul = m.head in ("lm", "mlm")
    mlm_rows = batch * (predictions or seq_len) if m.head == "mlm" else None
    dense = 0
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        names = [str(getattr(k, "key", k)) for k in path]
        tied_output = names[0] == "token_embed" and m.tie_embeddings and output_matmul
        if names[-1] != "kernel" and not tied_output:
            continue
        encoder_side = names[0].startswith("encoder") or (
            enc_dec and "cross_attn" in names and names[-2] in ("key", "value"))
        uses = batch if names[0] in PER_ROW_MODULES else src if encoder_side else tgt
        if mlm_rows is not None and (tied_output or names[0] == "mlm_head"):
            uses = mlm_rows  # the MLM head's transform and output projection: `[B, P, D]`
        if names[1:2] == ["shared"]:  # ALBERT's cross-layer sharing: one block, num_layers uses
            uses *= m.num_layers
        active = 1.0
        if _expert_kernel(names, leaf):  # an MoE FFN: each token runs k of the E experts
            active = m.experts_per_token / m.num_experts
        dense += 6 * math.prod(leaf.shape) * uses * active
    hd = m.num_heads * m.head_dim
    if enc_dec:
        attn = 12 * batch * hd * (m.num_encoder_layers * seq_len ** 2
                                  + m.num_decoder_layers * (target_len ** 2 / 2
                                                            + target_len * seq_len))
    else:
        attn = 12 * batch * hd * m.num_layers * seq_len ** 2 * (0.5 if m.causal else 1.0)
    tokens = src + (tgt if enc_dec else 0)
    total = dense + attn
    return {"model_flops_per_step": total, "dense_flops_per_step": dense,
            "attention_flops_per_step": attn, "tokens_per_step": tokens,
            "flops_per_token": total / tokens}


def train_step_flops(settings: Any, params: Any) -> dict:
    """`model_flops` of the step of a run's `TrainSettings` ``settings``
    (`jaxformer.train.config`; ``data.batch_size`` rows of ``data.seq_len`` / ``data.target_len``;
    with objective ``mlm``, the head at its `max_predictions` positions; an image model's rows are
    its ``image_length`` tokens, patches and class token): the one count of the trainer's MFU logs
    and the compile report's roofline."""
    d, model_cfg = settings.data, settings.model
    predictions = (max_predictions(settings.objective_options, d.seq_len)
                   if settings.objective.name == "mlm" and model_cfg.head == "mlm" else 0)
    length = model_cfg.image_length or d.seq_len
    return model_flops(model_cfg, params, d.batch_size, length, d.target_len, predictions)


def measure_matmul_peak(n: int = 2048, dtype=jnp.float32, repeats: int = 10) -> dict[str, float]:
    """FLOP/s of a jitted ``[n, n] @ [n, n]`` (``2·n³`` FLOPs) on the default backend.

    The best of ``repeats`` calls (after a compiling one) is the peak (noise from other processes
    only slows calls down); the median is reported too."""
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.standard_normal((n, n)), dtype)
    b = jnp.asarray(rng.standard_normal((n, n)), dtype)
    f = jax.jit(jnp.dot)
    jax.block_until_ready(f(a, b))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(a, b))
        times.append(time.perf_counter() - t0)
    flops = 2.0 * n**3
    return {"n": n, "dtype": jnp.dtype(dtype).name, "peak_flops": flops / min(times),
            "median_flops": flops / float(np.median(times))}


def chip_of(device_kind: str) -> Chip | None:
    """The `CHIPS` entry of a jax ``device_kind`` ("TPU v5 lite", "NVIDIA H100 80GB HBM3"), or
    None for a device the table does not hold (a CPU, another GPU)."""
    key = DEVICE_KINDS.get(device_kind)
    return None if key is None else CHIPS[key]


def device_peak_flops(device: jax.Device | None = None, *, matmul_n: int = 512) -> dict:
    """The peak FLOP/s MFU divides by, for ``device`` (default: the first): ``peak_flops``, and
    ``source`` saying where it comes from — the chip's published dense bf16 rate, or (a device the
    chip table does not hold, e.g. a CPU) a float32 ``matmul_n``² matmul measured now."""
    device = device or jax.devices()[0]
    chip = chip_of(device.device_kind)
    if chip is not None:
        return {"peak_flops": chip.bf16_flops,
                "source": f"{chip.name} dense bf16 peak {chip.bf16_flops / 1e12:,.0f} TFLOP/s"}
    measured = measure_matmul_peak(matmul_n, jnp.float32, repeats=5)
    return {"peak_flops": measured["peak_flops"],
            "source": f"{device.device_kind}: float32 {matmul_n}² matmul measured at start-up, "
                      f"{measured['peak_flops'] / 1e12:.3f} TFLOP/s"}
