"""BERT knowledge distillation (DistilBERT, Sanh et al. 2019), CPU-sized: a 2-layer student of the
4-layer `bert_pretrain_tiny` teacher (its data, masking and optimizer), initialised from the
teacher's layers 0 and 2, trained with the teacher's tokenizer and the loss
α·T²·KL(teacher ‖ student) + β·MLM cross-entropy + γ·(1 − cos) of the last hidden states
(DistilBERT's weights 5 / 2 / 1, T = 2; `jaxformer.train.distill`).

    python train.py --config configs/bert_pretrain_tiny.py --workdir runs/bert_pretrain
    python train.py --config configs/bert_distill_tiny.py --workdir runs/bert_distill
"""

import pathlib

from jaxformer.train.config import load_config


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("bert_pretrain_tiny.py"))
    c.name = "bert_distill_tiny"
    c.num_train_steps = 800
    c.model.num_layers = 2  # the teacher's widths, half its layers
    c.distill.teacher = "runs/bert_pretrain"  # its tokenizer.model is read (its ids)
    c.distill.temperature = 2.0
    c.distill.alpha, c.distill.beta, c.distill.gamma = 5.0, 2.0, 1.0
    c.distill.init_student = True
    return c
