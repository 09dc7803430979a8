"""Mixtral-8x7B-shaped (46.7B, 12.9B active) causal-LM training, bfloat16 compute, experts split
over an expert mesh axis of 4 (2 experts a chip group; v5p:4x4x4 splits into axes of 4)
and everything else sharded over the remaining chips (FSDP); the
capacity path (factor 1.25, GShard's all-to-all dispatch: the dropless path's sort is per device,
refused on mesh.expert > 1). Sized for a TPU v5p-128 slice (64 chips):

    python -m jaxformer.cli.compile --config configs/mixtral_8x7b_clm.py --topology v5p:4x4x4

One compiled layer (``scan_layers``) and full rematerialisation.
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "mixtral_8x7b_clm"
    c.num_train_steps = 10_000
    c.model.update(preset("mixtral_8x7b_bf16", scan_layers=True, remat_policy="full",
                          moe_dropless=False, capacity_factor=1.25))
    c.objective.name = "clm"
    c.data.source = "tfds:lm1b"
    c.data.framing = "bos_eos"
    c.data.seq_len = 4096
    c.data.batch_size = 64
    c.data.tokenizer.vocab_size = 32_000
    c.mesh.data, c.mesh.fsdp, c.mesh.expert = 1, -1, 4
    c.optimizer = default_optimizer_config("gpt3", peak_lr=3e-4, end_lr=3e-5, warmup_steps=2000)
    c.eval.every_steps = 1000
    c.checkpoint.every_steps = 1000
    c.log_every_steps = 50
    return c
