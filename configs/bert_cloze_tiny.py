"""BERT sentiment classification as a cloze (PET; Schick & Schütze 2021) through the MLM head of
an MLM pretraining run: each sentence gets " It was [MASK]." and the class is the more likely of
the label words at the [MASK] ("bad" / "good"). The model is the pretraining model, head and all
(configs/bert_pretrain_tiny.py), so ``init_from`` initialises every parameter; the data, steps and
evaluation are configs/bert_finetune_tiny.py's.

    python train.py --config configs/bert_cloze_tiny.py --workdir runs/bert_cloze \
        --config.init_from=runs/bert_pretrain
"""

import pathlib

from jaxformer.train.config import load_config


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("bert_finetune_tiny.py"))
    c.name = "bert_cloze_tiny"
    c.model.head = "mlm"  # the pretraining head scores the label words: no fresh classifier
    c.model.pooling = "first"  # the default: an MLM head pools nothing
    c.objective.name = "cloze"
    c.objective.cloze_pattern = "It was <mask>."
    c.objective.verbalizers = "bad,good"  # label 0 = negative, 1 = positive
    return c
