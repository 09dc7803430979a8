"""The docs stay true: docs/extending.md's paths exist, the modules it names import, its map lists
every test file; docs/huggingface.md's snippets run as a user copies them."""

from __future__ import annotations

import dataclasses
import importlib
import json
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


# Every fenced block of README.md and docs/*.md ------------------------------------------------------
#
# A block's language says what it is: ``python`` and ``bash`` are what a user copies, ``console`` a
# transcript whose ``$ `` lines are commands, ``text`` a layout or an output (not run). An HTML comment
# on the line before the fence changes how a block is tested, and says why:
#   <!-- doc-test: skip (why) -->             not run at all
#   <!-- doc-test: skip-lines make pip (why) -->  those programs' lines not run, the others are
#   <!-- doc-test: given <python> -->         python: defines the names a fragment takes as given
#   <!-- doc-test: continues -->              python: runs on in the page's previous block's names
#   <!-- doc-test: tiny -->                   python: gpt2_small / t5_small built as *_tiny here
#   <!-- doc-test: slow (why) -->             python needing a trained run: the fast tier runs its
#                                             imports; a slow test runs the whole block
# Fast tier: every python block runs (`_python_blocks_driver`), every command line is read by its
# own program's argument parser and stops there (tests/dry_run.py: flags, config file, overrides).

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = ("python", "bash", "console", "text")
MARKER = re.compile(r"^<!-- doc-test: ([\w-]+)(?: (.*?))? -->$")
MAX_SKIPPED = 3  # whole blocks not run, each with its reason in the page


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the root
    line: int  # of the opening fence
    lang: str
    text: str
    marks: tuple[tuple[str, str], ...] = ()  # the doc-test markers above it: (keyword, the rest)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"

    def has(self, mark: str) -> bool:
        return any(k == mark for k, _ in self.marks)

    def arg(self, mark: str) -> str:
        return next((a for k, a in self.marks if k == mark), "")


