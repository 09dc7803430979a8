"""LoRA vs full fine-tuning on one real task: GPT sentiment classification (movie_sentiment).

    python bench/lora_vs_full.py [--pretrain_steps 1200] [--finetune_steps 400] [--seeds 0,1,2] \
        [--out bench/results/lora_vs_full.json]

One tiny GPT pretraining run (configs/gpt_pretrain_tiny.py, shortened), then for each seed the same
fine-tuning config (configs/gpt_finetune_tiny.py, ``init_from`` the pretraining run) twice: full
fine-tuning and LoRA (``optimizer.lora.rank``, targets q/k/v/o + FFN, the classifier trained
whole), in the same process on the same machine. Reported per method: validation and test
accuracy of the last step (mean ± standard error over seeds; hyper-parameters are chosen on
validation only), trainable parameters, and seconds per step (wall time of `Trainer.run` over its
steps: compilation and the evaluations included, the same for both methods). Prints JSON (also
written to ``--out``), then a table.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from absl import app, flags

from jaxformer.host import skip_absent_tpu
from jaxformer.models import lora
from jaxformer.train.config import load_config, set_key
from jaxformer.train.loop import Trainer, train_and_evaluate

skip_absent_tpu()  # no failed libtpu start-up on a CPU host (jaxformer.host)

ROOT = Path(__file__).resolve().parents[1]
flags.DEFINE_integer("pretrain_steps", 1200, "pretraining updates (configs/gpt_pretrain_tiny.py's)")
flags.DEFINE_integer("finetune_steps", 400, "fine-tuning updates per run (gpt_finetune_tiny.py's)")
flags.DEFINE_string("seeds", "0,1,2", "fine-tuning seeds")
flags.DEFINE_integer("rank", 8, "LoRA rank")
flags.DEFINE_float("lora_lr", 3e-3, "LoRA peak learning rate (full fine-tuning: the config's)")
flags.DEFINE_string("workdir", "", "where to write the runs (default: a temporary directory)")
flags.DEFINE_string("out", "", "also write the JSON here")
flags.DEFINE_list("methods", ["full", "lora"], "which of full, lora to run")

def _finetune(init_from: Path, workdir: Path, seed: int, method: str) -> dict:
    overrides = {"init_from": str(init_from), "seed": seed,
                 "num_train_steps": flags.FLAGS.finetune_steps,
                 "eval.every_steps": flags.FLAGS.finetune_steps, "progress_bar": False,
                 "checkpoint.every_steps": flags.FLAGS.finetune_steps}
    if method == "lora":
        overrides.update({"optimizer.lora.rank": flags.FLAGS.rank,
                          "optimizer.lora.alpha": 2.0 * flags.FLAGS.rank,
                          "optimizer.lora.targets": ("query", "key", "value", "out", "ffn"),
                          "optimizer.peak_lr": flags.FLAGS.lora_lr})
    config = load_config(ROOT / "configs" / "gpt_finetune_tiny.py")
    for k, v in overrides.items():
        set_key(config, k, v)
    trainer = Trainer(config, workdir)
    trainable = lora.count(trainer.state.params)
    start = time.perf_counter()
    metrics = trainer.run()
    seconds = time.perf_counter() - start
    test = trainer.evaluate(trainer.model_params(trainer.state), split="test")
    return {"method": method, "seed": seed, "validation_accuracy": metrics.get("eval_accuracy"),
            "test_accuracy": test["eval_accuracy"], "trainable_params": trainable,
            "s_per_step": seconds / flags.FLAGS.finetune_steps}


def _mean_sem(xs: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sample std / sqrt(n); 0 for one value)."""
    sem = statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0
    return statistics.mean(xs), sem


def main(argv):
    del argv
    root = Path(flags.FLAGS.workdir or tempfile.mkdtemp(prefix="lora_vs_full_"))
    pre = root / "pretrain"
    if not (pre / "checkpoints").exists():
        config = load_config(ROOT / "configs" / "gpt_pretrain_tiny.py")
        for k, v in {"num_train_steps": flags.FLAGS.pretrain_steps, "progress_bar": False,
                     "eval.every_steps": flags.FLAGS.pretrain_steps,
                     "checkpoint.every_steps": flags.FLAGS.pretrain_steps}.items():
            set_key(config, k, v)
        train_and_evaluate(config, pre)
    rows = [_finetune(pre, root / f"{m}_{s}", s, m)
            for s in map(int, flags.FLAGS.seeds.split(",")) for m in flags.FLAGS.methods]
    summary = {}
    for m in flags.FLAGS.methods:
        mine = [r for r in rows if r["method"] == m]
        summary[m] = {f"{split}_accuracy_{stat}": value for split in ("validation", "test")
                      for stat, value in zip(("mean", "sem"),
                                             _mean_sem([r[f"{split}_accuracy"] for r in mine]))}
        summary[m] |= {"trainable_params": mine[0]["trainable_params"],
                      "s_per_step_median": statistics.median(r["s_per_step"] for r in mine),
                      "seeds": len(mine)}
    result = json.dumps({"runs": rows, "summary": summary, "rank": flags.FLAGS.rank,
                         "pretrain_steps": flags.FLAGS.pretrain_steps,
                         "finetune_steps": flags.FLAGS.finetune_steps,
                         "lora_lr": flags.FLAGS.lora_lr}, indent=1)
    print(result)
    if flags.FLAGS.out:
        Path(flags.FLAGS.out).parent.mkdir(parents=True, exist_ok=True)
        Path(flags.FLAGS.out).write_text(result + "\n")
    print(f"{'method':<6} {'validation acc.':>16} {'test acc.':>16} {'trainable':>10} {'s/step':>8}")
    for m, s in summary.items():
        print(f"{m:<6} {s['validation_accuracy_mean']:>9.3f} ± {s['validation_accuracy_sem']:.3f} "
              f"{s['test_accuracy_mean']:>9.3f} ± {s['test_accuracy_sem']:.3f} "
              f"{s['trainable_params']:>10,} {s['s_per_step_median']:>8.4f}")


if __name__ == "__main__":
    app.run(main)
