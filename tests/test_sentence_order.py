"""Sentence pairs for NSP (BERT §3.1) and SOP (ALBERT §4.1), `jaxformer.data.sentence_pairs`:
rows reconstructed from the source text (adjacent segments of one document; NSP negatives from
another), label balance, exact [CLS]/[SEP]/token-type layout, determinism, config refusals, and a
tiny real run with span masking + SOP."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jaxformer.checkpoint import read_metrics
from jaxformer.data.pipeline import DataSettings, make_dataset
from jaxformer.data.sentence_pairs import text_segments, truncate_pair
from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece
from jaxformer.objectives.mlm import MLMOptions
from jaxformer.train.config import load_config, validate_config
from jaxformer.train.loop import train_and_evaluate

ROOT = Path(__file__).resolve().parents[1]
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi".split()


@pytest.fixture(scope="module")
def corpus():
    """200 documents of 1–6 lines, each line ending with its own tag ``d<doc>s<line>``, and each
    document's lines tokenized as the pipeline tokenizes them."""
    rng = np.random.default_rng(0)
    docs = [{"text": "\n".join(f"{' '.join(rng.choice(WORDS, rng.integers(2, 7)))} d{d}s{s}."
                               for s in range(rng.integers(1, 7)))} for d in range(200)]
    tok = Tokenizer(train_sentencepiece([d["text"] for d in docs], vocab_size=500,
                                        num_sentinels=0))
    segments = [[tok.encode(line) for line in text_segments(d["text"])] for d in docs]
    return docs, tok, segments


def _rows(corpus, mode: str, seed: int = 0, seq_len: int = 48) -> dict[str, np.ndarray]:
    docs, tok, _ = corpus
    cfg = DataSettings(seq_len=seq_len, batch_size=4, packing=False)
    it = iter(make_dataset(cfg, "train", tok, seed=seed, objective="mlm",
                           options=MLMOptions(sentence_pairs=mode), source=docs, num_epochs=2,
                           report=False))
    batches = list(it)
    rows = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    real = rows["nsp_weight"] == 1  # the last batch is padded with all-padding rows, weight 0
    assert (rows["inputs"][~real] == tok.special.pad_id).all() and real.sum() > len(real) - 4
    return {k: v[real] for k, v in rows.items()}


def _split(row: np.ndarray, types: np.ndarray, tok) -> tuple[list[int], list[int]]:
    """(A, B) of ``[CLS] A [SEP] B [SEP] pad…``, checking the layout and the token types exactly."""
    sp = tok.special
    seps = np.flatnonzero(row == sp.sep_id)
    assert row[0] == sp.cls_id and len(seps) == 2 and sp.cls_id not in row[1:]
    a, b = row[1:seps[0]].tolist(), row[seps[0] + 1:seps[1]].tolist()
    assert a and b and (row[seps[1] + 1:] == sp.pad_id).all()
    want = np.zeros_like(types)
    want[seps[0] + 1:seps[1] + 1] = 1
    np.testing.assert_array_equal(types, want)
    return a, b


def _ends_at(part: list[int], doc: list[list[int]]) -> set[int]:
    """Boundaries j of ``doc``'s segments where ``part`` ends (a suffix of ``doc[:j]`` that starts
    within it: cut from its start only)."""
    out = set()
    for j in range(1, len(doc) + 1):
        before = sum(doc[:j], [])
        if len(part) <= len(before) and before[len(before) - len(part):] == part:
            out.add(j)
    return out


def _starts_at(part: list[int], doc: list[list[int]]) -> set[int]:
    """Boundaries j where ``part`` starts (a prefix of ``doc[j:]``: cut from its end only)."""
    return {j for j in range(len(doc)) if sum(doc[j:], [])[:len(part)] == part}


def test_sop_pairs_are_adjacent_segments_of_one_document_swapped_half_the_time(corpus):
    _, tok, segments = corpus
    rows = _rows(corpus, "sop")
    labels = rows["nsp_label"]
    assert len(labels) > 300
    for row, types, label in zip(rows["inputs"], rows["inputs_token_types"], labels):
        a, b = _split(row, types, tok)
        first, second = (b, a) if label == 1 else (a, b)  # label 1 = swapped
        homes = [d for d, doc in enumerate(segments)
                 if _ends_at(first, doc) & _starts_at(second, doc)]
        assert len(homes) == 1, "the pair is not two adjacent stretches of one document"
        # the other order would not be adjacent: the label is checked, not just the pair
        doc = segments[homes[0]]
        assert not (_ends_at(second, doc) & _starts_at(first, doc))
    n = len(labels)
    assert abs(labels.mean() - 0.5) < 4 * np.sqrt(0.25 / n)