def doc_blocks() -> list[Block]:
    """Every fenced block of the README and docs/*.md, in order, with its doc-test marker."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.M | re.S):
            before = text[:m.start()].splitlines()
            marks = []
            while before and MARKER.match(before[-1]):  # the marker lines right above the fence
                marks.insert(0, MARKER.match(before.pop()).groups(""))
            out.append(Block(str(page.relative_to(ROOT)), text[:m.start()].count("\n") + 1,
                             m.group(1), m.group(2), tuple(marks)))
    return out


BLOCKS = doc_blocks()


def _reason(block: Block, mark: str) -> str:
    """The parenthesised reason of a skip marker ("" if none)."""
    found = re.search(r"\((.+)\)\s*$", block.arg(mark), re.S)
    return found.group(1).strip() if found else ""


def test_every_block_says_what_it_is_and_every_skip_why():
    assert len(BLOCKS) >= 38  # the reader finds the pages' blocks
    unlabelled = [str(b) for b in BLOCKS if b.lang not in LANGUAGES]
    assert not unlabelled, f"label these blocks with one of {LANGUAGES}: {unlabelled}"
    marks = {"skip", "skip-lines", "given", "continues", "tiny", "slow"}
    unknown = [f"{b}: {k}" for b in BLOCKS for k, _ in b.marks if k not in marks]
    assert not unknown, unknown
    python_only = [str(b) for b in BLOCKS if b.lang != "python" and any(
        b.has(k) for k in ("given", "continues", "tiny", "slow"))]
    assert not python_only, python_only
    no_reason = [f"{b}: {k}" for b in BLOCKS for k, _ in b.marks
                 if k in ("skip", "skip-lines", "slow") and not _reason(b, k)]
    assert not no_reason, f"a skip states why, '(...)' at the marker's end: {no_reason}"
    skipped = [str(b) for b in BLOCKS if b.has("skip")]
    assert len(skipped) <= MAX_SKIPPED, f"{len(skipped)} blocks skipped: {skipped}"


def _python_of(argv: list[str]) -> list[str] | None:
    """What follows ``python`` in a command line (``["train.py", ...]``, ``["-m", "mod", ...]``),
    for ``python …``, ``jaxformer-<command> …`` (the console scripts) and those run by ``srun …``
    or in ``gcloud … --command="cd … && python …"``, environment assignments dropped; None for
    another program."""
    import shlex

    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
        argv = argv[1:]
    if not argv:
        return None
    if argv[0] == "gcloud":
        inner = next(a.partition("=")[2] for a in argv if a.startswith("--command="))
        found = [_python_of(shlex.split(part)) for part in inner.split("&&")]
        return next((f for f in found if f), None)
    if argv[0] == "srun":
        return next((_python_of(argv[i:]) for i, a in enumerate(argv) if a.endswith("python")), None)
    if argv[0].startswith("jaxformer-"):
        return ["-m", f"jaxformer.cli.{argv[0].removeprefix('jaxformer-')}", *argv[1:]]
    if argv[0] in ("python", "python3") or argv[0].endswith("/python"):
        return argv[1:]
    return None


def block_commands(block: Block) -> tuple[list[list[str]], list[str]]:
    """(the block's command lines as after ``python``, the lines not run: `skip-lines`' programs).
    A ``train.py ...`` line takes ``--config`` and ``--workdir`` from the block's train.py line
    above it (what ``...`` stands for)."""
    import shlex

    text = block.text
    if block.lang == "console":
        text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ "))
    skip = block.arg("skip-lines").split("(")[0].split()
    run, skipped, last_train = [], [], []
    for argv in commands(text):
        if argv[0] in skip:
            skipped.append(shlex.join(argv))
            continue
        python = _python_of(argv)
        assert python, f"{block}: {shlex.join(argv)!r}: which program? (skip-lines it, with why)"
        if python[0] == "train.py" and "..." in python:
            i = python.index("...")
            python = [*python[:i], *last_train, *python[i + 1:]]
        if python[0] == "train.py":
            last_train = [a for k in ("--config", "--workdir") if k in python
                          for a in python[python.index(k):python.index(k) + 2]]
        run.append(python)
    return run, skipped


# Whole command lines quoted in the prose (a benchmark's, a training run's, the demo's); the
# commands named in passing (`python -m jaxformer.cli.predict --refill`) and lines with
# placeholders (<name>, N, …, [optional]) are not.
INLINE = re.compile(r"`(python (?:bench/|train\.py --config |-m demo )[^`]*)`")
PLACEHOLDER = re.compile(r"<|…|\.\.\.|\[|\bN\b|\bW\b|\bPRESET\b|configs/X\.py")


def inline_commands() -> dict[tuple[str, ...], str]:
    """The whole command lines quoted in the pages' prose (`INLINE`), as after ``python``."""
    import shlex

    out = {}
    for page in PAGES:
        text = page.read_text()
        prose = re.sub(r"^```.*?^```", lambda m: "\n" * m.group().count("\n"), text, flags=re.M | re.S)
        for m in INLINE.finditer(prose):
            if not PLACEHOLDER.search(m.group(1)):
                where = f"{page.relative_to(ROOT)}:{prose[:m.start()].count(chr(10)) + 1}"
                out.setdefault(tuple(shlex.split(m.group(1))[1:]), where)
    return out


def test_every_command_line_of_the_docs_is_read_by_its_program():
    """Each command line of a bash or console block (60-odd) and each whole one quoted in the prose
    (`inline_commands`, 20-odd), read by its program's own argument parser and, for train.py, its
    config file with the overrides, checked whole (tests/dry_run.py), in one process: stale flags,
    renamed config keys and ill-typed overrides fail here."""
    cmds = {}
    for block in BLOCKS:
        if block.lang in ("bash", "console") and not block.has("skip"):
            for argv in block_commands(block)[0]:
                cmds.setdefault(tuple(argv), str(block))
    assert len(cmds) > 40
    inline = inline_commands()
    assert len(inline) > 10
    cmds = {**inline, **cmds}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "dry_run.py")],
                          input=json.dumps([list(a) for a in cmds]), cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cmds), proc.stderr[-3000:]
    failed = [f"{cmds[tuple(r['argv'])]}: {' '.join(r['argv'])}\n    {r['error']}"
              for r in results if r["error"]]
    assert not failed, "\n".join(failed)


