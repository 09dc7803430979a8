"""GPT (decoder-only) causal-LM pretraining on Shakespeare's complete works, CPU-sized.

    python train.py --config configs/gpt_pretrain_tiny.py --workdir runs/gpt_pretrain
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

VOCAB = 2048


def get_config():
    c = base_config()
    c.name = "gpt_pretrain_tiny"
    c.num_train_steps = 1200
    c.model.update(preset("gpt_mini", vocab_size=VOCAB))
    c.objective.name = "clm"
    c.data.source = "shakespeare"
    c.data.seq_len = 128
    c.data.batch_size = 8
    c.data.long_examples = "split"
    c.data.tokenizer.vocab_size = VOCAB
    c.data.tokenizer.max_train_texts = 20_000
    c.optimizer = default_optimizer_config("gpt3", peak_lr=2e-3, end_lr=2e-4, warmup_steps=60,
                                           weight_decay=0.01)
    c.eval.every_steps = 200
    c.eval.num_batches = 20
    c.checkpoint.every_steps = 200
    c.checkpoint.best_metric = "eval_loss"  # keeps the best step: generate --best
    c.log_every_steps = 20
    return c
