"""Decoder-only demo: causal-LM pretraining on Shakespeare, perplexity against a unigram model on
the same tokenization, then sentiment fine-tuning from the pretrained checkpoint."""

from __future__ import annotations

from pathlib import Path

from demo import baselines
from demo.common import (
    DemoSettings,
    Overrides,
    banner,
    count_params,
    finetune_classifier,
    load_config,
    scale_budget,
    train_run,
)


def run_gpt(workdir: Path, settings: DemoSettings, overrides: Overrides | None = None) -> dict:
    """Pretrain, compare perplexity with the unigram baseline (validation and test), fine-tune."""
    workdir = Path(workdir) / "gpt"
    banner("GPT 1/2: causal-LM pretraining on Shakespeare")
    config = load_config("gpt_pretrain_tiny", overrides)
    scale_budget(config, settings.budget_scale * settings.pretrain_scale, evals=10)
    trainer, pre = train_run("gpt_pretrain", config, workdir / "pretrain")

    banner("GPT: perplexity vs a unigram model on the same tokens")
    log_probs = baselines.unigram_log_probs(trainer)
    params = trainer.state.params
    lm = {split: baselines.perplexity_vs_unigram(trainer, params, split, log_probs)
          for split in ("validation", "test")}
    for split, r in lm.items():
        print(f"  {split}: model perplexity {r['model_perplexity']:.1f}, unigram "
              f"{r['unigram_perplexity']:.1f} ({100 * r['ratio']:.1f}%) over {r['tokens']:,} "
              "tokens", flush=True)

    banner("GPT 2/2: sentiment fine-tuning from the pretrained checkpoint")
    tok = str(workdir / "pretrain" / "tokenizer.model")
    ft_config = load_config("gpt_finetune_tiny", overrides, init_from=str(workdir / "pretrain"),
                            **{"data.tokenizer.path": tok})
    scale_budget(ft_config, settings.budget_scale, evals=5)
    ft, ft_run = finetune_classifier("gpt_sentiment", ft_config, workdir / "sentiment")
    print(f"  test accuracy {100 * ft['test_accuracy']:.1f}% (checkpoint of the best validation "
          f"accuracy, step {ft['best_step']})", flush=True)
    return {
        "pretrain": {**pre.summary(), "model_params": count_params(params),
                     "vocab_size": trainer.tokenizer.vocab_size, **lm},
        "sentiment": ft,
        "curves": {"pretrain": pre.rows, "sentiment": ft_run.rows},
    }
