"""The demo's code path end to end (`demo.run_demo`) with tiny models and budgets, and
its baselines against independent computations."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from demo import DemoSettings, run_demo, t5_budget
from demo.__main__ import main
from demo.bert import low_resource_records, sentiment_records
from demo.common import load_config, parse_overrides
from demo.t5 import describe_decoding
from jaxformer.data.sources import get_source

TINY = {"model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64, "model.num_layers": 1,
        "model.max_len": 64, "model.vocab_size": 512, "data.tokenizer.vocab_size": 512,
        "data.tokenizer.max_train_texts": 1500, "data.batch_size": 8, "num_train_steps": 12,
        "optimizer.warmup_steps": 2, "eval.num_batches": 2, "progress_bar": False}
SHORT = {"data.seq_len": 32, "data.target_len": 16}


def test_low_resource_split_is_a_balanced_hash_ordered_subset():
    train = sentiment_records("train")
    subset = low_resource_records(1000)
    assert len(subset) == 1000 and len({r["id"] for r in subset}) == 1000
    assert {r["id"] for r in subset} <= {r["id"] for r in train}
    # the corpus is stored sorted by label; the hash order is not
    assert np.mean([r["label"] for r in train[:1000]]) > 0.9
    assert 0.4 < np.mean([r["label"] for r in subset]) < 0.6
    assert low_resource_records(10) == subset[:10]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The whole demo with 1-layer models, ~10 steps per run, pretraining on 600 Shakespeare
    paragraphs (hash-split by line), 64 labels, 12 test verses."""
    tmp = tmp_path_factory.mktemp("demo")
    src = get_source({"source": "shakespeare"}, "train")
    lines = [src[i]["text"].replace("\n", " ") for i in range(600)]
    (tmp / "corpus.txt").write_text("\n".join(t for t in lines if t.strip()) + "\n")
    small = {**SHORT, "data.source": f"files:{tmp}/corpus.txt", "data.format": "text"}
    settings = DemoSettings(low_resource_examples=64, low_resource_steps=8, bert_curve_points=2,
                            t5_max_tokens=40, t5_test_verses=12, t5_curve_verses=4,
                            t5_select_verses=8, beam_size=2, decode_batch=8, show_verses=2)
    overrides = {"*": TINY, "gpt_pretrain_tiny": small, "bert_pretrain_tiny": small,
                 "t5_pretrain_tiny": small,
                 "t5_finetune_tiny": {"data.seq_len": 48, "data.target_len": 48}}
    results = run_demo(tmp / "runs", settings, overrides=overrides, out_dir=tmp / "out")
    return tmp, results


