"""GPT-2 small (124M) causal-LM pretraining on a TFDS corpus (needs internet for the first build).

    python train.py --config configs/gpt2_small_clm.py --workdir runs/gpt2 --config.mesh.fsdp=-1
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "gpt2_small_clm"
    c.num_train_steps = 100_000
    c.model.update(preset("gpt2_small", vocab_size=32_000, scan_layers=True, remat_policy="dots"))
    c.objective.name = "clm"
    c.data.source = "tfds:lm1b"
    c.data.seq_len = 1024
    c.data.batch_size = 256
    c.data.tokenizer.vocab_size = 32_000
    c.optimizer = default_optimizer_config("gpt3")
    c.eval.every_steps = 2000
    c.checkpoint.every_steps = 2000
    c.log_every_steps = 100
    return c
