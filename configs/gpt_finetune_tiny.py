"""GPT fine-tuning for sentence sentiment (movie-review snippets) from a pretraining run.

    python train.py --config configs/gpt_finetune_tiny.py --workdir runs/gpt_sentiment \
        --config.init_from=runs/gpt_pretrain

The classifier reads the mean of the hidden states of the sentence (``pooling="mean"``; GPT-1's
last-token pooling, ``"last"``, learns more slowly at this budget).
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

VOCAB = 2048


def get_config():
    c = base_config()
    c.name = "gpt_finetune_tiny"
    c.num_train_steps = 400
    c.init_from = ""
    c.model.update(preset("gpt_mini", vocab_size=VOCAB, head="classify",
                          pooling="mean", dropout_rate=0.1))
    c.objective.name = "classify"
    c.data.source = "movie_sentiment"
    c.data.framing = "eos"
    c.data.packing = False
    c.data.seq_len = 64
    c.data.batch_size = 8
    c.data.tokenizer.vocab_size = VOCAB
    c.optimizer = default_optimizer_config("bert", peak_lr=3e-4, warmup_steps=60, weight_decay=0.01)
    c.eval.every_steps = 200
    c.eval.num_batches = 130
    c.checkpoint.every_steps = 200
    c.checkpoint.best_metric = "eval_accuracy"
    c.checkpoint.best_mode = "max"
    c.log_every_steps = 20
    return c
