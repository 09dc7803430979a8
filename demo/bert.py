"""Encoder-only demo: MLM pretraining on unlabelled in-domain text, then sentiment fine-tuning
with few labels (and with all of them) from the pretrained checkpoint and from random init — the
same tokenizer, labelled sentences, steps and evaluation; each init's learning rate its own
(`demo.compare`), every comparison over several seeds.

A third init, when ``DemoSettings.bert_hf`` names one (``python -m demo``: the installed
all-MiniLM-L6-v2, `demo.settings.MINILM`), is what a user fine-tuning a published checkpoint
does: ``init_from`` its Hugging Face directory, whose architecture and tokenizer the run takes; the
same head, labelled sentences, steps and evaluation.

The MLM corpus is the config's (``configs/bert_pretrain_tiny.py``): the sentiment training
sentences *without labels* and the VADER archive's Amazon / NYT / tweet snippets — task- and
domain-adaptive pretraining (Gururangan et al. 2020). Validation and test sentences are never
pretrained on.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from demo.baselines import ngram_logistic_regression
from demo.compare import compare_inits
from demo.configs import BERT_HEAD_CONFIGS, Overrides, pretrain_config, regime_config, scale_budget
from demo.output import banner, curve, write_jsonl
from demo.runs import best_step, checkpoint_params, count_params, evaluate_split, saved_steps, train_run
from demo.settings import MINILM, DemoSettings
from demo.stats import fmt
from jaxformer.convert.hf import hf_model_config
from jaxformer.data.builders.base import SPLITS
from jaxformer.data.containers import read_records
from jaxformer.data.sources import SourceSettings, get_source


@functools.cache  # read once per split: the demo asks for train three times (~0.6 s each)
def sentiment_records(split: str) -> tuple[dict, ...]:
    src = get_source(SourceSettings(source="movie_sentiment"), split)
    return tuple({"text": r["text"], "label": int(r["label"]), "id": r["id"]}
                 for r in read_records(src))


def low_resource_records(n: int) -> list[dict]:
    """The first ``n`` training sentences in sha256(id) order (the corpus stores them sorted by
    label, so "the first n" in file order would be almost all positive)."""
    train = sentiment_records("train")
    if not 0 < n <= len(train):
        raise ValueError(f"low_resource_examples={n} must be in [1, {len(train)}]")
    return sorted(train, key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())[:n]


def write_low_resource_split(directory: Path, n: int) -> dict:
    """``<directory>/{train,validation,test}.jsonl``: ``n`` training sentences, full evaluation
    splits (written once: the content depends on ``n`` only). Returns the data-config keys that
    read them."""
    if not (directory / "test.jsonl").exists():
        write_jsonl(directory / "train.jsonl", low_resource_records(n))
        for split in SPLITS[1:]:
            write_jsonl(directory / f"{split}.jsonl", sentiment_records(split))
    return {"data.source": f"files:{directory}/{{split}}.jsonl", "data.format": "jsonl",
            "data.text_key": "text", "data.label_key": "label"}


def measure_accuracy(trainer, run, max_batches: int = 0) -> dict:
    """Validation and test accuracy of the checkpoint with the best validation accuracy."""
    step = best_step(run.rows, "eval_accuracy", available=saved_steps(run.workdir))
    params = checkpoint_params(run.workdir, step)
    val, test = (evaluate_split(trainer, params, split, max_batches)
                 for split in ("validation", "test"))
    return {"validation": val["accuracy"], "test": test["accuracy"], "best_step": step}


def finetune_config(workdir: Path, settings: DemoSettings, overrides: Overrides | None, size: int,
                    init_from: str, lr: float, seed: int):
    """The sentiment fine-tuning config of a regime of ``size`` labels (`compare.MakeConfig`),
    in ``workdir`` (the family's: ``pretrain/`` holds the tokenizer the own MLM and scratch share;
    the Hugging Face init, ``settings.bert_hf``, brings its own)."""
    data = write_low_resource_split(workdir / f"sentiment_{size}", size)
    steps = settings.steps("bert", size)
    tok = ({} if init_from and init_from == settings.bert_hf else
           {"data.tokenizer.path": str(workdir / "pretrain" / "tokenizer.model")})
    c = regime_config(BERT_HEAD_CONFIGS[settings.bert_head], overrides, init_from=init_from,
                      seed=seed, **tok, **data,
                      **{"num_train_steps": steps, "optimizer.peak_lr": lr,
                         "optimizer.warmup_steps": max(steps // 10, 1)})
    scale_budget(c, settings.budget_scale, evals=settings.evals)
    return c


def run_bert(workdir: Path, settings: DemoSettings, overrides: Overrides | None = None) -> dict:
    workdir = Path(workdir) / "bert"
    banner("BERT 1/2: masked-LM pretraining on unlabelled in-domain text")
    config = pretrain_config("bert", "bert_pretrain_tiny", settings, overrides)
    trainer, pre = train_run("bert_pretrain", config, workdir / "pretrain")
    total = len(sentiment_records("train"))
    make_config = functools.partial(finetune_config, workdir, settings, overrides)
    sizes = tuple(n if 0 < n < total else total for n in settings.bert_sizes)
    rows = compare_inits("bert", "sentiment labels", workdir, settings, sizes=sizes,
                         make_config=make_config,
                         measure=functools.partial(measure_accuracy,
                                                   max_batches=settings.eval_batches),
                         higher_is_better=True,
                         init_from={MINILM["init"]: settings.bert_hf} if settings.bert_hf else None)
    val, test = sentiment_records("validation"), sentiment_records("test")
    for r in rows:
        r["ngram_baseline"] = ngram_logistic_regression(low_resource_records(r["size"]), val, test)
        t = r["test"]
        hf = "".join(f", {MINILM['label'] if i == MINILM['init'] else i} {fmt(t[i], 100)}%"
                     for i in t["others"])
        print(f"  {r['size']:,} labels: test accuracy pretrained {fmt(t['pretrained'], 100)}%, "
              f"scratch {fmt(t['scratch'], 100)}%{hf}, n-gram LR "
              f"{100 * r['ngram_baseline']['test_accuracy']:.1f}%", flush=True)
    final_mlm = curve(pre.rows, "eval_loss")
    return {
        "pretrain": {**pre.summary(), "model_params": count_params(trainer.state.params),
                     "vocab_size": trainer.tokenizer.vocab_size, "corpus": config.data.source,
                     "final_validation_mlm_loss": final_mlm[-1][1] if final_mlm else None},
        "head": settings.bert_head, "train_examples": total, "regimes": rows,
        "hf_init": hf_init_facts(settings.bert_hf),
        "curves": {"pretrain": pre.rows},
    }


def hf_init_facts(directory: str) -> dict | None:
    """What the report says of the Hugging Face init: its directory and architecture, read from
    its ``config.json`` by the converter ``init_from`` uses."""
    if not directory:
        return None
    fields = hf_model_config(directory)
    return {"label": MINILM["label"], "directory": directory,
            **{k: fields[k] for k in ("vocab_size", "d_model", "num_layers")}}
