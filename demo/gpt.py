"""Decoder-only demo, domain adaptation: causal-LM pretraining on Shakespeare, then language
modelling of a *small* text from a domain pretraining never saw — a few thousand King James
verses — from the pretrained checkpoint and from random init, scored by held-out KJV perplexity.

Both inits use Shakespeare's tokenizer, the same KJV verses, steps and evaluation; each init's
learning rate is its own (chosen on KJV validation perplexity, `demo.compare`). The fine-tuning
set is the first ``size`` KJV training verses in sha256(id) order (spread over the whole Bible);
validation and test are the corpus's whole hash-split validation and test verses, which neither
pretraining nor fine-tuning reads.
"""

from __future__ import annotations

import functools
import hashlib
import math
from pathlib import Path

from demo.compare import compare_inits
from demo.configs import Overrides, pretrain_config, regime_config, scale_budget
from demo.output import banner, write_jsonl
from demo.runs import best_step, checkpoint_params, count_params, evaluate_split, saved_steps, train_run
from demo.settings import DemoSettings
from jaxformer.data.builders.base import SPLITS
from jaxformer.data.containers import read_records
from jaxformer.data.sources import SourceSettings, get_source

DOMAIN = "kjv_bible"


def write_domain_split(directory: Path, size: int) -> dict:
    """``<directory>/{split}.jsonl``: the first ``size`` training verses of `DOMAIN` in sha256(id)
    order, and every validation / test verse (written once: the content depends on ``size``
    only). Returns the data-config keys that read them."""
    for split in SPLITS if not (directory / "test.jsonl").exists() else ():
        src = get_source(SourceSettings(source=DOMAIN), split)
        records = [{"text": r["text"], "id": r["id"]} for r in read_records(src)]
        if split == "train":
            if not 0 < size <= len(records):
                raise ValueError(f"{size} verses: choose 1 … {len(records)}")
            records = sorted(records, key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())
            records = records[:size]
        write_jsonl(directory / f"{split}.jsonl", records)
    return {"data.source": f"files:{directory}/{{split}}.jsonl", "data.format": "jsonl",
            "data.text_key": "text"}


def measure_perplexity(trainer, run, max_batches: int = 0) -> dict:
    """Validation and test perplexity of the checkpoint with the lowest validation loss."""
    step = best_step(run.rows, "eval_loss", "min", saved_steps(run.workdir))
    params = checkpoint_params(run.workdir, step)
    val, test = (evaluate_split(trainer, params, split, max_batches)
                 for split in ("validation", "test"))
    return {"validation": math.exp(val["loss"]), "test": math.exp(test["loss"]),
            "best_step": step}


def run_gpt(workdir: Path, settings: DemoSettings, overrides: Overrides | None = None) -> dict:
    workdir = Path(workdir) / "gpt"
    banner("GPT 1/2: causal-LM pretraining on Shakespeare")
    config = pretrain_config("gpt", "gpt_pretrain_tiny", settings, overrides)
    trainer, pre = train_run("gpt_pretrain", config, workdir / "pretrain")
    tok = {"data.tokenizer.path": str(workdir / "pretrain" / "tokenizer.model")}

    def make_config(size, init_from, lr, seed):
        data = write_domain_split(workdir / f"{DOMAIN}_{size}", size)
        c = regime_config("gpt_pretrain_tiny", overrides, init_from=init_from, seed=seed,
                          **tok, **data, **{"model.dropout_rate": settings.gpt_dropout,
                                            "num_train_steps": settings.steps("gpt", size),
                                            "optimizer.peak_lr": lr,
                                            "optimizer.end_lr": lr / 10,
                                            "optimizer.warmup_steps": 20})
        scale_budget(c, settings.budget_scale, evals=settings.evals)
        return c

    rows = compare_inits("gpt", "language modelling of KJV verses", workdir, settings,
                         sizes=settings.gpt_sizes, make_config=make_config,
                         measure=functools.partial(measure_perplexity,
                                                   max_batches=settings.eval_batches),
                         higher_is_better=False)
    for r in rows:
        t = r["test"]
        print(f"  {r['size']:,} verses: test perplexity pretrained {t['pretrained']['mean']:.1f}"
              f" ± {t['pretrained']['se']:.1f}, scratch {t['scratch']['mean']:.1f} ± "
              f"{t['scratch']['se']:.1f} (ratio {t['ratio']:.2f})", flush=True)
    return {"pretrain": {**pre.summary(), "model_params": count_params(trainer.state.params),
                         "vocab_size": trainer.tokenizer.vocab_size, "corpus": "shakespeare"},
            "domain": DOMAIN, "regimes": rows, "curves": {"pretrain": pre.rows}}
