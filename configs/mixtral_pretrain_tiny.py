"""Mixtral-style (Jiang et al. 2024) causal-LM pretraining on Shakespeare, CPU-sized:
`gpt_pretrain_tiny` (data, objective, optimizer) with `mixtral_tiny`'s layout at the mini width
(4 layers of 128, 4 heads, RoPE, SwiGLU) and 8 experts per layer, top-2 renormalised,
dropless (grouped matmuls).

    python train.py --config configs/mixtral_pretrain_tiny.py --workdir runs/mixtral_pretrain
"""

import pathlib

from jaxformer.models.presets import preset
from jaxformer.train.config import load_config


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("gpt_pretrain_tiny.py"))
    c.name = "mixtral_pretrain_tiny"
    c.model.update(preset("mixtral_tiny", vocab_size=c.model.vocab_size, d_model=128, d_ff=256,
                          num_kv_heads=4, num_layers=4, max_len=128))  # kv heads: tensor=4 meshes
    return c
