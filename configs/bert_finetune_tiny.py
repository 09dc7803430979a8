"""BERT fine-tuning for sentence sentiment (movie-review snippets) from an MLM pretraining run.

    python train.py --config configs/bert_finetune_tiny.py --workdir runs/bert_sentiment \
        --config.init_from=runs/bert_pretrain
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

VOCAB = 2048


def get_config():
    c = base_config()
    c.name = "bert_finetune_tiny"
    c.num_train_steps = 1600
    c.init_from = ""
    c.model.update(preset("bert_mini", vocab_size=VOCAB, head="classify",
                          pooling="mean", dropout_rate=0.1))
    c.objective.name = "classify"
    c.data.source = "movie_sentiment"
    c.data.framing = "cls_sep"
    c.data.packing = False
    c.data.seq_len = 64
    c.data.batch_size = 8
    c.data.tokenizer.vocab_size = VOCAB
    c.optimizer = default_optimizer_config("bert", peak_lr=3e-4, warmup_steps=160)
    c.eval.every_steps = 200
    c.eval.num_batches = 130
    c.checkpoint.every_steps = 200
    c.checkpoint.best_metric = "eval_accuracy"
    c.checkpoint.best_mode = "max"
    c.log_every_steps = 20
    return c
