"""BERT (encoder-only) masked-LM pretraining, CPU-sized, on unlabelled in-domain text: the
movie-review sentences of the sentiment training split *without their labels* (task-adaptive
pretraining, Gururangan et al. 2020), then the 11.8k Amazon-review / NYT-editorial / tweet snippets
of the same VADER archive (``review_snippets``; domain-adaptive). The tokenizer is trained on all
of them.

    python train.py --config configs/bert_pretrain_tiny.py --workdir runs/bert_pretrain
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

VOCAB = 2048


def get_config():
    c = base_config()
    c.name = "bert_pretrain_tiny"
    c.num_train_steps = 1600
    c.model.update(preset("bert_mini", vocab_size=VOCAB))
    c.objective.name = "mlm"
    c.objective.mask_rate = 0.4  # Wettig et al. 2023: 40% beats 15%; more targets/step
    c.data.source = "concat:movie_sentiment,review_snippets"
    c.data.seq_len = 128
    c.data.batch_size = 8
    c.data.long_examples = "split"
    c.data.tokenizer.vocab_size = VOCAB
    c.data.tokenizer.max_train_texts = 25_000
    c.optimizer = default_optimizer_config("bert", peak_lr=1e-3, warmup_steps=50)
    c.eval.every_steps = 200
    c.eval.num_batches = 20
    c.checkpoint.every_steps = 200
    c.log_every_steps = 20
    return c
