"""GPT (decoder-only) permutation-LM pretraining (XLNet, Yang et al. 2019) on Shakespeare's complete
works, CPU-sized: `gpt_pretrain_tiny`'s model and data with objective 'plm' (two-stream attention
through the GPT's own blocks, partial prediction K=6). The trained model generates as a causal LM.

    python train.py --config configs/gpt_plm_tiny.py --workdir runs/gpt_plm
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

VOCAB = 2048


def get_config():
    c = base_config()
    c.name = "gpt_plm_tiny"
    c.num_train_steps = 1200
    c.model.update(preset("gpt_mini", vocab_size=VOCAB, permutation_lm=True))
    c.objective.name = "plm"
    c.objective.plm_k = 6.0
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
    c.checkpoint.best_metric = "eval_loss"
    c.log_every_steps = 20
    return c
