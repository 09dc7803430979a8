"""Fine-tune a Hugging Face encoder-decoder (BART, T5) for sequence to sequence on your TSV or JSONL
files (``source`` and ``target`` fields). The architecture, the tokenizer and the decoder's start
token (BART: ``decoder_start_token_id`` 2) come from the checkpoint directory; score the run with
``python -m jaxformer.cli.evaluate`` (docs/huggingface.md).

    python train.py --config configs/hf_seq2seq_finetune.py --workdir runs/bart_tsv \
        --config.init_from=path/to/bart-base --config.data.source='files:data/pairs_{split}.tsv'
"""

from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "hf_seq2seq_finetune"
    c.num_train_steps = 1000
    c.init_from = ""  # a Hugging Face directory (config.json, model.safetensors, tokenizer files)
    c.model.family = "encoder_decoder"  # the checkpoint's (other model fields: unset, the checkpoint's)
    c.objective.name = "seq2seq"
    c.objective.label_smoothing = 0.1
    c.data.source = ""  # files:<glob with {split}>.tsv
    c.data.source_key, c.data.target_key = "source", "target"  # the TSV columns
    c.data.seq_len = 128
    c.data.target_len = 128
    c.data.batch_size = 16
    c.optimizer = default_optimizer_config("bert", peak_lr=3e-5, warmup_steps=60, weight_decay=0.01)
    c.eval.every_steps = 200
    c.eval.num_batches = 20
    c.eval.generate_examples = 32  # greedy decoding of the first validation examples: eval_bleu
    c.eval.generate_max_new_tokens = 64
    c.checkpoint.every_steps = 200
    c.checkpoint.best_metric = "eval_bleu"
    c.checkpoint.best_mode = "max"
    c.log_every_steps = 20
    return c