_PYTHON_DRIVER = r'''
import ast, json, sys
ns = {}
for block in json.load(sys.stdin):
    tree = ast.parse(block["code"])
    imports = [isinstance(n, (ast.Import, ast.ImportFrom)) for n in tree.body] + [False]
    if block["imports_only"]:
        tree.body = [n for n, i in zip(tree.body, imports) if i]
    first = imports.index(False)  # the given names come after the block's own imports
    tree.body[first:first] = ast.parse(block["given"]).body
    if not block["continues"]:
        ns = {"__name__": "__main__"}
    try:
        exec(compile(tree, block["where"], "exec"), ns)
        print(json.dumps({"where": block["where"], "error": None}), flush=True)
    except Exception as e:
        print(json.dumps({"where": block["where"], "error": f"{type(e).__name__}: {e}"}), flush=True)
'''
TINY_PRESETS = {'"gpt2_small"': '"gpt_tiny"', '"t5_small"': '"t5_tiny"'}


def _python_job(block: Block) -> dict:
    code = block.text
    if block.has("tiny"):
        for big, tiny in TINY_PRESETS.items():
            code = code.replace(big, tiny)
    return {"where": str(block), "code": code, "given": block.arg("given"),
            "continues": block.has("continues"), "imports_only": block.has("slow")}


def test_every_python_block_of_the_docs_runs():
    """Each python block runs as written (fragments with the names they take as given, presets
    shrunk where marked tiny); blocks that need a trained run (marked slow) import what they use
    here, and run whole in `test_the_readme_quickstart_runs_as_written`."""
    jobs = [_python_job(b) for b in BLOCKS if b.lang == "python" and not b.has("skip")]
    assert len(jobs) >= 10
    proc = subprocess.run([sys.executable, "-c", _PYTHON_DRIVER], input=json.dumps(jobs), cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(jobs), proc.stderr[-3000:]
    failed = [f"{r['where']}: {r['error']}" for r in results if r["error"]]
    assert not failed, "\n".join(failed)


def test_the_readmes_first_snippet_runs_whole():
    """Issue 61: README's first snippet used ``logits``, ``labels`` and ``weights`` without defining
    them (a ``given`` marker supplied them here, not to a user). It carries no marker: the run above
    executes it as a user copies it, every name its own."""
    first = next(b for b in BLOCKS if b.page == "README.md" and b.lang == "python")
    assert "weighted_cross_entropy" in first.text, first  # the layers' snippet, not another
    assert not first.marks, f"{first}: runs whole, as copied; no {first.marks}"


def _block(page: str, lang: str, needle: str) -> Block:
    """The block of ``page`` in ``lang`` holding ``needle``."""
    found = [b for b in BLOCKS if b.page == page and b.lang == lang and needle in b.text]
    assert len(found) == 1, (page, needle, [str(b) for b in found])
    return found[0]


@pytest.mark.slow  # 3 training runs, 2 conversions, evaluate, predict, 2 generations: minutes on 2 cores
def test_the_readme_quickstart_runs_as_written(tmp_path):
    """The README's commands and snippets after its training block, in a user's directory, in order,
    only the run sizes appended to train.py lines (`SHRINK`): train, evaluate, predict, generate
    (the README's and docs/generation.md's python blocks, marked slow, and the latter's first
    command line), convert both ways (the import from a small random Llama directory)."""
    from test_fast_tokenizer import build_llama2_tokenizer
    from test_llama_sft import _llama_directory

    (tmp_path / "train.py").symlink_to(ROOT / "train.py")
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "reviews.txt").write_text("a fine film , well acted .\na dull film .\n")
    _llama_directory(tmp_path / "path/to/llama", build_llama2_tokenizer, vocab_size=400)

    def run_line(argv: list[str]) -> subprocess.CompletedProcess:
        return _run(["python", *_python_of(argv)], tmp_path)

    for page, lang, needle in (("README.md", "bash", "gpt_finetune_tiny.py"),
                               ("README.md", "bash", "jaxformer-evaluate"),
                               ("README.md", "python", "load_for_inference"),
                               ("docs/generation.md", "python", "load_for_inference"),
                               ("README.md", "bash", "jaxformer-convert")):
        block = _block(page, lang, needle)
        if lang == "python":
            (tmp_path / "snippet.py").write_text(block.text + "\nprint(texts)\n")
            assert run_line(["python", "snippet.py"]).stdout.strip(), block
        else:
            for argv in commands(block.text):
                run_line(argv)
    assert (tmp_path / "preds.jsonl").read_text().count("\n") == 2
    assert (tmp_path / "exported/config.json").is_file()
    assert (tmp_path / "runs/llama_imported").is_dir()
    first = commands(_block("docs/generation.md", "bash", "ROMEO").text)[0]  # runs/gpt
    assert run_line(first).stdout.strip()
