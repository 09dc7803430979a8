"""Supervised fine-tuning (objective "sft") of a Llama / Mistral / Qwen2 checkpoint on your own
prompt/response pairs, one JSON object per line (``{"prompt": "...", "response": "..."}``), with
LoRA:

    python train.py --config configs/llama_sft.py --workdir runs/llama_sft \
        --config.init_from=path/to/Llama-2-7b-hf --config.data.source=files:pairs.jsonl \
        --config.optimizer.lora.rank=16

The architecture and the tokenizer are the checkpoint's (its ``tokenizer.model`` or
``tokenizer.json`` becomes the run's); rows are ``<s> prompt response </s>`` and the loss counts the
response only. Rank-16 adapters on every projection (Hu et al. 2021; QLoRA's choice of targets,
Dettmers et al. 2023), the base frozen, once ``optimizer.lora.rank`` is set (it is 0 here, as LoRA
needs an ``init_from``, which a config file cannot name). docs/huggingface.md has the whole
example, sampling included.
"""

from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "llama_sft"
    c.num_train_steps = 1000
    c.init_from = ""  # required: a Hugging Face Llama-family directory (or a jaxformer run)
    c.model.dtype = "bfloat16"  # the architecture comes from init_from
    c.model.remat_policy = "full"
    c.objective.name = "sft"
    c.data.source = "files:pairs.jsonl"  # yours
    c.data.source_key, c.data.target_key = "prompt", "response"
    c.data.framing = "bos_eos"  # Llama's rows start with <s>
    c.data.seq_len = 512
    c.data.batch_size = 16
    c.optimizer = default_optimizer_config("gpt3", peak_lr=2e-4, end_lr=2e-5, warmup_steps=50,
                                           weight_decay=0.0)
    c.optimizer.lora.rank = 0  # 16 in the example: --config.optimizer.lora.rank=16
    c.optimizer.lora.alpha = 32.0
    c.optimizer.lora.targets = ("query", "key", "value", "out", "ffn")
    c.eval.every_steps = 200
    c.eval.num_batches = 20
    c.checkpoint.every_steps = 200
    c.log_every_steps = 20
    return c
