"""The optimized HLO of a jitted AdamW train step (forward + backward + update) of
`jaxformer.models.build_model` (the pure ``init`` / ``apply`` over the parameter dict), for tiny
GPT (scanned, "dots" remat), BERT and T5, dropout off and on, normalised (instruction names,
metadata and source locations stripped), one file per case.

Two trees compile the same program when their files are equal: run it in each tree and diff.

    PYTHONPATH=/path/to/old_tree python bench/step_hlo.py /tmp/hlo_old
    PYTHONPATH=/path/to/new_tree python bench/step_hlo.py /tmp/hlo_new
    diff -r /tmp/hlo_old /tmp/hlo_new

(Issue 40: the NNX-only tree against the former Linen modules gave identical files with dropout
off; with dropout on the dropout keys differ, hence the masks' random-bit programs. Issue 61: the
pure `Model` against the NNX model it replaced gave identical files, dropout off and on.)
"""

from __future__ import annotations

import os
import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxformer.config import ModelConfig
from jaxformer.host import skip_absent_tpu
from jaxformer.models import build_model
from jaxformer.models.presets import preset

skip_absent_tpu()  # no failed libtpu start-up on a CPU host (jaxformer.host)

TINY = dict(vocab_size=256, d_model=64, num_heads=4, d_ff=128, num_layers=2, max_len=64)
CASES = [("gpt_tiny", dict(scan_layers=True, remat_policy="dots")), ("bert_tiny", {}),
         ("t5_tiny", {})]


def normalised(compiled) -> str:
    """The compiled module's text without what differs between equal programs: instruction and
    computation names, metadata, source-location tables."""
    return normalise(compiled.as_text())


def normalise(text: str) -> str:
    """`normalised` of an optimized HLO module's text (``compiled.as_text()``, an XLA dump)."""
    text = text.split("\nENTRY", 1)
    text = re.sub(r"\n(FileNames|FunctionNames|FileLocations|StackFrames)\n.*?(?=\n\n|\n%|\Z)",
                  "\n", "\nENTRY".join(text), flags=re.S)
    text = re.sub(r"%[\w.\-]+|[\w.]+: (?=[fsu]\d+\[)|, (metadata=\{[^}]*\}|stack_frame_id=\d+)",
                  "", text)
    return "\n".join(text.splitlines()[1:])


def step_program(fam: str, extra: dict, dropout: float) -> str:
    cfg = ModelConfig.from_dict(dict(preset(fam, **TINY, **extra), dropout_rate=dropout,
                                     attention_dropout_rate=0.0, ffn_dropout_rate=0.0))
    model = build_model(cfg)
    toks = jnp.asarray(np.random.default_rng(0).integers(5, 256, (4, 32)), jnp.int32)
    args = (toks, toks) if cfg.family == "encoder_decoder" else (toks,)
    params = model.init(jax.random.key(0))
    tx = optax.adamw(1e-4, weight_decay=0.01)

    def step(p, s, key):
        def loss(p):
            o = model.apply(p, *args, rng=None if dropout == 0.0 else key)
            o = o[0] if isinstance(o, tuple) else o
            return jnp.mean(jnp.sin(o.astype(jnp.float32)))

        value, grads = jax.value_and_grad(loss)(p)
        updates, s = tx.update(grads, s, p)
        return optax.apply_updates(p, updates), s, value

    lowered = jax.jit(step, donate_argnums=(0, 1)).lower(params, tx.init(params), jax.random.key(1))
    return normalised(lowered.compile())


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    for fam, extra in CASES:
        for dropout in (0.0, 0.1):
            text = step_program(fam, extra, dropout)
            name = f"{fam}_drop{dropout}"
            with open(f"{out}/{name}.hlo", "w") as f:
                f.write(text)
            print(name, len(text.splitlines()), "lines")


if __name__ == "__main__":
    main(sys.argv[1])