def test_nsp_negatives_come_from_another_document(corpus):
    _, tok, segments = corpus
    rows = _rows(corpus, "nsp")
    labels = rows["nsp_label"]
    for row, types, label in zip(rows["inputs"], rows["inputs_token_types"], labels):
        a, b = _split(row, types, tok)
        homes_a = {d for d, doc in enumerate(segments) if _ends_at(a, doc)}
        assert len(homes_a) == 1
        (d,) = homes_a
        if label == 0:  # IsNext: B continues A in its document
            assert _ends_at(a, segments[d]) & _starts_at(b, segments[d])
        else:  # NotNext: B starts at a segment of another document
            homes_b = {e for e, doc in enumerate(segments) if _starts_at(b, doc)}
            assert homes_b and d not in homes_b
    n = len(labels)
    assert abs(labels.mean() - 0.5) < 4 * np.sqrt(0.25 / n)


def test_pairs_are_deterministic_given_the_seed(corpus):
    one, two, other = _rows(corpus, "sop", 3), _rows(corpus, "sop", 3), _rows(corpus, "sop", 4)
    for k in one:
        np.testing.assert_array_equal(one[k], two[k])
    assert not np.array_equal(one["nsp_label"], other["nsp_label"][:len(one["nsp_label"])])


def test_truncate_pair_is_bert_s_loop():
    """Against BERT's ``truncate_seq_pair`` loop (the longer side loses a token, ties B), with A
    cut from its start and B from its end."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        la, lb, limit = (int(x) for x in rng.integers(1, 40, 3))
        limit += 1
        a, b = list(range(la)), list(range(100, 100 + lb))
        while len(a) + len(b) > limit:
            if len(a) > len(b):
                a.pop(0)
            else:
                b.pop()
        ta, tb, cut = truncate_pair(np.arange(la), np.arange(100, 100 + lb), limit)
        assert ta.tolist() == a and tb.tolist() == b and cut == max(la + lb - limit, 0)


def test_segments_are_lines_or_the_sentences_of_one_line():
    assert text_segments("HAMLET.\n  To be, or not to be.\n\nThat is the question.") == [
        "HAMLET.", "To be, or not to be.", "That is the question."]
    assert text_segments("In the beginning. God said, Let there be light! And there was?") == [
        "In the beginning.", "God said, Let there be light!", "And there was?"]
    assert text_segments("  \n ") == []


def test_pair_settings_are_refused_naming_the_field():
    base = {"objective.sentence_pairs": "sop", "model.nsp_head": True, "data.packing": False}
    config = load_config(ROOT / "configs" / "bert_pretrain_tiny.py", base)
    validate_config(config)  # the tiny config's 'split' long_examples is accepted (pairs chunk)
    for change, field in (({"objective.sentence_pairs": "order"}, "objective.sentence_pairs"),
                          ({"model.nsp_head": False}, "model.nsp_head"),
                          ({"data.packing": True}, "data.packing"),
                          ({"data.framing": "eos"}, "data.framing")):
        with pytest.raises(ValueError, match=field):
            validate_config(load_config(ROOT / "configs" / "bert_pretrain_tiny.py",
                                        {**base, **change}))


@pytest.fixture(scope="module")
def span_sop_run(tmp_path_factory):
    """configs/bert_pretrain_tiny.py at test size (the model of tests/test_train.py), 30 steps,
    with SpanBERT masking (15%) and SOP. Seeds 0-2: train loss 6.8 -> 5.8-5.9, eval MLM loss
    5.7 -> 5.1."""
    workdir = tmp_path_factory.mktemp("span_sop")
    config = load_config(ROOT / "configs" / "bert_pretrain_tiny.py", {
        "num_train_steps": 30, "objective.masking": "span", "objective.mask_rate": 0.15,
        "objective.sentence_pairs": "sop", "model.nsp_head": True, "data.packing": False,
        "data.batch_size": 16, "log_every_steps": 5, "eval.every_steps": 10,
        "eval.num_batches": 4, "checkpoint.every_steps": 30, "progress_bar": False,
        "data.tokenizer.max_train_texts": 1500, "data.tokenizer.vocab_size": 512,
        "data.seq_len": 64, "model.vocab_size": 512, "model.d_model": 32, "model.num_heads": 2,
        "model.d_ff": 64, "model.num_layers": 1, "model.max_len": 64,
        "optimizer.peak_lr": 3e-3, "optimizer.warmup_steps": 5})
    train_and_evaluate(config, workdir)
    return read_metrics(workdir)


@pytest.mark.slow
def test_span_masking_with_sop_trains_and_reports_sop_accuracy(span_sop_run):
    """The train loss (MLM + SOP) and the eval MLM loss fall; eval reports the SOP accuracy (as
    ``nsp_accuracy``: the pair head serves both tasks)."""
    train = [(r["step"], r["loss"]) for r in span_sop_run if "loss" in r]
    evals = [(r["step"], r["eval_loss"], r["eval_nsp_accuracy"]) for r in span_sop_run
             if "eval_loss" in r]
    print("\ntrain (step, MLM+SOP loss):", [(s, round(v, 3)) for s, v in train])
    print("eval (step, MLM loss, SOP accuracy):", [(s, round(v, 3), a) for s, v, a in evals])
    assert train[-1][1] < train[0][1]
    assert [s for s, _, _ in evals] == [10, 20, 30] and evals[-1][1] < evals[0][1]
    assert all(0.0 <= a <= 1.0 for _, _, a in evals)
