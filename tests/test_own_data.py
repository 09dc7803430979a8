"""Bring your own data, as a new user does it (issue 45): a headerless 3-class TSV with train and
test files only (no validation file, no header, string labels), fine-tuned from a shipped config
with one command line of overrides (the source, its columns, a validation fraction: the labels are
named from the train split, as ``run_glue.py`` does) and scored on its test split."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LABELS = ("LOC", "HUM", "NUM")
STARTS = {"LOC": ("where is", "which country has"), "HUM": ("who wrote", "who invented"),
          "NUM": ("how many", "what year did")}
NOUNS = "river city king poem war island film song tower bridge lake ship".split()
# the model is tiny for the test's sake; the data overrides are all a user needs
TINY = ["--config.model.d_model=32", "--config.model.num_heads=2", "--config.model.d_ff=64",
        "--config.model.num_layers=1", "--config.model.max_len=32", "--config.model.vocab_size=320",
        "--config.data.tokenizer.vocab_size=320", "--config.data.seq_len=16",
        "--config.num_train_steps=30", "--config.optimizer.warmup_steps=3",
        "--config.eval.every_steps=15", "--config.checkpoint.every_steps=15"]


def _write(path: Path, n: int, rng: random.Random) -> list[str]:
    """``n`` lines ``question<TAB>label``, questions repeated as in TREC; returns the labels."""
    rows = []
    for _ in range(n):
        label = rng.choice(LABELS)
        rows.append(f"{rng.choice(STARTS[label])} the {rng.choice(NOUNS)} ?\t{label}")
    path.write_text("\n".join(rows) + "\n")
    return [r.split("\t")[1] for r in rows]


def test_a_headerless_tsv_with_train_and_test_files_reaches_a_scored_test_split(tmp_path):
    rng = random.Random(0)
    _write(tmp_path / "train.tsv", 400, rng)
    test_labels = _write(tmp_path / "test.tsv", 60, rng)
    workdir = tmp_path / "run"
    train = subprocess.run(
        [sys.executable, "train.py", "--config", "configs/bert_finetune_tiny.py",
         f"--workdir={workdir}", f"--config.data.source=files:{tmp_path}/{{split}}.tsv",
         "--config.data.columns=text,label", "--config.data.validation_from_train=0.1", *TINY],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert train.returncode == 0, train.stderr[-3000:]
    assert "(held out from its train split: data.validation_from_train=0.1)" in train.stdout
    assert "data.label_names unset: the train split's labels, sorted: HUM,LOC,NUM" in train.stdout
    assert "step/s" not in train.stderr  # stderr is no terminal: no progress-bar frames
    config = json.loads((workdir / "config.json").read_text())
    assert config["model"]["num_classes"] == 3  # from the labels, not the shipped config
    assert config["data"]["label_names"] == ["HUM", "LOC", "NUM"]  # evaluate / predict read them

    score = subprocess.run([sys.executable, "-m", "jaxformer.cli.evaluate", f"--workdir={workdir}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert score.returncode == 0, score.stderr[-3000:]
    results = json.loads((workdir / "eval" / "test_step30.json").read_text())
    m = results["metrics"]
    assert results["split"] == "test" and m["examples"] == len(test_labels)
    assert [c["name"] for c in m["per_class"]] == sorted(LABELS)
    assert [c["support"] for c in m["per_class"]] == [test_labels.count(x) for x in sorted(LABELS)]
    assert m["accuracy"] == pytest.approx(sum(m["confusion"][i][i] for i in range(3)) / 60)

    wrong = subprocess.run([sys.executable, "-m", "jaxformer.cli.evaluate", f"--workdir={workdir}",
                            "--split=dev"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert wrong.returncode != 0
    assert wrong.stderr.strip().splitlines()[-1].endswith(
        "its splits are ['train', 'validation', 'test']")


def test_a_bad_label_in_the_train_file_stops_train_py_in_one_line_before_the_workdir(tmp_path):
    """Issue 60: a label outside ``data.label_names`` on line 13 of the train TSV gave a 34-line
    traceback from inside the Grain iterator and left a workdir (``.lock``, ``config.json``,
    ``tensorboard/``, ``tokenizer.model``). Now: one line naming train.tsv:13 and the label, exit
    status 2 (refused), and no workdir."""
    rows = [f"the film was {w} .\t{('neg', 'pos')[i % 2]}" for i, w in enumerate(NOUNS * 3)]
    rows[12] = rows[12].split("\t")[0] + "\tneutral"
    (tmp_path / "train.tsv").write_text("\n".join(rows) + "\n")
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "train.py", "--config", "configs/bert_finetune_tiny.py", f"--workdir={workdir}",
         f"--config.data.source=files:{tmp_path}/{{split}}.tsv", "--config.data.columns=text,label",
         "--config.data.label_names=neg,pos", "--config.data.validation_from_train=0.1", *TINY],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "record train.tsv:13: label 'neutral' is not one of data.label_names=('neg', 'pos')"), (
        proc.stderr[-3000:])
    assert not workdir.exists()


def test_a_bad_record_met_during_training_names_it_and_the_run_resumes(tmp_path):
    """Issue 60: a bad record past what set-up read surfaced as a traceback from inside the Grain
    iterator. Set-up now reads every record of a ``files:`` train split
    (tests/test_bad_records.py), so a record goes bad mid-run here by rewriting line 590 in place
    after set-up (as a TFDS record, not read at set-up, would be met): the run stops with
    `BadRecord` naming train.jsonl:590, after its checkpoints, which ``train.py`` prints as one line
    with ``resume_point()`` (exit status 1)."""
    from jaxformer.data.builders.user_files import BadRecord
    from jaxformer.train.config import load_config
    from jaxformer.train.loop import Trainer

    rng = random.Random(0)
    for split, n in (("train", 600), ("validation", 20)):
        rows = [json.dumps({"text": " ".join(rng.choice(NOUNS) for _ in range(rng.randint(4, 10)))})
                for _ in range(n)]
        (tmp_path / f"{split}.jsonl").write_text("\n".join(rows) + "\n")
    config = load_config(ROOT / "configs/gpt_pretrain_tiny.py", {
        "data.source": f"files:{tmp_path}/{{split}}.jsonl", "num_train_steps": 100,
        "data.tokenizer.max_train_texts": 10, "data.tokenizer.vocab_size": 320,
        "model.vocab_size": 320, "model.num_layers": 1, "model.d_model": 16, "model.num_heads": 2,
        "model.d_ff": 32, "data.seq_len": 16, "eval.every_steps": 1000,
        "checkpoint.every_steps": 20, "optimizer.warmup_steps": 2, "progress_bar": False})
    workdir = tmp_path / "run"
    trainer = Trainer(config, workdir)
    train = tmp_path / "train.jsonl"
    lines = train.read_bytes().split(b"\n")
    lines[589] = b'{"text": "the river' + b" " * (len(lines[589]) - 19)  # unterminated, same length
    train.write_bytes(b"\n".join(lines))  # the same byte offsets: the source's index stays valid
    with pytest.raises(BadRecord) as e:
        trainer.run()
    steps = sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps and str(e.value) == (
        f"train.jsonl:590 ({train}): invalid JSON (Unterminated string starting at column 10)")
    assert trainer.ckpt.resume_point() == (
        f"the last good checkpoint is step {steps[-1]} (rerunning the command resumes there)")
