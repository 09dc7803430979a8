"""Cloze classification through the MLM head (objective 'cloze', PET; Schick & Schütze 2021).

The pattern insertion against a brute-force construction, the loss against a float64 NumPy
restricted softmax of the model's full MLM logits (PET eq. 1-2), the eval accuracy as the argmax
over the label words, the option checks, and (slow) ``init_from`` a tiny MLM pretraining run:
every parameter copied, step-0 class scores equal to the pretrained MLM's logits, loss falling.
"""

from __future__ import annotations

import random
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxformer.checkpoint import load_checkpoint_params, read_metrics
from jaxformer.config import ModelConfig
from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece
from jaxformer.models import build_model
from jaxformer.objectives import bind_objective
from jaxformer.objectives.cloze import (
    ClozeIds,
    ClozeOptions,
    check_cloze_options,
    insert_pattern,
    prepare_cloze,
    resolve_cloze,
)
from jaxformer.train.config import load_config, validate_config
from jaxformer.train.loop import Trainer
from jaxformer.train.step import loss_and_metrics, make_eval_step
from jaxformer.vocab import SpecialTokens

ROOT = Path(__file__).resolve().parents[1]
SPECIAL = SpecialTokens(vocab_size=200)
CLS, SEP, PAD, MASK = SPECIAL.cls_id, SPECIAL.sep_id, SPECIAL.pad_id, SPECIAL.mask_id
WORDS = ("good great fine bad awful poor the a movie film plot actor scene story was is very "
         "quite rather and but not It").split()


def _rows(rng: np.random.Generator, lengths: list[int], width: int) -> np.ndarray:
    """``[CLS] text [SEP]`` rows of ``n`` text tokens each (-1: an all-padding row)."""
    rows = np.zeros((len(lengths), width), np.int32)
    for b, n in enumerate(lengths):
        if n >= 0:
            rows[b, :n + 2] = [CLS, *rng.integers(110, 200, n), SEP]
    return rows


def _brute_force(row: np.ndarray, pattern: list[int]) -> list[int]:
    kept = [int(t) for t in row if t != PAD]
    if not kept:
        return [PAD] * len(row)
    text = kept[1:-1][:len(row) - 2 - len(pattern)]
    out = [kept[0], *text, *pattern, kept[-1]]
    return out + [PAD] * (len(row) - len(out))


def test_pattern_insertion_equals_a_brute_force_construction(rng):
    width, cloze = 12, ClozeIds(before=(120, 121), after=(122,), label_ids=(150, 160))
    pattern = [120, 121, MASK, 122]
    tokens = _rows(rng, [0, 3, 6, 8, 10, -1], width)  # 8 and 10 must lose the end of their text
    out = prepare_cloze({"inputs": tokens, "label": np.array([0, 1, 1, 0, 1, 0])}, None,
                        SPECIAL, None, cloze=cloze)
    expected = np.array([_brute_force(r, pattern) for r in tokens])
    np.testing.assert_array_equal(out["model_inputs"]["tokens"], expected)
    np.testing.assert_array_equal(out["model_inputs"]["segment_ids"], expected != PAD)
    np.testing.assert_array_equal(out["weights"], [1, 1, 1, 1, 1, 0])
    masks = [list(r).index(MASK) if MASK in r else None for r in expected]
    np.testing.assert_array_equal(np.asarray(out["class_positions"])[:5], masks[:5])
    np.testing.assert_array_equal(out["class_token_ids"], [150, 160])
    jitted = jax.jit(lambda t: insert_pattern(t, pattern, PAD))(tokens)
    np.testing.assert_array_equal(jitted[0], expected)
    with pytest.raises(ValueError, match="data.seq_len=5"):
        prepare_cloze({"inputs": tokens[:, :5], "label": np.zeros(6, np.int32)}, None, SPECIAL,
                      cloze=cloze)


