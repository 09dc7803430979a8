"""GPT (decoder-only) permutation-LM pretraining (XLNet, Yang et al. 2019) on Shakespeare's complete
works, CPU-sized: `gpt_pretrain_tiny` (model, data, optimizer) with objective 'plm' (two-stream
attention through the GPT's own blocks, partial prediction K=6). The trained model generates as a
causal LM.

    python train.py --config configs/gpt_plm_tiny.py --workdir runs/gpt_plm
"""

import pathlib

from jaxformer.train.config import load_config


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("gpt_pretrain_tiny.py"))
    c.name = "gpt_plm_tiny"
    c.model.permutation_lm = True
    c.objective.name = "plm"
    c.objective.plm_k = 6.0
    return c
