"""GPT (decoder-only) prefix-LM pretraining (Raffel et al. 2020 §3.2.3) on Shakespeare's complete
works, CPU-sized: `gpt_pretrain_tiny` (model, data, optimizer) with objective 'prefix_lm': the
first half of each example is read bidirectionally, the loss is the next-token loss on the rest.

    python train.py --config configs/gpt_prefix_lm_tiny.py --workdir runs/gpt_prefix_lm
"""

import pathlib

from jaxformer.train.config import load_config


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("gpt_pretrain_tiny.py"))
    c.name = "gpt_prefix_lm_tiny"
    c.objective.name = "prefix_lm"
    c.objective.prefix_fraction = 0.5
    return c