def _model(**overrides) -> tuple[ModelConfig, object, dict]:
    cfg = ModelConfig(family="encoder", head="mlm", vocab_size=200, d_model=16, num_heads=2,
                      d_ff=32, num_layers=1, max_len=16, mlm_transform=True, lm_head_bias=True,
                      dropout_rate=0.0, attention_dropout_rate=0.0, **overrides)
    model = build_model(cfg)
    params = model.init(jax.random.key(0))
    return cfg, model, params


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_loss_and_accuracy_are_the_restricted_softmax_of_the_mlm_logits(rng, smoothing):
    """PET eq. 2: softmax over the label words' MLM logits at the [MASK], cross-entropy; float64
    NumPy reference from the model's full `[B, L, V]` logits; eval accuracy = argmax over them."""
    _, model, params = _model()
    cloze = ClozeIds(before=(120,), after=(121,), label_ids=(150, 160, 170))
    labels = np.array([0, 2, 1, 1, 0])
    prepared = prepare_cloze({"inputs": _rows(rng, [2, 5, 9, 13, -1], 16), "label": labels},
                             None, SPECIAL, cloze=cloze)
    sums = jax.jit(lambda p: loss_and_metrics(model, p, prepared, deterministic=True,
                                              dropout_rng=None, label_smoothing=smoothing))(params)
    full = np.asarray(jax.jit(model.apply)(params, **prepared["model_inputs"]),
                      np.float64)
    at_mask = full[np.arange(5), np.asarray(prepared["class_positions"])][:, [150, 160, 170]]
    logp = at_mask - np.log(np.exp(at_mask).sum(-1, keepdims=True))
    onehot = np.eye(3)[labels]
    target = onehot * (1 - smoothing) + (1 - onehot) * smoothing / 2
    per_row = -(target * logp).sum(-1)
    np.testing.assert_allclose(float(sums["loss"]), per_row[:4].sum(), rtol=1e-5)
    assert float(sums["weight"]) == 4
    sums, rows = jax.jit(make_eval_step(model, lambda b, k: prepared, predictions=True))(
        params, None, None)
    np.testing.assert_array_equal(np.asarray(rows["predictions"]), at_mask.argmax(-1))
    assert float(sums["correct"]) == (at_mask.argmax(-1) == labels)[:4].sum()


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    texts = [" ".join(random.Random(i).choices(WORDS, k=8)) + "." for i in range(400)]
    return Tokenizer(train_sentencepiece(texts, vocab_size=400))


def test_words_and_pattern_resolve_to_pieces_in_context(tokenizer):
    ids = resolve_cloze(ClozeOptions(cloze_pattern="It was <mask>.", verbalizers="bad,good"),
                        tokenizer)["cloze"]
    for word, i in zip(("bad", "good"), ids.label_ids):
        assert tokenizer.encode(f"It was {word}.") == [*ids.before, i, *ids.after]
        assert tokenizer.id_to_piece(i) == "\u2581" + word
    assert tokenizer.encode("It was") == list(ids.before)


def test_bad_words_and_patterns_fail_naming_the_field(tokenizer):
    with pytest.raises(ValueError, match="objective.cloze_pattern='It was.' must hold '<mask>'"):
        check_cloze_options(ClozeOptions(cloze_pattern="It was.", verbalizers="bad,good"))
    with pytest.raises(ValueError, match="objective.cloze_pattern"):
        check_cloze_options(ClozeOptions(cloze_pattern="<mask> <mask>", verbalizers="bad,good"))
    for words in ("bad", "bad,bad", "bad,,good", ""):
        with pytest.raises(ValueError, match="objective.verbalizers="):
            check_cloze_options(ClozeOptions(verbalizers=words))
    with pytest.raises(ValueError, match=r"model.num_classes=3"):
        check_cloze_options(ClozeOptions(verbalizers="bad,good"), num_classes=3)
    with pytest.raises(ValueError, match="objective.verbalizers: 'goodbadness' is not a single "
                                         "piece"):
        resolve_cloze(ClozeOptions(verbalizers="bad,goodbadness"), tokenizer)
    with pytest.raises(ValueError, match="needs the run's tokenizer"):
        bind_objective("cloze", ClozeOptions(verbalizers="bad,good"), SPECIAL)


def _config(name: str, **overrides):
    return load_config(ROOT / "configs" / f"{name}.py", overrides)


def test_config_needs_the_mlm_head_and_cls_sep_rows():
    validate_config(_config("bert_cloze_tiny"))
    with pytest.raises(ValueError, match="model.head='classify' must be 'encoder' and 'mlm'"):
        validate_config(_config("bert_cloze_tiny", **{"model.head": "classify"}))
    with pytest.raises(ValueError, match="data.framing='eos'"):
        validate_config(_config("bert_cloze_tiny", **{"data.framing": "eos"}))
    with pytest.raises(ValueError, match=r"objective.verbalizers='bad,good' .*num_classes=3"):
        validate_config(_config("bert_cloze_tiny", **{"model.num_classes": 3}))
    with pytest.raises(ValueError, match="applies to objective 'cloze'"):
        validate_config(_config("bert_finetune_tiny", **{"objective.verbalizers": "bad,good"}))


# --------------------------------------------------------------------------------------------------
# A tiny MLM pretraining run, then cloze fine-tuning from it.

