"""BERT sentiment classification as a cloze (PET; Schick & Schütze 2021) through the MLM head of
an MLM pretraining run: each sentence gets " It was [MASK]." and the class is the more likely of
the label words at the [MASK] ("bad" / "good"). The model is the pretraining model, head and all
(configs/bert_pretrain_tiny.py), so ``init_from`` initialises every parameter; the data, steps and
evaluation are configs/bert_finetune_tiny.py's.

    python train.py --config configs/bert_cloze_tiny.py --workdir runs/bert_cloze \
        --config.init_from=runs/bert_pretrain
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

VOCAB = 2048


def get_config():
    c = base_config()
    c.name = "bert_cloze_tiny"
    c.num_train_steps = 1600
    c.init_from = ""
    c.model.update(preset("bert_mini", vocab_size=VOCAB, head="mlm", num_classes=2,
                          dropout_rate=0.1))
    c.objective.name = "cloze"
    c.objective.cloze_pattern = "It was <mask>."
    c.objective.verbalizers = "bad,good"  # label 0 = negative, 1 = positive
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
