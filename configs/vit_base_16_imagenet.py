"""ViT-B/16 (Dosovitskiy et al. 2021) trained on ImageNet-1k at 224 px from TFDS (``imagenet2012``,
which TFDS cannot download: prepare it by hand into ``data.tfds_data_dir``), bf16 compute; the
paper's fine-tuning recipe is SGD, its pretraining Adam(0.9, 0.999), weight decay 0.1, batch 4096,
linear warmup 10k steps then decay (§B.1); this config keeps that shape at a batch per step a slice
holds, AdamW with the "gpt3" preset's cosine decay.

    python train.py --config configs/vit_base_16_imagenet.py --workdir runs/vit_b16 \
        --config.data.tfds_data_dir=/data/tfds
    python -m jaxformer.cli.compile --config configs/vit_base_16_imagenet.py --topology v5e:2x2 \
        --config.mesh.fsdp=4
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "vit_base_16_imagenet"
    c.num_train_steps = 300_000
    c.init_from = ""
    c.model.update(preset("vit_base_16", dtype="bfloat16", param_dtype="float32"))
    c.objective.name = "classify"
    c.data.source = "tfds:imagenet2012"
    c.data.batch_size = 256
    c.data.image_crop_padding = 16
    c.data.image_flip = True
    c.data.read_threads = 8
    c.optimizer = default_optimizer_config("gpt3", peak_lr=1e-3, end_lr=1e-5, warmup_steps=10_000)
    c.optimizer.b2 = 0.999
    c.optimizer.weight_decay = 0.1
    c.eval.split = "validation"
    c.eval.every_steps = 5000
    c.eval.num_batches = 50
    c.checkpoint.every_steps = 5000
    c.log_every_steps = 100
    return c
