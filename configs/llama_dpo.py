"""Preference tuning (objective "dpo", Rafailov et al. 2023) of an SFT model on your own pairs, one
JSON object per line in TRL's format (``{"prompt": "...", "chosen": "...", "rejected": "..."}``):

    python train.py --config configs/llama_sft.py --workdir runs/sft \
        --config.init_from=path/to/Llama-2-7b-hf --config.data.source=files:sft.jsonl
    python train.py --config configs/llama_dpo.py --workdir runs/dpo \
        --config.init_from=runs/sft --config.data.source=files:pairs.jsonl

``init_from`` (the SFT run, or any Hugging Face Llama-family directory) is both the policy's start
and the frozen reference (`jaxformer.train.dpo_run`); with ``--config.optimizer.lora.rank=16`` the
reference is the base with the adapters switched off, no second copy. Rows are ``<s> prompt chosen
</s> <s> prompt rejected </s>`` (a pair never split between rows); a pair longer than ``seq_len``
loses prompt tokens from the left. β = 0.1 and the learning rate are TRL's ``DPOConfig`` defaults
(``beta=0.1``, ``learning_rate=1e-6``; 5e-6 with LoRA in the worked example). docs/training.md
has the whole example, from a Hugging Face checkpoint to sampling.
"""

from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "llama_dpo"
    c.num_train_steps = 1000
    c.init_from = ""  # required: the SFT run or a Hugging Face directory (the reference too)
    c.model.dtype = "bfloat16"  # the architecture comes from init_from
    c.model.remat_policy = "full"
    c.objective.name = "dpo"
    c.objective.dpo_beta = 0.1
    c.data.source = "files:pairs.jsonl"  # yours: prompt / chosen / rejected
    c.data.framing = "bos_eos"  # Llama's rows start with <s>
    c.data.seq_len = 512  # one pair: both halves, the prompt twice (raise it for long pairs)
    c.data.batch_size = 16  # pairs per step (up to: short pairs are packed several to a row)
    c.optimizer = default_optimizer_config("gpt3", peak_lr=1e-6, end_lr=1e-6, warmup_steps=50,
                                           weight_decay=0.0)
    c.optimizer.lora.rank = 0  # e.g. 16: --config.optimizer.lora.rank=16 (LoRA-DPO)
    c.optimizer.lora.alpha = 32.0
    c.optimizer.lora.targets = ("query", "key", "value", "out", "ffn")
    c.eval.every_steps = 200
    c.eval.num_batches = 20
    c.checkpoint.every_steps = 200
    c.log_every_steps = 20
    return c
