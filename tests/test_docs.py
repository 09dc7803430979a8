"""The docs stay true: docs/extending.md's paths exist, the modules it names import, its map lists
every test file; docs/huggingface.md's snippets run as a user copies them."""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDE = (ROOT / "docs" / "extending.md").read_text()


def test_every_path_in_the_extending_guide_exists():
    paths = set(re.findall(r"`((?:jaxformer|tests|configs|bench|docs)/[\w/.\-]+?\.(?:py|md|sh))", GUIDE))
    assert len(paths) > 30  # the guide is made of paths; an empty match would test nothing
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"docs/extending.md names paths that do not exist: {missing}"


def test_every_function_the_guide_names_in_a_file_exists():
    named = set(re.findall(r"`(jaxformer/[\w/]+\.py)::(\w+)", GUIDE))
    assert named
    for path, name in sorted(named):
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert hasattr(module, name), f"docs/extending.md: {path} has no {name}"


def test_the_test_map_lists_every_test_file():
    listed = set(re.findall(r"^\| `(test_\w+\.py)` \|", GUIDE, re.M))
    files = {p.name for p in (ROOT / "tests").glob("test_*.py")}
    assert not files - listed, f"add to docs/extending.md's test map: {sorted(files - listed)}"
    assert not listed - files, f"remove from docs/extending.md's test map: {sorted(listed - files)}"


# docs/huggingface.md's snippets, run as a user copies them ------------------------------------------

HF_PAGE = ROOT / "docs" / "huggingface.md"
# sizes only, appended to each `train.py` line (the snippets' own flags are kept as written): a few
# steps of a small batch; llama_sft's 512-token rows shortened (RoPE: no position table to fit)
SHRINK = ["--config.num_train_steps=2", "--config.data.batch_size=8", "--config.eval.every_steps=2",
          "--config.eval.num_batches=1", "--config.checkpoint.every_steps=2",
          "--config.log_every_steps=1", "--config.progress_bar=False"]
SHRINK_CONFIG = {"configs/llama_sft.py": ["--config.data.seq_len=32", "--config.model.dtype=float32"]}


def snippets(page: Path, lang: str) -> list[str]:
    """The ```<lang> fenced blocks of ``page``, in order."""
    return re.findall(rf"^```{lang}\n(.*?)^```", page.read_text(), re.M | re.S)


def commands(block: str) -> list[list[str]]:
    """The command lines of a bash block: continuations joined, comments dropped (`shlex`)."""
    import shlex

    return [shlex.split(line, comments=True) for line in block.replace("\\\n", " ").splitlines()
            if shlex.split(line, comments=True)]


def test_the_snippet_reader_finds_the_pages_commands():
    blocks = snippets(HF_PAGE, "bash")
    assert len(blocks) == 4 and len(snippets(HF_PAGE, "python")) == 1
    assert [c[:2] for c in commands(blocks[2])] == [
        ["python", "train.py"], ["python", "-m"], ["python", "-m"]]


def _user_directory(tmp: Path) -> None:
    """What the worked examples' placeholders name, at those paths under ``tmp`` (the user's
    directory): tiny random checkpoints (the golden files, a Llama directory written here) with
    their tokenizers, and the data files; ``train.py`` and ``configs/`` as in a checkout."""
    import random

    from test_fast_tokenizer import build_llama2_tokenizer
    from test_hf_finetune import _pair, _review, checkpoint
    from test_llama_sft import _llama_directory, _pairs

    (tmp / "path" / "to").mkdir(parents=True)
    (tmp / "train.py").symlink_to(ROOT / "train.py")
    (tmp / "configs").symlink_to(ROOT / "configs")
    _llama_directory(tmp / "path/to/Llama-2-7b-hf", build_llama2_tokenizer, vocab_size=400)
    _pairs(tmp / "pairs.jsonl")
    checkpoint("roberta_bpe400", tmp / "path/to/roberta-base")
    checkpoint("bart_bpe400", tmp / "path/to/bart-base")
    (tmp / "data").mkdir()
    for name, row in (("reviews", _review), ("pairs", _pair)):
        rng = random.Random(0)
        for split, n in (("train", 40), ("validation", 8), ("test", 8)):
            rows = [row(rng, header=True)] + [row(rng) for _ in range(n)]
            (tmp / "data" / f"{name}_{split}.tsv").write_text("\n".join(rows) + "\n")


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    if argv[:2] == ["python", "train.py"]:
        config = argv[argv.index("--config") + 1]
        argv = [*argv, *SHRINK, *SHRINK_CONFIG.get(config, [])]
    proc = subprocess.run([sys.executable, *argv[1:]], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, (argv, proc.stderr[-3000:])
    return proc


@pytest.mark.slow  # 4 training runs, 3 conversions, 2 evaluations: minutes on 2 cores
def test_the_hugging_face_worked_examples_run_as_written(tmp_path):
    """Issue 60: the page's sampling snippet failed as written (``strategy="sample"`` needed
    ``rng``) and the RoBERTa example's ``seq_len`` 128 exceeded a small checkpoint's position
    table. Each block runs verbatim in a user's directory holding what the placeholders name, only
    the run sizes appended (`SHRINK`); the first is `test_the_hugging_face_outline_runs_as_written`."""
    _user_directory(tmp_path)
    bash, python = snippets(HF_PAGE, "bash"), snippets(HF_PAGE, "python")
    for argv in commands(bash[1]):  # LoRA SFT of a Llama checkpoint, then the merged export
        _run(argv, tmp_path)
    (tmp_path / "sample.py").write_text(python[0])  # sampling from the merged run
    proc = _run(["python", "sample.py"], tmp_path)
    assert len(proc.stdout.strip().splitlines()) >= 1, proc.stdout
    for argv in commands(bash[2]):  # the RoBERTa classifier
        proc = _run(argv, tmp_path)
        if argv[:2] == ["python", "train.py"]:  # 128 > the checkpoint's 64 positions
            assert "data.seq_len=64, the checkpoint's" in proc.stdout, proc.stdout[-3000:]
    assert (tmp_path / "exported/roberta_reviews/config.json").is_file()
    for argv in commands(bash[3]):  # BART for seq2seq
        _run(argv, tmp_path)
    assert (tmp_path / "exported/bart_pairs/config.json").is_file()


@pytest.mark.slow  # a conversion each way and a training run: about a minute on 2 cores
def test_the_hugging_face_outline_runs_as_written(tmp_path):
    """The page's first block: import a GPT-2 directory, continue its training with the matching
    sentencepiece model, export a run. Its placeholders: a tiny random GPT-2 (vocabulary 128), a
    sentencepiece model of at most 128 pieces, and ``runs/gpt``, a run (here the one this block trains)."""
    import io

    import sentencepiece as spm
    from golden import golden_copy
    from test_fast_tokenizer import CORPUS

    (tmp_path / "path" / "to").mkdir(parents=True)
    (tmp_path / "train.py").symlink_to(ROOT / "train.py")
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    golden_copy("gpt2", tmp_path / "path/to/gpt2")
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(CORPUS), model_writer=model,
                                   vocab_size=128, model_type="unigram", minloglevel=2,
                                   character_coverage=1.0, num_threads=1, hard_vocab_limit=False)
    (tmp_path / "path/to/matching_spiece.model").write_bytes(model.getvalue())
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "gpt").symlink_to(tmp_path / "runs" / "gpt2_more")
    for argv in commands(snippets(HF_PAGE, "bash")[0]):
        _run(argv, tmp_path)
    assert (tmp_path / "runs/gpt2_imported/config.json").is_file()
    assert (tmp_path / "exported/config.json").is_file()