@pytest.mark.slow
def test_demo_writes_report_with_every_family(demo):
    tmp, results = demo
    out = tmp / "out"
    assert json.loads((out / "results.json").read_text())["meta"]["families"] == [
        "gpt", "bert", "t5"]
    md = (out / "results.md").read_text()
    for heading in ("Decoder-only", "Encoder-only", "Encoder-decoder", "Goals"):
        assert heading in md
    assert (out / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results["checks"]["flush_to_zero"] in (True, False)


@pytest.mark.slow
def test_demo_budgets_and_metrics_are_consistent(demo):
    _, r = demo
    gpt = r["gpt"]["pretrain"]
    assert gpt["steps"] == 12 and gpt["tokens"] > 0
    for split in ("validation", "test"):
        m = gpt[split]
        assert m["model_perplexity"] > 1 and m["unigram_perplexity"] > 1
        assert math.isclose(m["ratio"], m["model_perplexity"] / m["unigram_perplexity"])
    bert = r["bert"]
    assert [g["pretrain_steps"] for g in bert["low_resource"]["gap_curve"]] == [6, 12]
    low = bert["low_resource"]
    for run in (bert["full"]["pretrained"], bert["full"]["scratch"], low["scratch"]):
        assert 0.0 <= run["test_accuracy"] <= 1.0
    assert bert["low_resource"]["scratch"]["steps"] == 8
    t5 = r["t5"]
    for v in t5["translate"].values():
        assert v["test_verses"] == 12 and v["bleu"] >= 0
        assert [c["step"] for c in v["bleu_curve"]][-1] == v["steps"]
        tried = v["decoding"]["tried"]  # greedy, then beam 2 with each length penalty
        searches = [(1, 0.0)] + [(2, a) for a in DemoSettings.t5_length_penalties]
        assert [(t["beam_size"], t["length_penalty"], t["no_repeat_ngram_size"])
                for t in tried] == [(*s, g) for s in searches
                                    for g in DemoSettings.t5_no_repeat_ngrams]
        assert v["decoding"]["validation_bleu"] == max(t["validation_bleu"] for t in tried)
    assert t5["length_limit"]["test"]["kept"] <= t5["length_limit"]["test"]["total"]
    assert len(t5["samples"]) == 2
    base = r["sentiment_baseline"]
    assert base["full"]["train_examples"] == 8495 and base["low"]["train_examples"] == 64


@pytest.mark.slow
def test_t5_budget_run_reports_bleu_at_every_checkpoint(tmp_path):
    """`python -m demo.t5_budget`'s path: tokenizer, pairs within the limit, one
    scratch run with a greedy-BLEU row per checkpoint, beam BLEU at the end, the report."""
    overrides = {"*": TINY, "t5_finetune_tiny": {"data.seq_len": 48, "data.target_len": 48}}
    r = t5_budget.run_budget(tmp_path / "run", steps=6, every=3, max_tokens=40, test_verses=6,
                             curve_verses=3, select_verses=8, beam_size=2, decode_batch=4,
                             overrides=overrides)
    assert [row["step"] for row in r["curve"]] == [3, 6]
    assert r["curve"][0]["tokens"] * 2 == pytest.approx(r["curve"][1]["tokens"], abs=1)
    assert all(row["validation_loss"] > 0 and row["bleu_greedy"] >= 0 for row in r["curve"])
    assert r["test_verses"] == 6 and r["curve_verses"] == 3 and 0 <= r["final"]["bleu"] <= 100
    assert r["length_limit"]["test"]["kept"] <= r["length_limit"]["test"]["total"]
    md = t5_budget.markdown(r, "cmd")
    assert len(r["decoding"]["tried"]) == 6 and r["decoding"]["validation_verses"] > 0
    assert "| 3 |" in md and "| 6 |" in md and describe_decoding(r["decoding"]) in md


@pytest.mark.parametrize("flag", ["--budget_scale", "--pretrain_scale", "--bert_curve_points",
                                  "--t5_max_tokens", "--beam_size"])
def test_demo_cli_rejects_non_positive_budgets(flag, capsys):
    with pytest.raises(SystemExit):
        main([flag, "0"])
    assert f"{flag}=0" in capsys.readouterr().err


def test_set_overrides_are_typed_targeted_and_applied():
    o = parse_overrides(["model.d_model=256", "bert_finetune_tiny:data.seq_len=96",
                         "bert_pretrain_tiny:optimizer.peak_lr=5e-4",
                         "bert_pretrain_tiny:data.source=shakespeare",
                         "bert_finetune_tiny:data.packing=true"])
    assert o == {"*": {"model.d_model": 256},
                 "bert_finetune_tiny": {"data.seq_len": 96, "data.packing": True},
                 "bert_pretrain_tiny": {"optimizer.peak_lr": 5e-4, "data.source": "shakespeare"}}
    pre, ft = load_config("bert_pretrain_tiny", o), load_config("bert_finetune_tiny", o)
    assert pre.model.d_model == ft.model.d_model == 256
    assert (pre.data.seq_len, ft.data.seq_len) == (128, 96)  # only the named config changes
    assert pre.optimizer.peak_lr == 5e-4 and pre.data.source == "shakespeare"
    assert load_config("gpt_pretrain_tiny").model.d_model == 128


@pytest.mark.parametrize("item, message", [
    ("model.d_modle=3", "has no key 'model.d_modle'"),
    ("bert_tiny:model.d_model=3", "unknown config 'bert_tiny'"),
    ("model.d_model", "expected [CONFIG:]KEY=VALUE"),
    ("model.d_model.size=8", "'gpt_pretrain_tiny' has no key"),  # a value is not a section
])
def test_set_rejects_bad_items(item, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_overrides([item])
    assert parse_overrides(["t5_pretrain_tiny:model.relative_num_buckets=8"])


def test_demo_settings_change_keys_and_never_add_them():
    assert load_config("bert_finetune_tiny", **{"data.format": "jsonl"}).data.format == "jsonl"
    with pytest.raises(KeyError, match="data has no key 'fromat'"):
        load_config("bert_finetune_tiny", **{"data.fromat": "jsonl"})
    with pytest.raises(KeyError, match="the config has no key 'daat'"):
        load_config("bert_finetune_tiny", {"*": {"daat.format": "jsonl"}})


def test_demo_cli_reports_bad_set_items(tmp_path, capsys):
    with pytest.raises(SystemExit):  # (if it ever ran, the budget keeps it short)
        main(["--set", "model.d_modle=3", "--only", "gpt", "--budget_scale", "0.001",
              "--workdir", str(tmp_path), "--out", str(tmp_path)])
    assert "has no key 'model.d_modle'" in capsys.readouterr().err
