"""BERT extractive question answering (SQuAD-style, Devlin et al. 2019 §4.2) on the user's own
JSONL/TSV file of {"context", "question", "answer_text", "answer_start"} records (or SQuAD's nested
``answers``), fine-tuned from an MLM pretraining run:

    python train.py --config configs/bert_qa_tiny.py --workdir runs/bert_qa \\
        --config.init_from=runs/bert_pretrain --config.data.source='files:qa/{split}.jsonl'
    python -m jaxformer.cli.answer --workdir runs/bert_qa --context "..." --question "..."

With network access, ``--config.data.source=tfds:squad`` reads SQuAD v1.1 (its ``answers`` field).
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

VOCAB = 2048


def get_config():
    c = base_config()
    c.name = "bert_qa_tiny"
    c.num_train_steps = 1000
    c.init_from = ""
    c.model.update(preset("bert_mini", vocab_size=VOCAB, head="span", dropout_rate=0.1))
    c.objective.name = "qa"
    c.objective.doc_stride = 32
    c.objective.max_question_len = 24
    c.objective.max_answer_len = 16
    c.data.source = "files:qa.jsonl"
    c.data.text_key = "context"
    c.data.packing = False
    c.data.seq_len = 96
    c.data.batch_size = 16
    c.data.tokenizer.vocab_size = VOCAB
    c.optimizer = default_optimizer_config("bert", peak_lr=3e-4, warmup_steps=100)
    c.eval.every_steps = 200
    c.eval.num_batches = 20
    c.checkpoint.every_steps = 200
    c.log_every_steps = 20
    return c
