"""Extractive question answering: the span head, the ``qa`` objective, windows with a stride,
character offsets, best-span decoding, HF ``BertForQuestionAnswering`` parity and a tiny run."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.data.pipeline import DataSettings, make_dataset
from jaxformer.data.qa_windows import answer_token_span, qa_example, qa_windows
from jaxformer.data.sources import SourceSettings
from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece
from jaxformer.decode.span import best_answer, best_span
from jaxformer.models import build_model
from jaxformer.objectives.qa import QAOptions
from jaxformer.objectives.registry import bind_objective
from jaxformer.ops.losses import weighted_cross_entropy
from jaxformer.settings import read

CONTEXTS = [
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Café au lait is a naïve drink in Zürich, said Ærøskøbing's mayor.",
    "Tokyo is 東京 and Kyoto is 京都 in Japanese script, 😀 emoji included.",
    "Shall I compare thee to a summer's day? Thou art more lovely and more temperate.",
] * 10


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer(train_sentencepiece(CONTEXTS + ["Which word? Where is it?"] * 5,
                                         vocab_size=400))


def word_spans(text: str) -> list[tuple[int, int]]:
    """(start, end) character spans of the whitespace-separated words of ``text``."""
    spans, i = [], 0
    for w in text.split():
        i = text.index(w, i)
        spans.append((i, i + len(w)))
        i += len(w)
    return spans


def test_offsets_round_trip_every_word_span(tokenizer):
    """Every whole-word answer span (1–3 words, non-ASCII and byte-fallback characters included)
    maps to tokens whose character offsets give back exactly the answer text."""
    for context in CONTEXTS[:4]:
        ids, offsets = tokenizer.encode_with_offsets(context)
        assert ids == tokenizer.encode(context)
        assert tokenizer._sp.decode(ids) == context
        spans = word_spans(context)
        for n in (1, 2, 3):
            for (a, _), (_, b) in zip(spans, spans[n - 1:]):
                first, last = answer_token_span(offsets, a, b)
                assert context[offsets[first, 0]:offsets[last, 1]] == context[a:b]


def test_qa_example_accepts_flat_nested_and_tsv_records():
    flat = qa_example({"context": "ab cd", "question": "q", "answer_text": "cd",
                       "answer_start": "3"})
    nested = qa_example({"text": "ab cd", "question": "q",
                         "answers": {"text": np.array([b"cd"]), "answer_start": np.array([3])}})
    assert flat["answer_text"] == nested["answer_text"] == "cd"
    assert flat["answer_start"] == nested["answer_start"] == 3
    assert qa_example({"context": "ab", "question": "q", "answers": {"text": [],
                                                                     "answer_start": []}}
                      )["answer_start"] == -1
    with pytest.raises(ValueError, match="is not at answer_start=1"):
        qa_example({"context": "ab cd", "question": "q", "answer_text": "cd", "answer_start": 1})
    # a question/context/answer table (no offset): the answer's first occurrence
    found = qa_example({"context": "ab cd cd", "question": "q", "answer": "cd"})
    assert (found["answer_text"], found["answer_start"]) == ("cd", 3)
    with pytest.raises(ValueError, match="answer 'xy' does not occur in the context"):
        qa_example({"context": "ab cd", "question": "q", "answer": "xy"})


@pytest.mark.parametrize("seq_len,doc_stride", [(24, 5), (24, 13), (40, 7), (200, 50)])
def test_windows_cover_the_context_with_the_stride(tokenizer, seq_len, doc_stride):
    """Windows: rows within seq_len, [CLS] q [SEP] ctx [SEP] with token types, consecutive windows
    doc_stride context tokens apart, every context token in some window, and the answer labelled
    exactly in the windows that hold it whole (else [CLS])."""
    context = " ".join(CONTEXTS[:4])
    a = context.index("naïve drink")
    ex = qa_example({"context": context, "question": "Which word?",
                     "answer_text": "naïve drink", "answer_start": a})
    feats, _ = qa_windows(ex, tokenizer, seq_len=seq_len, doc_stride=doc_stride,
                          max_question_len=8)
    ids, offsets = tokenizer.encode_with_offsets(context)
    first, last = answer_token_span(offsets, a, a + len("naïve drink"))
    q = tokenizer.encode("Which word?")[:8]
    sp = tokenizer.special
    covered, labelled = set(), 0
    for k, f in enumerate(feats):
        n, head = len(f["inputs"]), 2 + len(q)
        assert n <= seq_len and list(f["inputs"][:head]) == [sp.cls_id, *q, sp.sep_id]
        assert f["inputs"][-1] == sp.sep_id and f["inputs_token_types"].sum() == n - head
        window = range(k * doc_stride, k * doc_stride + n - head - 1)
        assert list(f["inputs"][head:-1]) == [ids[i] for i in window]
        np.testing.assert_array_equal(f["offsets"][head:-1], offsets[list(window)])
        covered.update(window)
        if first in window and last in window:
            labelled += 1
            s, e = int(f["start_position"]), int(f["end_position"])
            assert context[f["offsets"][s, 0]:f["offsets"][e, 1]] == "naïve drink"
        else:
            assert f["start_position"] == f["end_position"] == 0
    assert covered == set(range(len(ids))) and labelled >= 1


def tiny_encoder(**kw) -> ModelConfig:
    return ModelConfig(family="encoder", vocab_size=400, d_model=32, num_heads=2, d_ff=64,
                       num_layers=2, max_len=64, type_vocab_size=2, norm_position="post",
                       embedding_norm=True, head="span", **kw)


def test_span_head_loss_is_the_mean_of_start_and_end_cross_entropy(tokenizer):
    """The trainer's weighted cross-entropy on [B, 2, L] logits with (start, end) targets equals
    (CE(start) + CE(end)) / 2 averaged over rows, by hand in NumPy."""
    cfg = tiny_encoder()
    model = build_model(cfg)
    ex = qa_example({"context": CONTEXTS[0], "question": "Which word?", "answer_text": "fox",
                     "answer_start": CONTEXTS[0].index("fox")})
    feats, _ = qa_windows(ex, tokenizer, seq_len=16, doc_stride=4, max_question_len=4)
    L = 16
    batch = {k: np.stack([np.pad(f[k], (0, L - len(f[k]))) for f in feats])
             for k in ("inputs", "inputs_token_types")}
    batch["start_position"] = np.array([f["start_position"] for f in feats])
    batch["end_position"] = np.array([f["end_position"] for f in feats])
    prepared = bind_objective("qa", None, tokenizer.special)(batch, jax.random.key(0))
    params = model.init(jax.random.key(1))
    logits = model.apply(params, **prepared["model_inputs"])
    assert logits.shape == (len(feats), 2, L) and "qa_outputs" in params
    loss, w = weighted_cross_entropy(logits, prepared["targets"], prepared["weights"])
    z = np.asarray(logits, np.float64)
    lp = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
    rows = np.arange(len(feats))
    by_hand = -(lp[rows, 0, batch["start_position"]] + lp[rows, 1, batch["end_position"]]) / 2
    np.testing.assert_allclose(float(loss / w), by_hand.mean(), rtol=1e-5)


def test_pipeline_builds_qa_rows_from_a_jsonl_file(tokenizer, tmp_path):
    path = tmp_path / "qa.jsonl"
    rows = [{"context": c, "question": "Which word?", "answers": {
        "text": [c.split()[2]], "answer_start": [c.index(" " + c.split()[2]) + 1]}}
        for c in CONTEXTS[:4]]
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    data = {"source": f"files:{path}", "text_key": "context", "packing": False, "seq_len": 24,
            "batch_size": 4, "shuffle": False, "split_fractions": (1.0, 0.0, 0.0)}
    options = QAOptions(doc_stride=8, max_question_len=6)
    batch = next(iter(make_dataset(read(DataSettings, data), "train", tokenizer, seed=0, objective="qa",
                                   options=options, num_epochs=1, report=False)))
    assert batch["inputs"].shape == batch["inputs_token_types"].shape == (4, 24)
    assert batch["start_position"].shape == (4,)
    first = rows[0]["context"]
    ex = qa_example(rows[0])
    feats, _ = qa_windows(ex, tokenizer, seq_len=24, doc_stride=8, max_question_len=6)
    np.testing.assert_array_equal(batch["inputs"][0, :len(feats[0]["inputs"])], feats[0]["inputs"])
    assert first.split()[2] == ex["answer_text"]


def test_best_span_by_hand():
    """end ≥ start, within max_answer_len, inside the context: the best such sum of logits."""
    start = np.array([9.0, 1.0, 0.0, 3.0, 0.5])
    end = np.array([9.0, 0.0, 2.0, 0.0, 5.0])
    offsets = np.array([[-1, -1], [0, 3], [4, 7], [8, 11], [12, 15]])
    assert best_span(start, end, offsets, max_answer_len=2) == (8.0, 3, 4)  # [CLS] excluded
    assert best_span(start, end, offsets, max_answer_len=1) == (5.5, 4, 4)
    assert best_span(start[:1], end[:1], offsets[:1], max_answer_len=3) is None


def synthetic_qa(texts, rng, n):
    """'Which word is shouted?' over sentences with one word upper-cased: the answer is that word."""
    rows = []
    for text in texts:
        words = text.split()
        if len(words) < 4:
            continue
        k = int(rng.integers(len(words)))
        words[k] = words[k].upper()
        context = " ".join(words)
        start = len(" ".join(words[:k])) + (k > 0)
        rows.append({"context": context, "question": "Which word is shouted?",
                     "answer_text": words[k], "answer_start": start})
        if len(rows) == n:
            break
    return rows


@pytest.mark.slow
def test_tiny_qa_run_learns_beyond_chance(tmp_path):
    """A tiny BERT trained from scratch on 'which word is shouted?' questions over movie-review
    sentences answers held-out questions (through `best_answer`, as the CLI does) with an exact
    match far above picking a random word of the context (chance ≈ 1/words)."""
    from jaxformer.checkpoint import load_for_inference
    from jaxformer.data.sources import get_source
    from jaxformer.train.config import load_config
    from jaxformer.train.loop import train_and_evaluate

    source = get_source(SourceSettings(source="movie_sentiment"), "train")  # opened once, not per record
    texts = [source[i]["text"] for i in range(3000)]
    rng = np.random.default_rng(0)
    rows = synthetic_qa([t for t in texts if len(t) < 160], rng, 1500)
    train, test = rows[:1300], rows[1300:1400]
    for split, part in (("train", train), ("validation", rows[1400:])):
        (tmp_path / f"{split}.jsonl").write_text(
            "\n".join(json.dumps(r, ensure_ascii=False) for r in part) + "\n")
    cfg = load_config("configs/bert_qa_tiny.py", {
        "num_train_steps": 200, "data.source": f"files:{tmp_path}/{{split}}.jsonl",
        "data.tokenizer.vocab_size": 600, "model.vocab_size": 600, "model.num_layers": 2,
        "model.dropout_rate": 0.0, "model.attention_dropout_rate": 0.0,
        "data.seq_len": 64, "optimizer.peak_lr": 1e-3, "optimizer.warmup_steps": 30,
        "eval.every_steps": 200, "eval.num_batches": 2, "checkpoint.every_steps": 200,
        "progress_bar": False})
    workdir = tmp_path / "run"
    train_and_evaluate(cfg, workdir)
    model_cfg, params, tokenizer = load_for_inference(workdir)
    model = build_model(model_cfg)
    answers = [best_answer(model, params, tokenizer, r, seq_len=64, doc_stride=32,
                           max_question_len=24, max_answer_len=16) for r in test]
    exact = np.mean([a.text == r["answer_text"] for a, r in zip(answers, test)])
    chance = np.mean([1 / len(r["context"].split()) for r in test])
    print(f"exact match {exact:.2f} vs chance {chance:.2f}")
    assert exact > max(0.4, 4 * chance)  # measured: 0.53-0.56 (seeds 0-2; 300 steps: 0.55) vs 0.08


def test_hf_bert_for_question_answering_parity_and_round_trip(tmp_path):
    """A tiny random HF `BertForQuestionAnswering` (golden, `tests/golden.py`) imported with
    `jaxformer.convert.load_hf` gives its start/end logits (relative error ≤ 1e-5), and exports back
    tensor for tensor."""
    from golden import golden_dir, reference
    from safetensors.numpy import load_file

    from jaxformer.convert import load_hf, save_hf

    src = golden_dir("bert_qa")
    ref = reference("bert_qa")
    cfg, params, _ = load_hf(src)
    assert cfg["head"] == "span"
    model = build_model(ModelConfig.from_dict(cfg))
    logits = np.asarray(model.apply(params, ref["input_ids"], token_types=ref["token_type_ids"]))
    for row, key in ((0, "start_logits"), (1, "end_logits")):
        assert np.max(np.abs(logits[:, row] - ref[key])) <= 1e-5 * max(np.max(np.abs(ref[key])), 1.0)
    save_hf(cfg, params, tmp_path / "out")
    src_tensors = load_file(f"{src}/model.safetensors")
    dst = load_file(tmp_path / "out" / "model.safetensors")
    assert "qa_outputs.weight" in dst and sorted(dst) == sorted(src_tensors)
    for k in dst:
        np.testing.assert_array_equal(dst[k], src_tensors[k], err_msg=k)
