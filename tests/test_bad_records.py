"""Issue 60: a bad record on line 13 of the train file stops ``train.py`` before its first step, for
every data task that reads the user's records (seq2seq and SFT pairs, language-model text, MLM,
span corruption, extractive QA, cloze; classification: tests/test_own_data.py), in one line naming
``train.<ext>:13``, exit status 2 (refused: docs/training.md, "Exit statuses") and no workdir.
Before, set-up read only the tokenizer's first texts (the first 256 records) and a classifier's
labels: a QA answer off its offset, an empty target, a missing field, a cloze label outside
``label_names``, or any bad record past line 256, was met by the data pipeline mid-run."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WORDS = "river city king poem war island film song tower bridge lake ship".split()
# the run never starts (the check comes before compilation): sizes keep the tokenizer quick
TINY = ["--config.data.tokenizer.vocab_size=320", "--config.model.vocab_size=320",
        "--config.data.tokenizer.max_train_texts=8", "--config.progress_bar=False",
        "--config.num_train_steps=30"]


def _sentence(i: int) -> str:
    return " ".join(WORDS[(i * k) % len(WORDS)] for k in range(1, 6))


def _qa(i: int) -> str:
    context = f"the {WORDS[i % 12]} is near the {WORDS[(i + 5) % 12]} ."
    answer = WORDS[(i + 5) % 12]
    return json.dumps({"context": context, "question": f"where is the {WORDS[i % 12]} ?",
                       "answer_text": answer, "answer_start": context.index(answer)})


# case → (config, extra flags, extension, good line i, the bad line 13, the end of the error line)
CASES = {
    "seq2seq_cells": ("configs/t5_finetune_tiny.py", [], "tsv",
                      lambda i: f"{_sentence(i)}\t{_sentence(i + 1)}", "a b\tc d\te f",
                      "3 tab-separated cells, expected 2 (('source', 'target'))"),
    "seq2seq_empty_target": ("configs/t5_finetune_tiny.py", [], "tsv",
                             lambda i: f"{_sentence(i)}\t{_sentence(i + 1)}", "a source\t ",
                             "its target is empty; give every example a target, or remove that line"),
    "sft_empty_response": ("configs/gpt_pretrain_tiny.py", ["--config.objective.name=sft"], "jsonl",
                           lambda i: json.dumps({"prompt": _sentence(i), "response": _sentence(i + 1)}),
                           json.dumps({"prompt": "a prompt", "response": ""}),
                           "its target is empty; give every example a target, or remove that line"),
    "lm_utf8": ("configs/gpt_pretrain_tiny.py", [], "txt", _sentence, b"caf\xe9 au lait",
                "not UTF-8 (invalid continuation byte at byte 3); files: sources read UTF-8 text "
                "(or .gz/.bz2/.xz of it)"),
    # past what the tokenizer reads (the first 256 records: `read_records`' first chunk), which
    # before found the others at line 13; this one was met mid-run, after a checkpoint or none
    "lm_utf8_line_613": ("configs/gpt_pretrain_tiny.py", [], "txt", _sentence, b"caf\xe9 au lait",
                         "not UTF-8 (invalid continuation byte at byte 3); files: sources read UTF-8 "
                         "text (or .gz/.bz2/.xz of it)"),
    "mlm_missing_field": ("configs/bert_pretrain_tiny.py", [], "jsonl",
                          lambda i: json.dumps({"text": _sentence(i)}), json.dumps({"txt": "a b"}),
                          "has no field 'text'; its fields are ['id', 'txt']. Set data.text_key / "
                          "label_key / source_key / target_key to the right names."),
    "span_corruption_json": ("configs/t5_pretrain_tiny.py", [], "jsonl",
                             lambda i: json.dumps({"text": _sentence(i)}), '{"text": "a b',
                             "invalid JSON (Unterminated string starting at column 10)"),
    "qa_span": ("configs/bert_qa_tiny.py", [], "jsonl", _qa,
                json.dumps({"context": "a b c", "question": "a ?", "answer_text": "b",
                            "answer_start": 40}),
                "answer_text 'b' is not at answer_start=40 of the context (found '')"),
    "cloze_label": ("configs/bert_cloze_tiny.py", ["--config.data.label_names=neg,pos"], "tsv",
                    lambda i: f"{_sentence(i)}\t{('neg', 'pos')[i % 2]}", "a b c\tneutral",
                    "label 'neutral' is not one of data.label_names=('neg', 'pos')"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_train_record_on_line_13_is_one_line_before_the_workdir(case, tmp_path):
    config, flags, ext, good, bad, message = CASES[case]
    line = 613 if case.endswith("_613") else 13
    header = {"cloze_label": ["text\tlabel"], "seq2seq_cells": ["source\ttarget"],
              "seq2seq_empty_target": ["source\ttarget"]}.get(case, [])
    for split, n in (("train", 1000), ("validation", 6)):  # more than the first batches set-up reads
        lines = [h.encode() for h in header] + [good(i).encode() for i in range(n)]
        if split == "train":
            lines[line - 1] = bad if isinstance(bad, bytes) else bad.encode()
        (tmp_path / f"{split}.{ext}").write_bytes(b"\n".join(lines) + b"\n")
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "train.py", "--config", config, f"--workdir={workdir}",
         f"--config.data.source=files:{tmp_path}/{{split}}.{ext}", *TINY, *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (case, proc.stderr[-3000:])
    assert out[-1].startswith("train.py: error: ") and f"train.{ext}:{line}" in out[-1], out[-1]
    assert out[-1].endswith(message), out[-1]
    assert not workdir.exists()
