"""DPO on a toy preference: SFT, then DPO, on a tiny decoder; reward accuracy and greedy win rate.

    python bench/dpo_toy.py [--seeds 0,1,2] [--sft_steps 40] [--dpo_steps 60] [--beta 0.1] \
        [--dpo_lr 1e-3] [--prompt_lengths 4,7] [--out bench/results/dpo_toy.json]

(docs/training.md's figure: ``--sft_steps 80 --dpo_steps 30 --beta 0.1 --dpo_lr 3e-4
--prompt_lengths 2,4``.) Synthetic pairs of token ids (no tokenizer): a prompt of
``--prompt_lengths`` distinct symbols (of 12); the chosen response is the
prompt reversed, the rejected one a shuffle of it (never the reversal). A 2-layer GPT (width 64) is
first fine-tuned on (prompt, chosen) with the ``sft`` objective for ``--sft_steps`` steps (short on
purpose: its greedy reversals are still often wrong), then trained with the ``dpo`` objective for
``--dpo_steps`` steps, the SFT model as its frozen reference (`jaxformer.train.dpo_run.DPOLoss`, the
trainer's step and hook). On 256 held-out pairs of a validation and of a test set (hyper-parameters
chosen on validation) it reports, per seed: the reward accuracy, the mean
chosen and rejected log-ratios ``log π/π_ref`` before and after DPO, greedy exact-reversal rates of
the SFT and the DPO model, and the DPO model's win rate against the SFT model (per prompt, the
model whose greedy output matches the reversal at more positions wins; a tie counts one half).
Mean ± standard error over seeds. Prints JSON (and writes ``--out``), then a table.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxformer.config import ModelConfig
from jaxformer.data.preference import decoder_pair
from jaxformer.decode import generate
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.objectives.causal import prepare_sft
from jaxformer.objectives.dpo import DPOOptions, dpo_sums, prepare_dpo
from jaxformer.train.dpo_run import DPOLoss
from jaxformer.train.state import TrainState
from jaxformer.train.step import StepHooks, make_train_step
from jaxformer.vocab import SpecialTokens

PAD, EOS, BOS, FIRST, SYMBOLS = 0, 1, 2, 3, 12
SEQ_LEN = 2 * (1 + 7 + 7 + 1)  # the longest pair: two halves of <s> prompt response </s>
SPECIAL = SpecialTokens(vocab_size=FIRST + SYMBOLS, pad_id=PAD, eos_id=EOS, bos_id=BOS)


def pairs(rng: np.random.Generator, n: int, lengths: tuple[int, int] = (4, 7)
          ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``n`` (prompt, chosen = reversed, rejected = a shuffle other than the reversal), prompts of
    ``lengths[0]``–``lengths[1]`` distinct symbols (at most 7: `SEQ_LEN`)."""
    out = []
    for _ in range(n):
        size = int(rng.integers(lengths[0], lengths[1] + 1))
        prompt = rng.choice(SYMBOLS, size=size, replace=False) + FIRST
        rejected = prompt[::-1]
        while np.array_equal(rejected, prompt[::-1]):
            rejected = rng.permutation(prompt)
        out.append((prompt, prompt[::-1].copy(), rejected))
    return out


def _pad(rows: list[dict], length: int) -> dict:
    return {k: jnp.asarray(np.stack([np.pad(r[k], (0, length - len(r[k]))) for r in rows]))
            for k in rows[0]}


def dpo_batch(batch_pairs) -> dict:
    """One unpacked row per pair (`jaxformer.data.preference.decoder_pair`)."""
    bos = np.array([BOS], np.int32)
    return _pad([decoder_pair(*p, bos=bos, eos=EOS, seq_len=SEQ_LEN)[0] for p in batch_pairs],
                SEQ_LEN)


def sft_batch(batch_pairs) -> dict:
    """``<s> prompt chosen </s>`` rows, the loss on the response and its EOS."""
    rows = []
    for prompt, chosen, _ in batch_pairs:
        tokens = np.concatenate([[BOS], prompt, chosen, [EOS]])
        mask = np.concatenate([np.zeros(1 + len(prompt)), np.ones(len(chosen) + 1)])
        rows.append({"inputs": tokens.astype(np.int32), "inputs_loss_mask": mask.astype(np.int32)})
    return _pad(rows, SEQ_LEN // 2)


def model_and_params(seed: int):
    cfg = ModelConfig.from_dict(preset("gpt_tiny", vocab_size=FIRST + SYMBOLS, max_len=SEQ_LEN,
                                       dropout_rate=0.0))
    model = build_model(cfg)
    return model, model.init(jax.random.key(seed))


def train(model, params, step_fn_args, batches, lr: float, frozen=None):
    """``params`` after one optimizer step per batch of ``batches`` (Adam, constant ``lr``)."""
    prepare, hooks = step_fn_args
    tx = optax.adam(lr)
    step = jax.jit(make_train_step(model, tx, prepare, lambda s: lr, hooks=hooks))
    state = TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params),
                       rng=jax.random.key_data(jax.random.key(0)))
    metrics = []
    for batch in batches:
        state, m = step(state, batch, frozen)
        metrics.append(jax.tree.map(float, m))
    return state.params, metrics


