"""T5 (encoder-decoder) BART-style denoising pretraining on English and Spanish verses, CPU-sized:
`t5_pretrain_tiny` (model, data, optimizer) with objective 'denoise' (30% text infilling, Poisson
λ = 3 spans, each replaced by one [MASK]; the target is the whole verse) — multilingual denoising
as in mBART (Liu et al. 2020), the pretraining the translation demo fine-tunes from.

At this size (1.9M parameters, ~1M pretraining tokens) span corruption's targets — a sentinel and
three tokens — teach the decoder little that translation needs: fine-tuned on 1,000 verse pairs,
its validation loss beats scratch, but greedy decoding ignores the source and loops ("de los
hijos de los hijos …", BLEU 0.5 vs 1.9). Denoising's targets are whole verses ending in EOS, as
translation's are (docs/demo.md, "Why pretrained T5 fine-tuned worse than scratch").

    python train.py --config configs/t5_denoise_tiny.py --workdir runs/t5_denoise
"""

import pathlib

from jaxformer.train.config import load_config


def get_config():
    c = load_config(pathlib.Path(__file__).with_name("t5_pretrain_tiny.py"))
    c.name = "t5_denoise_tiny"
    # What `make demo` runs: with a 120-step warmup (7.5%), +1.65 +- 0.23 BLEU over scratch at 1,000
    # pairs. At 4,000 pairs only twice as long transfers (--pretrain_scale 2: +4.21 +- 0.32; 1,600
    # steps: +0.12 +- 0.26; 800: -0.59 +- 0.39); demo_results/DIAGNOSIS.md, items 7-9.
    c.num_train_steps = 1600
    c.optimizer.warmup_steps = 120
    # Peak 2e-3 (t5_pretrain_tiny's 3e-3 was chosen under the former flat init): with T5's
    # published fan-in init the final validation loss is lowest at 2e-3 of {1e-3, 2e-3, 3e-3, 5e-3}
    # (end rate a tenth of the peak; demo_results/t5_pretrain_lr/pretrain_lr.md).
    c.optimizer.peak_lr = 2e-3
    c.optimizer.end_lr = 2e-4
    c.objective.name = "denoise"
    c.data.target_len = c.data.seq_len  # the target is the whole (packed) input text
    return c
