"""The optimized HLO of the trainer's own jitted train step, for tiny GPT, BERT and T5 with dropout
off, normalised as `step_hlo` does it; one file per family.

`step_hlo` compiles the model with a bare AdamW step; this compiles what ``train.py`` runs: the
objective's ``prepare``, the loss, the gradient and the configured optax chain, built by the trainer
(`jaxformer.train.loop.Trainer`) from configs/<family>_pretrain_tiny.py with a tiny model, for one
step. XLA dumps the module named ``*train_step*`` (the jitted step function's name: keep it), so
two trees compile the same trainer step when their files are equal:

    PYTHONPATH=/path/to/old_tree python bench/trainer_step_hlo.py /tmp/trainer_hlo_old
    PYTHONPATH=/path/to/new_tree python bench/trainer_step_hlo.py /tmp/trainer_hlo_new
    diff -r /tmp/trainer_hlo_old /tmp/trainer_hlo_new

Each family runs in a child process (XLA reads its dump flags once, at start-up).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAMILIES = ("gpt", "bert", "t5")
OVERRIDES = {"num_train_steps": 1, "log_every_steps": 1, "progress_bar": False,
             "eval.num_batches": 0, "checkpoint.every_steps": 1, "checkpoint.async_save": False,
             "checkpoint.best_metric": "", "model.d_model": 32, "model.num_heads": 2,
             "model.d_ff": 64, "model.num_layers": 1, "model.max_len": 64, "model.vocab_size": 512,
             "model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0,
             "model.ffn_dropout_rate": 0.0, "model.target_token_dropout_rate": 0.0,
             "data.tokenizer.vocab_size": 512, "data.tokenizer.max_train_texts": 1500,
             "data.seq_len": 32, "data.target_len": 16, "data.batch_size": 8}


def run_family(family: str, workdir: str) -> None:
    """One step of ``family``'s tiny pretraining (in the child process that XLA dumps)."""
    from jaxformer.host import skip_absent_tpu

    skip_absent_tpu()
    from jaxformer.train.config import load_config, set_key
    from jaxformer.train.loop import Trainer

    config = load_config(ROOT / "configs" / f"{family}_pretrain_tiny.py")
    for key, value in OVERRIDES.items():
        set_key(config, key, value)
    Trainer(config, workdir).run()


def main(out: str) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from step_hlo import normalise

    os.makedirs(out, exist_ok=True)
    for family in FAMILIES:
        with tempfile.TemporaryDirectory() as tmp:
            flags = (f"--xla_dump_to={tmp}/dump --xla_dump_hlo_as_text "
                     "--xla_dump_hlo_module_re=.*train_step.*")
            env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()}
            subprocess.run([sys.executable, __file__, "--family", family, f"{tmp}/run"], env=env,
                           check=True, stdout=subprocess.DEVNULL)
            dumps = sorted(Path(f"{tmp}/dump").glob("*train_step*after_optimizations.txt"))
            if len(dumps) != 1:
                raise RuntimeError(f"{family}: expected one optimized train_step module, got "
                                   f"{[d.name for d in dumps]}")
            text = normalise(dumps[0].read_text())
        Path(f"{out}/{family}_trainer_step.hlo").write_text(text)
        print(f"{family}_trainer_step", len(text.splitlines()), "lines")


if __name__ == "__main__":
    if sys.argv[1] == "--family":
        run_family(sys.argv[2], sys.argv[3])
    else:
        main(sys.argv[1])
