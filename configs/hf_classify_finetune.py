"""Fine-tune a Hugging Face encoder (RoBERTa, DistilBERT, BERT, ALBERT) as a sequence classifier
on your TSV files (``text`` and ``label`` columns). The architecture and the tokenizer come from the
checkpoint directory; only the head is stated here: its first token (``<s>`` / ``[CLS]``) through
the pooler, as RobertaForSequenceClassification and DistilBertForSequenceClassification read it, so
the run exports to them (docs/huggingface.md).

    python train.py --config configs/hf_classify_finetune.py --workdir runs/roberta_tsv \
        --config.init_from=path/to/roberta-base \
        --config.data.source='files:data/reviews_{split}.tsv' --config.data.label_names=neg,pos
"""

from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "hf_classify_finetune"
    c.num_train_steps = 1000
    c.init_from = ""  # a Hugging Face directory (config.json, model.safetensors, tokenizer files)
    c.model.family = "encoder"  # the checkpoint's (other model fields: unset, the checkpoint's)
    c.model.head = "classify"
    c.model.pooling = "first"
    c.model.pooler = True  # its activation is the checkpoint's (RoBERTa tanh, DistilBERT relu)
    c.objective.name = "classify"
    c.data.source = ""  # files:<glob with {split}>.tsv
    c.data.label_key = "label"  # the TSV columns: text, label
    c.data.framing = "cls_sep"  # <s> text </s> (RoBERTa), [CLS] text [SEP] (BERT, DistilBERT)
    c.data.packing = False
    c.data.seq_len = 128
    c.data.batch_size = 16
    c.optimizer = default_optimizer_config("bert", peak_lr=2e-5, warmup_steps=60, weight_decay=0.01)
    c.eval.every_steps = 200
    c.eval.num_batches = 50
    c.checkpoint.every_steps = 200
    c.checkpoint.best_metric = "eval_accuracy"
    c.checkpoint.best_mode = "max"
    c.log_every_steps = 20
    return c
