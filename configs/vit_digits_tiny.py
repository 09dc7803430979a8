"""A tiny Vision Transformer (Dosovitskiy et al. 2021) trained from scratch on scikit-learn's 8×8
digits (offline: the ``[images]`` extra), objective ``classify`` on image batches; no tokenizer.

    python train.py --config configs/vit_digits_tiny.py --workdir runs/vit_digits
    jaxformer-evaluate --workdir runs/vit_digits --split test

Fine-tuning at another resolution (the learned positions resampled, as the paper does):

    python train.py --config configs/vit_digits_tiny.py --workdir runs/vit_digits_16 \
        --config.init_from=runs/vit_digits --config.model.image_size=16

The settings are bench/vit_digits.py's at 2,000 steps (patch 4, peak lr 3e-3: chosen on
validation; docs/models.md).
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config

STEPS = 2000


def get_config():
    c = base_config()
    c.name = "vit_digits_tiny"
    c.num_train_steps = STEPS
    c.init_from = ""
    c.model.update(preset("vit_digits", patch_size=4))
    c.objective.name = "classify"
    c.data.source = "digits"
    c.data.batch_size = 64
    c.data.image_crop_padding = 1  # a digit must not be mirrored: no flips
    c.optimizer = default_optimizer_config("gpt3", peak_lr=3e-3, end_lr=3e-4, warmup_steps=STEPS // 10)
    c.eval.split = "validation"
    c.eval.every_steps = 250
    c.eval.num_batches = 6  # the 358 validation images
    c.checkpoint.every_steps = 500
    c.checkpoint.best_metric = "eval_accuracy"
    c.checkpoint.best_mode = "max"
    c.log_every_steps = 50
    return c
