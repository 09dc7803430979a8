"""T5-small (v1.0, 60.5M) span-corruption pretraining on C4 (Raffel et al. 2020 settings).

    python train.py --config configs/t5_small_span.py --workdir runs/t5_small --config.mesh.fsdp=-1
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "t5_small_span"
    c.num_train_steps = 524_288
    c.model.update(preset("t5_small", scan_layers=True))
    c.objective.name = "span_corruption"
    c.objective.noise_density = 0.15
    c.objective.mean_span_length = 3.0
    c.data.source = "tfds:c4/en"
    c.data.seq_len = 512
    c.data.target_len = 114
    c.data.batch_size = 128
    c.data.long_examples = "split"
    c.data.tokenizer.vocab_size = 32_128
    c.data.tokenizer.num_sentinels = 100
    # T5's inverse square root schedule: 0.01 for 10k steps, then 1/sqrt(step).
    c.optimizer = default_optimizer_config(schedule="warmup_rsqrt", peak_lr=0.01, warmup_steps=10_000,
                                           b2=0.999, eps=1e-8, clip_norm=1.0)
    c.eval.every_steps = 5000
    c.checkpoint.every_steps = 5000
    c.log_every_steps = 100
    return c
