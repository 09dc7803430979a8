"""BERT knowledge distillation (DistilBERT, Sanh et al. 2019), CPU-sized: a 2-layer student of the
4-layer `bert_pretrain_tiny` teacher, initialised from the teacher's layers 0 and 2, trained on the
same texts with the teacher's tokenizer and the loss
α·T²·KL(teacher ‖ student) + β·MLM cross-entropy + γ·(1 − cos) of the last hidden states
(DistilBERT's weights 5 / 2 / 1, T = 2; `jaxformer.train.distill`).

    python train.py --config configs/bert_pretrain_tiny.py --workdir runs/bert_pretrain
    python train.py --config configs/bert_distill_tiny.py --workdir runs/bert_distill
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

VOCAB = 2048


def get_config():
    c = base_config()
    c.name = "bert_distill_tiny"
    c.num_train_steps = 800
    c.model.update(preset("bert_mini", vocab_size=VOCAB, num_layers=2))  # the teacher's widths
    c.objective.name = "mlm"
    c.objective.mask_rate = 0.4  # as the teacher was trained
    c.data.source = "concat:movie_sentiment,shakespeare"
    c.data.seq_len = 128
    c.data.batch_size = 8
    c.data.long_examples = "split"
    c.data.tokenizer.vocab_size = VOCAB  # the teacher's tokenizer.model is read (its ids)
    c.distill.teacher = "runs/bert_pretrain"
    c.distill.temperature = 2.0
    c.distill.alpha, c.distill.beta, c.distill.gamma = 5.0, 2.0, 1.0
    c.distill.init_student = True
    c.optimizer = default_optimizer_config("bert", peak_lr=1e-3, warmup_steps=50)
    c.eval.every_steps = 200
    c.eval.num_batches = 20
    c.checkpoint.every_steps = 200
    c.log_every_steps = 20
    return c
