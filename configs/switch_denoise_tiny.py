"""Switch-T5 (Fedus et al. 2022) denoising pretraining, CPU-sized: `t5_denoise_tiny` (data,
objective, optimizer, the dense T5's body) with 8 top-1 experts in every other FFN of both stacks
(layer 1 of 3), capacity factor 1.25, router jitter 0.01, load-balancing α = 0.01 and z-loss 0.001
(`switch_tiny`'s MoE fields). Each token runs one expert, so the FLOPs per token equal the dense
model's (plus the router's d_model × 8), the parameters 2.0× (3.74M vs 1.90M; docs/models.md,
"Mixture of experts").

    python train.py --config configs/switch_denoise_tiny.py --workdir runs/switch_denoise
"""

import pathlib

from jaxformer.models.presets import PRESETS
from jaxformer.train.config import load_config

MOE_FIELDS = ("num_experts", "experts_per_token", "moe_every", "capacity_factor",
              "router_jitter_noise", "router_aux_loss_weight", "router_z_loss_weight")


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("t5_denoise_tiny.py"))
    c.name = "switch_denoise_tiny"
    c.model.update({k: PRESETS["switch_tiny"][k] for k in MOE_FIELDS})
    return c
