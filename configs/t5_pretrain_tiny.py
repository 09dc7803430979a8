"""T5 (encoder-decoder) span-corruption pretraining on English and Spanish Bible text, CPU-sized.

    python train.py --config configs/t5_pretrain_tiny.py --workdir runs/t5_pretrain
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

VOCAB = 4096


def get_config():
    c = base_config()
    c.name = "t5_pretrain_tiny"
    c.num_train_steps = 800
    c.model.update(preset("t5_mini", vocab_size=VOCAB))
    c.objective.name = "span_corruption"
    c.objective.noise_density = 0.15
    c.objective.mean_span_length = 3.0
    c.data.source = "bible_en_es:both"
    c.data.seq_len = 128
    c.data.target_len = 48
    c.data.batch_size = 8
    c.data.long_examples = "split"
    c.data.tokenizer.vocab_size = VOCAB
    c.data.tokenizer.max_train_texts = 56_000  # every training verse, both languages
    c.optimizer = default_optimizer_config("gpt3", peak_lr=3e-3, end_lr=3e-4, warmup_steps=60,
                                           weight_decay=0.0)
    c.eval.every_steps = 200
    c.eval.num_batches = 20
    c.checkpoint.every_steps = 200
    c.log_every_steps = 20
    return c