def greedy(model, params, held) -> list[list[int]]:
    prompts = [[BOS, *p.tolist()] for p, _, _ in held]
    return generate(model, params, prompts, max_new_tokens=8, eos_id=EOS).sequences(EOS)


def matches(out: list[int], want: np.ndarray) -> int:
    return sum(a == b for a, b in zip(out, want.tolist())) - abs(len(out) - len(want))


def run(seed: int, sft_steps: int = 40, dpo_steps: int = 60, beta: float = 0.1,
        batch_size: int = 32, sft_lr: float = 3e-3, dpo_lr: float = 1e-3, held_out: int = 256,
        lengths: tuple[int, int] = (4, 7)) -> dict:
    """One seed: SFT, then DPO; held-out metrics (module docstring)."""
    rng = np.random.default_rng(seed)
    model, params = model_and_params(seed)
    sft_prepare = lambda b, k: prepare_sft(b, k, SPECIAL)
    sft, _ = train(model, params, (sft_prepare, StepHooks()),
                   (sft_batch(pairs(rng, batch_size, lengths)) for _ in range(sft_steps)), sft_lr)
    options = DPOOptions(dpo_beta=beta)
    dpo_prepare = lambda b, k: prepare_dpo(b, k, SPECIAL)
    policy, log = train(model, sft, (dpo_prepare, StepHooks(loss=DPOLoss(options))),
                        (dpo_batch(pairs(rng, batch_size, lengths)) for _ in range(dpo_steps)), dpo_lr,
                        frozen=sft)
    out = {"seed": seed, "train_loss_first": log[0]["loss"], "train_loss_last": log[-1]["loss"],
           "train_reward_accuracy_first": log[0]["rewards_accuracies"],
           "train_reward_accuracy_last": log[-1]["rewards_accuracies"]}
    for split, offset in (("val", 10_000), ("test", 20_000)):
        held = pairs(np.random.default_rng(offset + seed), held_out, lengths)
        out.update({f"{split}_{k}": v for k, v in evaluate(model, policy, sft, held, options).items()})
    return out


def evaluate(model, policy, sft, held, options: DPOOptions) -> dict:
    """Held-out reward accuracy, mean log-ratios, exact reversals and the greedy win rate."""
    prepared = prepare_dpo(dpo_batch(held), None, SPECIAL)
    sums = jax.tree.map(float, dpo_sums(model, policy, sft, prepared, options))
    n, beta = sums["weight"], options.dpo_beta
    sft_out, dpo_out = greedy(model, sft, held), greedy(model, policy, held)
    wins = [1.0 if matches(d, c) > matches(s, c) else 0.5 if matches(d, c) == matches(s, c) else 0.0
            for s, d, (_, c, _) in zip(sft_out, dpo_out, held)]
    exact = lambda outs: float(np.mean([o == c.tolist() for o, (_, c, _) in zip(outs, held)]))
    return {"reward_accuracy": sums["correct"] / n,
            "chosen_log_ratio": sums["rewards_chosen"] / n / beta,
            "rejected_log_ratio": sums["rewards_rejected"] / n / beta,
            "sft_exact": exact(sft_out), "dpo_exact": exact(dpo_out),
            "win_rate_vs_sft": float(np.mean(wins))}


def mean_sem(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n); 0 for one value)."""
    return statistics.mean(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0)


def main(argv):
    del argv
    f = flags.FLAGS
    lengths = (int(f.prompt_lengths[0]), int(f.prompt_lengths[1]))
    runs = [run(int(s), f.sft_steps, f.dpo_steps, f.beta, dpo_lr=f.dpo_lr, lengths=lengths)
            for s in f.seeds]
    keys = [k for k in runs[0] if k != "seed"]
    summary = {k: mean_sem([r[k] for r in runs]) for k in keys}
    report = {"config": {"sft_steps": f.sft_steps, "dpo_steps": f.dpo_steps, "beta": f.beta,
                         "dpo_lr": f.dpo_lr, "prompt_lengths": list(lengths),
                         "seeds": [int(s) for s in f.seeds]}, "runs": runs,
              "mean_sem": summary}
    print(json.dumps(report))
    if f.out:
        Path(f.out).write_text(json.dumps(report, indent=1) + "\n")
    print(f"{'metric':<30} {'mean':>9} {'± SE':>8}")
    for k, (m, se) in summary.items():
        print(f"{k:<30} {m:>9.3f} {se:>8.3f}")


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_list("seeds", ["0", "1", "2"], "seeds (data, init)")
    flags.DEFINE_integer("sft_steps", 40, "SFT steps before DPO")
    flags.DEFINE_integer("dpo_steps", 60, "DPO steps")
    flags.DEFINE_float("beta", 0.1, "DPO β")
    flags.DEFINE_float("dpo_lr", 1e-3, "DPO learning rate (Adam, constant)")
    flags.DEFINE_list("prompt_lengths", ["4", "7"], "shortest, longest prompt (symbols, ≤ 7)")
    flags.DEFINE_string("out", "", "also write the JSON here")
    app.run(main)