TINY = {"model.vocab_size": 512, "model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64,
        "model.num_layers": 1, "model.max_len": 32, "data.tokenizer.vocab_size": 512,
        "data.seq_len": 32, "data.batch_size": 8, "log_every_steps": 5,
        "checkpoint.async_save": False, "progress_bar": False, "optimizer.warmup_steps": 2,
        "eval.num_batches": 2, "eval.every_steps": 20, "checkpoint.every_steps": 20,
        "num_train_steps": 20, "data.format": "jsonl", "data.text_key": "text",
        "data.label_key": "label"}


def _write_sentiment(directory: Path) -> None:
    r = random.Random(0)
    for split, n in (("train", 300), ("validation", 40), ("test", 40)):
        lines = []
        for _ in range(n):  # filler words and one word of the label's sentiment
            label = r.randint(0, 1)
            words = r.choices(WORDS[6:], k=r.randint(2, 8))
            words.insert(r.randint(0, len(words)), r.choice(WORDS[3:6] if label == 0 else WORDS[:3]))
            lines.append(f'{{"text": "{" ".join(words)}.", "label": {label}}}')
        (directory / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data = tmp_path_factory.mktemp("cloze_data")
    _write_sentiment(data)
    source = {"data.source": f"files:{data}/{{split}}.jsonl"}
    pretrain = tmp_path_factory.mktemp("cloze") / "pretrain"
    Trainer(_config("bert_pretrain_tiny", **TINY, **source, **{"data.long_examples": "truncate"}),
            pretrain).run()
    cloze = _config("bert_cloze_tiny", **{**TINY, **source, "init_from": str(pretrain),
                                          "num_train_steps": 80, "optimizer.peak_lr": 1e-2,
                                          "eval.every_steps": 80, "checkpoint.every_steps": 80})
    return pretrain, Trainer(cloze, pretrain.parent / "cloze")


@pytest.mark.slow
def test_init_from_copies_every_parameter_and_the_class_scores_are_the_mlm_logits(runs):
    pretrain, trainer = runs
    saved = load_checkpoint_params(pretrain / "checkpoints" / "20")
    start = jax.tree.map(np.asarray, trainer.state.params)
    assert jax.tree.structure(start) == jax.tree.structure(saved)  # no fresh head
    jax.tree.map(np.testing.assert_array_equal, start, saved)
    batch = next(iter(trainer.make_ds("validation", num_epochs=1)))
    prepared = trainer.prepare(batch, None)
    pretrained = build_model(ModelConfig.from_dict(
        {**trainer.config.model.to_dict(), "dropout_rate": 0.0}))
    full = np.asarray(pretrained.apply(saved, **prepared["model_inputs"]))
    ids = list(trainer.tokenizer.encode("bad")) + list(trainer.tokenizer.encode("good"))
    expected = full[np.arange(len(full)), np.asarray(prepared["class_positions"])][:, ids]
    _, rows = make_eval_step(trainer.model, trainer.prepare, predictions=True)(
        trainer.state.params, batch, None)
    np.testing.assert_array_equal(rows["predictions"], expected.argmax(-1))
    sums = loss_and_metrics(trainer.model, trainer.state.params, prepared, deterministic=True,
                            dropout_rng=None)
    logp = expected - np.log(np.exp(expected.astype(np.float64)).sum(-1, keepdims=True))
    np.testing.assert_allclose(float(sums["loss"]),
                               -logp[np.arange(len(logp)), np.asarray(batch["label"])].sum(),
                               rtol=1e-5)


@pytest.mark.slow
def test_a_cloze_run_trains_and_evaluates_accuracy(runs):
    """The training batches' loss falls from the pretrained start to the last checkpoint; the
    trainer logs label accuracy (no perplexity) and counts examples."""
    _, trainer = runs
    start = jax.tree.map(np.asarray, trainer.state.params)  # the step donates the state
    trainer.run()
    final = load_checkpoint_params(trainer.workdir / "checkpoints" / "80")
    batches = [trainer.prepare(b, None) for _, b in
               zip(range(4), trainer.make_ds("train", num_epochs=1))]
    loss = jax.jit(lambda p, b: loss_and_metrics(trainer.model, p, b, deterministic=True,
                                                 dropout_rng=None)["loss"])
    before, after = (sum(float(loss(p, b)) for b in batches) for p in (start, final))
    assert after < 0.8 * before
    rows = read_metrics(trainer.workdir)
    evals = [r for r in rows if "eval_accuracy" in r]
    assert evals and "eval_perplexity" not in evals[-1] and 0 <= evals[-1]["eval_accuracy"] <= 1
    assert all(r["examples"] == 8 for r in rows if "loss" in r)
