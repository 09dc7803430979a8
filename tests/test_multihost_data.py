"""Multi-host reading in real processes: two CPU processes, each reading its own slice of
pre-tokenized shards (``data.source='tokens:DIR'``, process ``i`` of 2 takes records ``i::2``),
together read every example of an epoch exactly once; one of them killed mid-epoch and restarted
from its saved iterator state continues bit for bit. (The slicing itself is checked in one process,
quickly: `tests/test_token_shards.py::test_process_slices_are_disjoint_and_complete`,
`tests/test_mixture.py::test_two_processes_read_disjoint_slices_of_every_component`.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from jaxformer.data.pipeline import DataSettings, make_dataset
from jaxformer.data.sources import get_source
from jaxformer.data.token_shards import write_token_shards
from jaxformer.data.tokenizer import Tokenizer, TokenizerSettings, train_sentencepiece

ROOT = Path(__file__).resolve().parents[1]
WORDS = "a pod reads terabytes from several corpora in fixed proportions and never waits".split()

# One reader process: rows of one epoch of its slice, one JSON line each, the iterator state saved
# (atomically, with the number of rows written) after every row, as a trainer's checkpoint would.
READER = r"""
import json, os, sys
from jaxformer.data.pipeline import DataSettings, make_dataset
from jaxformer.data.tokenizer import Tokenizer, TokenizerSettings
tokens, tok_path, pi, out, state_file, pause = sys.argv[1:7]
settings = DataSettings(source="tokens:" + tokens, seq_len=32, batch_size=2, packing=False,
                        tokenizer=TokenizerSettings(path=tok_path))
it = iter(make_dataset(settings, "train", Tokenizer.load(tok_path), seed=5, objective="clm",
                       num_epochs=1, process_index=int(pi), process_count=2))
done = 0
if os.path.exists(state_file):
    saved = json.load(open(state_file))
    it.set_state(saved["state"])
    done = saved["rows"]
    with open(out, "r+") as f:  # rows written after the state was saved are read again
        lines = f.read().splitlines()[:done]
        f.seek(0); f.truncate(); f.write("".join(l + "\n" for l in lines))
with open(out, "a") as f:
    for batch in it:
        row = batch["inputs"][0][batch["inputs_segment_ids"][0] > 0].tolist()
        f.write(json.dumps(row) + "\n"); f.flush()
        done += 1
        with open(state_file + ".tmp", "w") as s:
            json.dump({"rows": done, "state": it.get_state()}, s)
        os.replace(state_file + ".tmp", state_file)
        if float(pause):
            import time; time.sleep(float(pause))
"""


def _reader(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-c", READER, *map(str, args)], env=env, cwd=ROOT,
                            stderr=subprocess.PIPE, text=True)


@pytest.mark.slow  # three reader processes (~15 s of start-up on 2 cores)
def test_two_processes_read_an_epoch_once_and_resume_after_a_kill(tmp_path):
    r = np.random.default_rng(0)
    lines = [" ".join(r.choice(WORDS, size=r.integers(1, 14))) + f" {i}" for i in range(120)]
    (tmp_path / "c.txt").write_text("\n".join(lines) + "\n")
    tok = Tokenizer(train_sentencepiece(lines, vocab_size=320))
    tok.save(tmp_path / "tok.model")
    text = DataSettings(source=f"files:{tmp_path / 'c.txt'}",
                        tokenizer=TokenizerSettings(path=str(tmp_path / "tok.model")))
    write_token_shards(text, tok, tmp_path / "tokens", ["train"], num_shards=3)
    common = [tmp_path / "tokens", tmp_path / "tok.model"]

    first = _reader([*common, 0, tmp_path / "p0.jsonl", tmp_path / "p0.state", 0])
    killed = _reader([*common, 1, tmp_path / "p1.jsonl", tmp_path / "p1.state", 0.05])
    deadline = time.time() + 120
    while time.time() < deadline and killed.poll() is None and (
            not (tmp_path / "p1.jsonl").exists()
            or len((tmp_path / "p1.jsonl").read_text().splitlines()) < 12):
        time.sleep(0.02)
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL
    rows_at_kill = json.loads((tmp_path / "p1.state").read_text())["rows"]
    assert 12 <= rows_at_kill < 50
    rerun = _reader([*common, 1, tmp_path / "p1.jsonl", tmp_path / "p1.state", 0])
    for p in (first, rerun):
        assert p.wait(timeout=120) == 0, p.stderr.read()[-3000:]

    read = {pi: [tuple(json.loads(x)) for x in (tmp_path / f"p{pi}.jsonl").read_text().splitlines()]
            for pi in (0, 1)}
    eos = tok.special.eos_id
    everything = [tuple([*tok.encode(x["text"]), eos][:32]) for x in get_source(text, "train")]
    assert sorted(read[0] + read[1]) == sorted(everything)  # every example once, in 2 processes
    assert len(set(everything)) == len(everything)
    straight = make_dataset(DataSettings(source=f"tokens:{tmp_path / 'tokens'}", seq_len=32,
                                         batch_size=2, packing=False,
                                         tokenizer=TokenizerSettings(path=str(tmp_path / "tok.model"))),
                            "train", tok, seed=5, objective="clm", num_epochs=1, process_index=1,
                            process_count=2)
    want = [tuple(b["inputs"][0][b["inputs_segment_ids"][0] > 0].tolist()) for b in straight]
    assert read[1] == want  # killed and resumed: the uninterrupted process's rows, in order
