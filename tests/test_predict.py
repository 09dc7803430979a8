"""``python -m jaxformer.cli.predict``: JSONL predictions of a file, in input order, equal to the model's
own outputs (a direct softmax of its logits; `generate_text`) on the same examples."""

from __future__ import annotations

import json
import random
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.checkpoint import load_for_inference
from jaxformer.cli.predict import main
from jaxformer.decode import generate_text
from jaxformer.models import build_model
from jaxformer.train.config import load_config
from jaxformer.train.loop import train_and_evaluate

ROOT = Path(__file__).resolve().parents[1]
WORDS = "the cat dog sat ran on a mat log big small red blue good bad".split()
TINY = {"model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64, "model.num_layers": 1,
        "model.max_len": 64, "model.vocab_size": 320, "data.tokenizer.vocab_size": 320,
        "data.seq_len": 16, "data.batch_size": 8, "optimizer.warmup_steps": 2,
        "num_train_steps": 6, "checkpoint.every_steps": 3, "eval.every_steps": 3,
        "eval.num_batches": 1, "progress_bar": False, "log_every_steps": 3}


def sentence(rnd: random.Random) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(2, 14)))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A tiny GPT language model (text file) and a tiny GPT classifier (TSV, named labels)."""
    tmp, rnd = tmp_path_factory.mktemp("predict"), random.Random(0)
    (tmp / "corpus.txt").write_text("\n".join(sentence(rnd) for _ in range(300)))
    rows = [(s, "pos" if "good" in s else "neg") for s in (sentence(rnd) for _ in range(300))]
    (tmp / "labelled.tsv").write_text("text\tlabel\n" + "\n".join(f"{t}\t{y}" for t, y in rows))
    lm = load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", {
        **TINY, "data.source": f"files:{tmp / 'corpus.txt'}", "data.long_examples": "truncate",
        "checkpoint.best_metric": ""})
    train_and_evaluate(lm, tmp / "lm")
    clf = load_config(ROOT / "configs" / "gpt_finetune_tiny.py", {
        **TINY, "data.source": f"files:{tmp / 'labelled.tsv'}", "data.label_key": "label",
        "data.label_names": ("neg", "pos")})
    train_and_evaluate(clf, tmp / "clf")
    return tmp


def predictions(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_classification_rows_are_the_softmax_of_the_logits_in_input_order(runs, tmp_path):
    rnd = random.Random(1)
    texts = [sentence(rnd) for _ in range(11)] + [" ".join(["good"] * 40)]  # one truncated
    (tmp_path / "in.tsv").write_text("text\n" + "\n".join(texts) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["--workdir", str(runs / "clf"), "--input", str(tmp_path / "in.tsv"),
                 "--output", str(out), "--batch_size", "5", "--best"]) == 0
    rows = predictions(out)
    assert [r["id"] for r in rows] == [f"in.tsv:{n}" for n in range(2, 14)]
    assert [r["text"] for r in rows] == texts
    model_cfg, params, tok = load_for_inference(runs / "clf", best=True)  # what --best reads
    model = build_model(model_cfg)
    for text, row in zip(texts, rows):  # "eos" framing: text </s>, cut to seq_len keeping </s>
        ids = tok.encode(text)[:15] + [tok.special.eos_id]
        tokens = np.zeros((1, 16), np.int32)
        tokens[0, :len(ids)] = ids
        logits = model.apply(params, tokens=jnp.asarray(tokens),
                             positions=jnp.arange(16)[None], segment_ids=jnp.asarray(tokens != 0,
                                                                                     jnp.int32))
        want = np.asarray(jax.nn.softmax(logits.astype(jnp.float32))[0])
        got = np.array([row["probabilities"]["neg"], row["probabilities"]["pos"]])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert row["label"] == ("neg", "pos")[int(np.argmax(want))]
    # the same lines shuffled: the same prediction for each text
    shuffled = texts[::-1]
    (tmp_path / "shuffled.tsv").write_text("text\n" + "\n".join(shuffled) + "\n")
    out2 = tmp_path / "out2.jsonl"
    assert main(["--workdir", str(runs / "clf"), "--input", str(tmp_path / "shuffled.tsv"),
                 "--output", str(out2), "--batch_size", "4", "--best"]) == 0
    again = {r["text"]: r["probabilities"] for r in predictions(out2)}
    for row in rows:
        assert again[row["text"]] == pytest.approx(row["probabilities"], abs=1e-6)


@pytest.mark.slow
def test_stdout_holds_only_rows_and_the_log_names_the_input(runs, tmp_path, capsys):
    """Issue 45: the data log named the run's training source, and went to stdout between the
    JSONL rows. It goes to stderr and names the input file."""
    path = tmp_path / "my.txt"
    path.write_text("the good dog\nthe bad cat\n")
    capsys.readouterr()
    assert main(["--workdir", str(runs / "clf"), "--input", str(path)]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["id"] for line in captured.out.splitlines()] == ["my.txt:1", "my.txt:2"]
    assert f"data predict: 2 examples in --input {str(path)!r}" in captured.err
    assert "labelled.tsv" not in captured.err
    assert "example/s" not in captured.err  # stderr is no terminal: no bar (--progress_bar=auto)
    assert main(["--workdir", str(runs / "clf"), "--input", str(path), "--progress_bar",
                 "true"]) == 0
    assert "predict: 100%" in capsys.readouterr().err


@pytest.mark.slow
def test_language_model_rows_equal_generate_text_in_input_order(runs, tmp_path, capsys):
    rnd = random.Random(2)
    texts = [sentence(rnd) for _ in range(7)]
    (tmp_path / "prompts.txt").write_text("\n\n".join(texts[:2]) + "\n" + "\n".join(texts[2:]))
    out = tmp_path / "out.jsonl"
    assert main(["--workdir", str(runs / "lm" / "checkpoints" / "3"), "--input",
                 str(tmp_path / "prompts.txt"), "--output", str(out), "--batch_size", "3",
                 "--max_new_tokens", "5"]) == 0
    rows = predictions(out)
    assert [r["input"] for r in rows] == texts
    assert [r["id"] for r in rows] == ["prompts.txt:1", "prompts.txt:3"] + [
        f"prompts.txt:{n}" for n in range(4, 9)]
    model_cfg, params, tok = load_for_inference(runs / "lm", step=3)
    want = generate_text(build_model(model_cfg), params, tok, texts, max_new_tokens=5)
    assert [r["output"] for r in rows] == want
    # --refill (finished rows take the next input every 16 steps): the same rows
    assert main(["--workdir", str(runs / "lm" / "checkpoints" / "3"), "--input",
                 str(tmp_path / "prompts.txt"), "--output", str(tmp_path / "refill.jsonl"),
                 "--batch_size", "3", "--max_new_tokens", "5", "--refill"]) == 0
    assert predictions(tmp_path / "refill.jsonl") == rows
    # bad input: one line on stderr, exit status 2
    for args, message in [(["--step", "4"], "has no step 4: its steps are [3, 6]"),
                          (["--best"], "kept no best checkpoint")]:
        capsys.readouterr()
        assert main(["--workdir", str(runs / "lm"), "--input", str(tmp_path / "prompts.txt"),
                     *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("python -m jaxformer.cli.predict: error: ") and message in err, err


def test_generation_logs_its_input_as_classification_does(runs, tmp_path, capsys):
    """Issue 60: seq2seq and LM ``predict`` printed no ``data predict: …`` line; the classifier's
    pipeline does."""
    path = tmp_path / "prompts.txt"
    path.write_text("the good dog\nthe bad cat\n")
    capsys.readouterr()
    assert main(["--workdir", str(runs / "lm"), "--input", str(path), "--max_new_tokens", "2"]) == 0
    assert f"data predict: 2 examples in --input {str(path)!r}" in capsys.readouterr().err


def test_a_workdir_typo_names_the_run_meant(runs, tmp_path, capsys):
    """Issue 60: a data-path typo got "did you mean", a workdir typo did not (predict, evaluate)."""
    from jaxformer.evaluate_run import evaluate_run

    typo = runs / "clff"
    assert main(["--workdir", str(typo), "--input", str(tmp_path / "x.txt")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"; did you mean {str(runs / 'clf')!r}?"), err
    with pytest.raises(FileNotFoundError, match=rf"does not exist; did you mean '{runs / 'clf'}'\?$"):
        evaluate_run(typo)
