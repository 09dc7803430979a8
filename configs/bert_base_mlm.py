"""BERT-base masked-LM pretraining (Devlin et al. 2019 hyper-parameters) on a TFDS corpus.

    python train.py --config configs/bert_base_mlm.py --workdir runs/bert_base --config.mesh.fsdp=-1
"""

from jaxformer.models.presets import preset
from jaxformer.train.config import base_config
from jaxformer.train.optim import default_optimizer_config


def get_config():
    c = base_config()
    c.name = "bert_base_mlm"
    c.num_train_steps = 1_000_000
    c.model.update(preset("bert_base", scan_layers=True))
    c.objective.name = "mlm"
    c.objective.mask_rate = 0.15
    c.data.source = "tfds:wikipedia/20230601.en"
    c.data.seq_len = 512
    c.data.batch_size = 256
    c.data.long_examples = "split"
    c.data.tokenizer.vocab_size = 30_522
    c.optimizer = default_optimizer_config("bert")
    c.eval.every_steps = 10_000
    c.checkpoint.every_steps = 10_000
    c.log_every_steps = 100
    return c
