"""Llama-2-7B-shaped (6.7B) causal-LM training, bfloat16 compute, sharded over every chip (FSDP);
continued pretraining of a Llama 2 checkpoint with ``--config.init_from=path/to/Llama-2-7b-hf``
(its tokenizer.model becomes the run's), or from scratch. Sized for a TPU v5p-128 slice:

    python -m jaxformer.cli.compile --config configs/llama2_7b_clm.py --topology v5p:4x4x4
    python train.py --config configs/llama2_7b_clm.py --workdir runs/llama2_7b

One compiled layer (``scan_layers``) and full rematerialisation: 8.5 GiB of a v5p chip's 88.5 GiB
at batch 64 × 4096 on 64 chips (``jaxformer.compile``, docs/huggingface.md).
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "llama2_7b_clm"
    c.num_train_steps = 10_000
    c.model.update(preset("llama2_7b_bf16", scan_layers=True, remat_policy="full"))
    c.objective.name = "clm"
    c.data.source = "tfds:lm1b"
    c.data.framing = "bos_eos"
    c.data.seq_len = 4096
    c.data.batch_size = 64
    c.data.tokenizer.vocab_size = 32_000
    c.mesh.data, c.mesh.fsdp = 1, -1  # every chip on fsdp
    c.optimizer = default_optimizer_config("gpt3", peak_lr=3e-4, end_lr=3e-5, warmup_steps=2000)
    c.eval.every_steps = 1000
    c.checkpoint.every_steps = 1000
    c.log_every_steps = 50
    return c
