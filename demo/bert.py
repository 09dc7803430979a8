"""Encoder-only demo: MLM pretraining, then sentiment fine-tuning from the pretrained checkpoint and
from random init (same tokenizer, hyper-parameters and budget), on the full training split and on a
low-resource split; the low-resource gap is traced against pretraining time with checkpoints of the
one pretraining run.

The MLM corpus is the config's (``configs/bert_pretrain_tiny.py``: the sentiment training
sentences *without labels* followed by Shakespeare — task-adaptive pretraining, Gururangan et al.
2020). Validation and test sentences are never pretrained on.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from demo.common import (
    DemoSettings,
    Overrides,
    banner,
    count_params,
    curve,
    finetune_classifier,
    load_config,
    saved_steps,
    scale_budget,
    train_run,
    write_jsonl,
)
from jaxformer.data.builders.base import SPLITS
from jaxformer.data.sources import get_source


def sentiment_records(split: str) -> list[dict]:
    src = get_source({"source": "movie_sentiment"}, split)
    return [{"text": r["text"], "label": int(r["label"]), "id": r["id"]}
            for r in (src[i] for i in range(len(src)))]


def low_resource_records(n: int) -> list[dict]:
    """The first ``n`` training sentences in sha256(id) order (the corpus stores them sorted by
    label, so "the first n" in file order would be almost all positive)."""
    train = sentiment_records("train")
    if not 0 < n <= len(train):
        raise ValueError(f"low_resource_examples={n} must be in [1, {len(train)}]")
    return sorted(train, key=lambda r: hashlib.sha256(r["id"].encode()).hexdigest())[:n]


def write_low_resource_split(directory: Path, n: int) -> dict:
    """``<directory>/{train,validation,test}.jsonl``: ``n`` training sentences, full evaluation
    splits. Returns the data-config keys that read them."""
    write_jsonl(directory / "train.jsonl", low_resource_records(n))
    for split in SPLITS[1:]:
        write_jsonl(directory / f"{split}.jsonl", sentiment_records(split))
    return {"data.source": f"files:{directory}/{{split}}.jsonl", "data.format": "jsonl",
            "data.text_key": "text", "data.label_key": "label"}


def run_bert(workdir: Path, settings: DemoSettings, overrides: Overrides | None = None) -> dict:
    workdir = Path(workdir) / "bert"
    s = settings.budget_scale
    banner("BERT 1/3: masked-LM pretraining")
    config = load_config("bert_pretrain_tiny", overrides)
    scale_budget(config, s * settings.pretrain_scale, evals=10)
    points = max(settings.bert_curve_points, 1)
    config.checkpoint.every_steps = max(-(-config.num_train_steps // points), 1)  # ceil: the
    # saved steps are every, 2·every, …, and the last step: `points` checkpoints in all
    config.checkpoint.keep = points + 1
    trainer, pre = train_run("bert_pretrain", config, workdir / "pretrain")
    ckpt_dir = workdir / "pretrain" / "checkpoints"
    curve_steps = saved_steps(workdir / "pretrain")[-points:]
    tok = {"data.tokenizer.path": str(workdir / "pretrain" / "tokenizer.model")}
    sec_per_step = pre.seconds / max(pre.steps, 1)
    tok_per_step = pre.tokens / max(pre.steps, 1)

    def finetune(name, init_from, data=None, steps=None):
        c = load_config("bert_finetune_tiny", overrides, init_from=init_from, **tok, **(data or {}))
        if steps is not None:
            c.num_train_steps = steps
            c.optimizer.warmup_steps = max(steps // 10, 1)
        scale_budget(c, s if steps is None else 1.0, evals=5)
        out, run = finetune_classifier(name, c, workdir / name)
        print(f"  {name}: test accuracy {100 * out['test_accuracy']:.1f}% (validation "
              f"{100 * out['validation_accuracy']:.1f}%, step {out['best_step']})", flush=True)
        return out, run

    banner("BERT 2/3: sentiment fine-tuning on the full training split, pretrained vs scratch")
    full = {}
    curves = {"pretrain": pre.rows}
    for kind, init in (("pretrained", str(workdir / "pretrain")), ("scratch", "")):
        full[kind], run = finetune(f"full_{kind}", init)
        curves[f"full_{kind}"] = run.rows

    n = settings.low_resource_examples
    banner(f"BERT 3/3: {n}-label split, scratch and from pretraining steps {curve_steps}")
    data = write_low_resource_split(workdir / f"sentiment_{n}", n)
    low_steps = max(int(round(settings.low_resource_steps * s)), 2)
    low_scratch, run = finetune("low_scratch", "", data, low_steps)
    curves["low_scratch"] = run.rows
    gap = []
    for step in curve_steps:
        out, run = finetune(f"low_pretrained_{step}", str(ckpt_dir / str(step)), data, low_steps)
        curves[f"low_pretrained_{step}"] = run.rows
        gap.append({"pretrain_steps": step, "pretrain_tokens": int(round(step * tok_per_step)),
                    "pretrain_minutes": round(step * sec_per_step / 60, 2),
                    "pretrained_test_accuracy": out["test_accuracy"],
                    "scratch_test_accuracy": low_scratch["test_accuracy"],
                    "gap_points": 100 * (out["test_accuracy"] - low_scratch["test_accuracy"]),
                    "finetune": out})
    final_mlm = curve(pre.rows, "eval_loss")
    return {
        "pretrain": {**pre.summary(), "model_params": count_params(trainer.state.params),
                     "vocab_size": trainer.tokenizer.vocab_size, "corpus": config.data.source,
                     "final_validation_mlm_loss": final_mlm[-1][1] if final_mlm else None},
        "full": full,
        "low_resource": {"examples": n, "pretrained": gap[-1]["finetune"], "scratch": low_scratch,
                         "gap_curve": gap},
        "curves": curves,
    }
