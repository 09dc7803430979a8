"""Transformer-base (Vaswani et al. 2017) on WMT'14 En→De: post-LN, sinusoidal positions, shared
37k vocabulary, Adam (0.9, 0.98, 1e-9) with the inverse-sqrt "Noam" schedule (4000 warmup steps),
label smoothing 0.1, dropout 0.1.

    python train.py --config configs/transformer_base_wmt.py --workdir runs/wmt --config.mesh.data=-1
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "transformer_base_wmt"
    c.num_train_steps = 100_000
    c.model.update(preset("transformer_base"))
    c.objective.name = "seq2seq"
    c.objective.label_smoothing = 0.1
    c.data.source = "tfds:wmt14_translate/de-en"
    c.data.source_key = "en"
    c.data.target_key = "de"
    c.data.seq_len = 256
    c.data.target_len = 256
    c.data.batch_size = 256
    c.data.tokenizer.vocab_size = 37_000
    c.data.tokenizer.model_type = "bpe"
    c.optimizer = default_optimizer_config("vaswani")  # inverse_sqrt, warmup 4000, scale 1
    c.eval.every_steps = 5000
    c.checkpoint.every_steps = 5000
    c.log_every_steps = 100
    return c
