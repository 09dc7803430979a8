"""Objectives against plain-Python references, statistics of the random corruptions, round trips."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.objectives import (
    OBJECTIVES,
    bind_objective,
    denoise,
    get_objective,
    host_transform,
    poisson_span_lengths,
    prepare_classify,
    prepare_clm,
    prepare_mlm,
    prepare_seq2seq,
    prepare_sft,
    random_spans_noise_mask,
    reconstruct_span_corruption,
    span_corruption,
)
from jaxformer.objectives.denoise import DenoiseOptions
from jaxformer.objectives.mlm import MLMOptions
from jaxformer.objectives.span_corruption import SpanCorruptionOptions, _replace_spans
from jaxformer.vocab import SpecialTokens

SPECIAL = SpecialTokens(vocab_size=300)  # specials 0..106, ordinary tokens 107..299
LOW = max(SPECIAL.all_special) + 1


def packed_batch(seed: int, batch: int = 6, length: int = 24, prefix: str = "inputs",
                 with_specials: bool = False) -> dict:
    """Rows of random segments (ids 1, 2, …, positions restarting at 0) followed by padding."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((batch, length), np.int32)
    seg = np.zeros_like(tokens)
    pos = np.zeros_like(tokens)
    loss_mask = np.zeros_like(tokens)
    for b in range(batch):
        t, s = 0, 1
        while t < length - 2 and rng.random() > 0.15:
            n = int(rng.integers(1, min(9, length - t) + 1))
            tokens[b, t:t + n] = rng.integers(LOW, SPECIAL.vocab_size, n)
            if with_specials:
                tokens[b, t] = SPECIAL.cls_id
                tokens[b, t + n - 1] = SPECIAL.sep_id
            seg[b, t:t + n] = s
            pos[b, t:t + n] = np.arange(n)
            loss_mask[b, t + int(rng.integers(0, n)):t + n] = 1  # response = a suffix
            t, s = t + n, s + 1
    return {prefix: tokens, f"{prefix}_segment_ids": seg, f"{prefix}_positions": pos,
            f"{prefix}_loss_mask": loss_mask}


def reference_next_token(tokens, seg):
    targets, weights = np.zeros_like(tokens), np.zeros(tokens.shape, np.float32)
    for b in range(tokens.shape[0]):
        for t in range(tokens.shape[1] - 1):
            if seg[b, t] != 0 and seg[b, t + 1] == seg[b, t]:
                targets[b, t], weights[b, t] = tokens[b, t + 1], 1.0
    return targets, weights


@pytest.mark.parametrize("seed", range(5))
def test_clm_matches_reference_and_never_crosses_segments(seed):
    batch = packed_batch(seed)
    out = prepare_clm(batch, jax.random.key(0), SPECIAL, None)
    targets, weights = reference_next_token(batch["inputs"], batch["inputs_segment_ids"])
    np.testing.assert_array_equal(out["targets"], targets)
    np.testing.assert_array_equal(out["weights"], weights)
    assert out["weights"].dtype == jnp.float32 and out["weights"][:, -1].sum() == 0
    np.testing.assert_array_equal(out["model_inputs"]["tokens"], batch["inputs"])
    np.testing.assert_array_equal(out["model_inputs"]["segment_ids"], batch["inputs_segment_ids"])
    np.testing.assert_array_equal(out["model_inputs"]["positions"], batch["inputs_positions"])


def test_clm_defaults_without_segment_ids():
    tokens = np.array([[120, 121, 122, 0, 0]], np.int32)
    out = prepare_clm({"inputs": tokens}, jax.random.key(0), SPECIAL)
    np.testing.assert_array_equal(out["targets"], [[121, 122, 0, 0, 0]])
    np.testing.assert_array_equal(out["weights"], [[1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(out["model_inputs"]["positions"], [[0, 1, 2, 3, 4]])


@pytest.mark.parametrize("seed", range(3))
def test_sft_weights_only_response_targets(seed):
    batch = packed_batch(seed)
    out = prepare_sft(batch, jax.random.key(0), SPECIAL, None)
    targets, weights = reference_next_token(batch["inputs"], batch["inputs_segment_ids"])
    mask = batch["inputs_loss_mask"]
    expected = weights * np.pad(mask[:, 1:], ((0, 0), (0, 1)))
    np.testing.assert_array_equal(out["targets"], targets)
    np.testing.assert_array_equal(out["weights"], expected)
    assert 0 < expected.sum() < weights.sum()
    with pytest.raises(ValueError, match="inputs_loss_mask"):
        prepare_sft({"inputs": batch["inputs"]}, jax.random.key(0), SPECIAL)


@pytest.mark.parametrize("seed", range(3))
def test_seq2seq_shifts_right_per_segment(seed):
    batch = {**packed_batch(seed, length=20),
             **packed_batch(seed + 10, length=16, prefix="targets")}
    start = 2
    out = prepare_seq2seq(batch, jax.random.key(0), SPECIAL, decoder_start_id=start)
    tg, seg = batch["targets"], batch["targets_segment_ids"]
    expected = np.zeros_like(tg)
    for b in range(tg.shape[0]):
        for t in range(tg.shape[1]):
            if seg[b, t] == 0:
                continue
            same = t > 0 and seg[b, t - 1] == seg[b, t]
            expected[b, t] = tg[b, t - 1] if same else start
    mi = out["model_inputs"]
    assert set(mi) == {"inputs", "targets_in", "inputs_positions", "inputs_segment_ids",
                       "targets_positions", "targets_segment_ids"}
    np.testing.assert_array_equal(mi["targets_in"], expected)
    np.testing.assert_array_equal(out["targets"], tg)
    np.testing.assert_array_equal(out["weights"], (seg != 0).astype(np.float32))
    np.testing.assert_array_equal(mi["inputs_segment_ids"], batch["inputs_segment_ids"])
    default = prepare_seq2seq(batch, jax.random.key(0), SPECIAL, None)["model_inputs"]["targets_in"]
    np.testing.assert_array_equal(default, np.where(expected == start, SPECIAL.pad_id, expected)
                                  * (seg != 0))
    for name in ("seq2seq", "span_corruption", "denoise"):  # objective.decoder_start_id, bound
        bound = bind_objective(name, None, SPECIAL, decoder_start_id=start)
        np.testing.assert_array_equal(bound(batch, None)["model_inputs"]["targets_in"], expected)
        np.testing.assert_array_equal(
            bind_objective(name, None, SPECIAL)(batch, None)["model_inputs"]["targets_in"], default)


def test_options_read_from_the_config_are_the_dataclass_defaults():
    """The config's ``objective`` section declares each objective's options once (their dataclass):
    read back from the base config they equal the dataclass's defaults, and a value set there
    reaches the options (`Objective.read_options`; the trainer's `TrainSettings.objective_options`,
    what it binds)."""
    from jaxformer.config import ModelConfig
    from jaxformer.train.config import base_config, train_settings

    for name, objective in OBJECTIVES.items():
        section = base_config().objective
        section.name = name
        expected = objective.options() if objective.options else None
        assert objective.read_options(section) == expected, name
    config = base_config()
    config.objective.name, config.objective.mask_rate, config.objective.max_span_length = "mlm", 0.3, 4
    settings = train_settings(config, ModelConfig.from_dict(config.model))
    assert settings.objective_options == MLMOptions(mask_rate=0.3, max_span_length=4)


def test_classify_targets_and_weights():
    batch = packed_batch(0)
    batch["label"] = np.arange(6, dtype=np.int32) % 3
    out = prepare_classify(batch, jax.random.key(0), SPECIAL)
    np.testing.assert_array_equal(out["targets"], batch["label"])
    # rows holding an example count once; an all-padding row (eval filler) counts zero
    expected = (batch["inputs_segment_ids"] != 0).any(axis=1).astype(np.float32)
    assert 0 < expected.sum() < 6
    np.testing.assert_array_equal(out["weights"], expected)
    with pytest.raises(ValueError, match="shape"):
        prepare_classify({**batch, "label": np.zeros((6, 2), np.int32)}, jax.random.key(0), SPECIAL)


def test_mlm_rates_split_and_exclusions():
    batches = [packed_batch(s, batch=32, length=64, with_specials=True) for s in range(8)]
    chosen_n = mask_n = random_n = same_n = 0
    mlm = jax.jit(lambda b, k: prepare_mlm(b, k, SPECIAL, MLMOptions(mask_rate=0.15)))
    for i, batch in enumerate(batches):
        out = mlm(batch, jax.random.key(i))
        tokens, seg = batch["inputs"], batch["inputs_segment_ids"]
        w = np.asarray(out["weights"]).astype(bool)
        corrupted = np.asarray(out["model_inputs"]["tokens"])
        candidates = (seg != 0) & ~np.isin(tokens, SPECIAL.all_special)
        n = candidates.sum(1)
        expected = np.where(n > 0, np.maximum(np.round(0.15 * n), 1), 0)
        np.testing.assert_array_equal(w.sum(1), expected)
        assert not (w & ~candidates).any(), "special tokens or padding chosen"
        np.testing.assert_array_equal(out["targets"], tokens)
        np.testing.assert_array_equal(corrupted[~w], tokens[~w])
        c, o = corrupted[w], tokens[w]
        assert not np.isin(c[c != SPECIAL.mask_id], SPECIAL.all_special).any()
        chosen_n += w.sum()
        mask_n += (c == SPECIAL.mask_id).sum()
        random_n += ((c != SPECIAL.mask_id) & (c != o)).sum()
        same_n += (c == o).sum()
    p_collide = 1 / (SPECIAL.vocab_size - LOW)  # a random replacement equal to the original
    expected = ((mask_n, 0.8), (random_n, 0.1 * (1 - p_collide)), (same_n, 0.1 * (1 + p_collide)))
    for count, p in expected:
        sigma = np.sqrt(p * (1 - p) / chosen_n)
        assert abs(count / chosen_n - p) < 4 * sigma, (count / chosen_n, p)


def test_mlm_chooses_uniformly_over_positions():
    tokens = np.full((512, 40), 150, np.int32)
    mlm = jax.jit(lambda b, k: prepare_mlm(b, k, SPECIAL))
    w = np.asarray(mlm({"inputs": tokens}, jax.random.key(3))["weights"])
    per_position = w.sum(0)  # each row chooses 6 of 40 → p = 0.15 per position
    sigma = np.sqrt(512 * 0.15 * 0.85)
    assert np.abs(per_position - 512 * 0.15).max() < 4.5 * sigma


def test_mlm_nsp_token_types_jit_and_determinism():
    batch = packed_batch(1, with_specials=True)
    batch["nsp_label"] = np.array([0, 1, 0, 1, 1, 0], np.int32)
    batch["inputs_token_types"] = (batch["inputs_positions"] > 3).astype(np.int32)
    eager = prepare_mlm(batch, jax.random.key(7), SPECIAL, None)
    jitted = jax.jit(lambda b, k: prepare_mlm(b, k, SPECIAL, None))(batch, jax.random.key(7))
    jax.tree.map(np.testing.assert_array_equal, eager, jitted)
    np.testing.assert_array_equal(eager["nsp_targets"], batch["nsp_label"])
    np.testing.assert_array_equal(eager["nsp_weights"], np.ones(6))
    np.testing.assert_array_equal(eager["model_inputs"]["token_types"], batch["inputs_token_types"])
    other = prepare_mlm(batch, jax.random.key(8), SPECIAL, None)
    assert (np.asarray(other["weights"]) != np.asarray(eager["weights"])).any()
    with pytest.raises(ValueError, match="mask_rate"):
        prepare_mlm(batch, jax.random.key(0), SPECIAL, MLMOptions(mask_rate=1.5))


@pytest.mark.parametrize("name", ["clm", "sft", "seq2seq", "classify"])
def test_jit_equals_eager(name):
    batch = {**packed_batch(4), **packed_batch(5, prefix="targets"),
             "label": np.arange(6, dtype=np.int32) % 2}
    fn = get_objective(name).prepare
    eager = fn(batch, jax.random.key(0), SPECIAL, None)
    jitted = jax.jit(lambda b, k: fn(b, k, SPECIAL, None))(batch, jax.random.key(0))
    jax.tree.map(np.testing.assert_array_equal, eager, jitted)


def test_registry_and_host_transform():
    assert {"clm", "mlm", "seq2seq", "classify", "sft", "span_corruption"} <= set(OBJECTIVES)
    with pytest.raises(ValueError, match="unknown objective 'nope'"):
        get_objective("nope")
    assert host_transform("clm", SPECIAL) is None
    fn = host_transform("span_corruption", SPECIAL, SpanCorruptionOptions(noise_density=0.3))
    inputs, targets = fn(np.arange(LOW, LOW + 100), np.random.default_rng(0))
    assert len(targets) - 1 - np.isin(targets, SPECIAL.sentinel_ids).sum() == 30
    inputs, targets = host_transform("denoise", SPECIAL)(np.arange(LOW, LOW + 50),
                                                         np.random.default_rng(0))
    np.testing.assert_array_equal(targets, [*range(LOW, LOW + 50), SPECIAL.eos_id])


def test_each_objective_declares_its_data():
    """Data task, framing and host-side step come from the objective (data.task is derived)."""
    declared = {n: (o.data_task, o.framing, o.corrupt) for n, o in OBJECTIVES.items()}
    assert declared == {"clm": ("lm", "eos", None), "mlm": ("lm", "cls_sep", None),
                        "seq2seq": ("seq2seq", "eos", None),
                        "span_corruption": ("span_corruption", "eos", span_corruption),
                        "denoise": ("span_corruption", "eos", denoise),
                        "classify": ("classify", None, None), "sft": ("sft", "eos", None),
                        "qa": ("qa", "cls_sep", None), "plm": ("lm", "eos", None),
                        "cloze": ("classify", "cls_sep", None), "prefix_lm": ("lm", "eos", None),
                        "dpo": ("preference", "eos", None),
                        "dpo_seq2seq": ("preference_seq2seq", "eos", None)}
    transform = get_objective("denoise").example_transform(SPECIAL, DenoiseOptions(infill_rate=0.0))
    example = transform({"inputs": np.arange(LOW, LOW + 9), "extra": 1}, np.random.default_rng(0))
    np.testing.assert_array_equal(example["inputs"], [*range(LOW, LOW + 9), SPECIAL.eos_id])
    np.testing.assert_array_equal(example["targets"], example["inputs"])
    assert example["extra"] == 1 and get_objective("clm").example_transform(SPECIAL) is None


def test_a_new_objective_is_one_registration(monkeypatch):
    from jaxformer.objectives import (
        Objective,
        check_objective,
        option_settings,
        register_objective,
        registry,
    )
    from jaxformer.settings import setting

    monkeypatch.setattr(registry, "OBJECTIVES", dict(registry.OBJECTIVES))

    def reverse(tokens, rng, special, reverse_rate=0.5):
        out = tokens[::-1] if rng.random() < reverse_rate else tokens
        return np.append(out, special.eos_id), np.append(tokens, special.eos_id)

    @dataclasses.dataclass(frozen=True)
    class ReverseOptions:
        reverse_rate: float = setting(0.5, "reverse: probability of reversing an example")

    register_objective(Objective("reverse", prepare_seq2seq, data_task="span_corruption",
                                 corrupt=reverse, options=ReverseOptions))
    assert option_settings()["reverse_rate"].doc.startswith("reverse: probability")
    assert check_objective({"name": "reverse", "reverse_rate": 1.0}) == "reverse"
    with pytest.raises(ValueError, match="objective.reverse_rate=1.0 applies to objective "
                                         "'reverse', not 'clm'"):
        check_objective({"name": "clm", "reverse_rate": 1.0})
    inputs, targets = host_transform("reverse", SPECIAL, ReverseOptions(reverse_rate=1.0))(
        np.arange(LOW, LOW + 4), np.random.default_rng(0))
    np.testing.assert_array_equal(inputs, [LOW + 3, LOW + 2, LOW + 1, LOW, SPECIAL.eos_id])
    with pytest.raises(ValueError, match="already registered"):
        register_objective(Objective("reverse", prepare_clm, data_task="lm"))
    @dataclasses.dataclass(frozen=True)
    class OtherMLMOptions:
        mask_rate: float = setting(0.5, "mlm2: fraction of tokens chosen")

    with pytest.raises(ValueError, match="option 'mask_rate' defaults to 0.5"):
        register_objective(Objective("mlm2", prepare_mlm, data_task="lm", options=OtherMLMOptions))
    with pytest.raises(ValueError, match="options must be a dataclass"):
        Objective("mlm3", prepare_mlm, data_task="lm", options={"mask_rate": 0.15})
    with pytest.raises(ValueError, match="data_task='text'"):
        Objective("bad", prepare_clm, data_task="text")


def runs(mask: np.ndarray) -> list[int]:
    """Lengths of the runs of True in a bool vector."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    return list(np.flatnonzero(edges == -1) - np.flatnonzero(edges == 1))


@pytest.mark.parametrize("density,mean", [(0.15, 3.0), (0.3, 8.0), (0.5, 1.0)])
def test_noise_mask_counts_and_span_lengths(density, mean):
    rng = np.random.default_rng(0)
    lengths = []
    for _ in range(20):
        mask = random_spans_noise_mask(2000, rng, density, mean)
        num_noise = int(np.round(2000 * density))
        assert mask.sum() == num_noise and not mask[0]
        spans = runs(mask)
        assert len(spans) == max(int(np.round(num_noise / mean)), 1) and min(spans) >= 1
        assert len(runs(~mask)) == len(spans)  # interleaved, starting with non-noise
        lengths += spans
    assert abs(np.mean(lengths) - mean) < 0.05 * mean
    if mean > 1:
        assert np.std(lengths) > 0.5  # lengths are random, not all equal to the mean


def test_span_corruption_format_and_reconstruction():
    rng = np.random.default_rng(1)
    for n in [0, 1, 2, 3, 7, 50, 333]:
        for density in (0.15, 0.5):
            tokens = rng.integers(LOW, SPECIAL.vocab_size, n)
            inputs, targets = span_corruption(tokens, rng, SPECIAL, density, 3.0)
            assert inputs[-1] == targets[-1] == SPECIAL.eos_id
            sent_in = inputs[np.isin(inputs, SPECIAL.sentinel_ids)]
            np.testing.assert_array_equal(sent_in, SPECIAL.sentinel_ids[:len(sent_in)])
            np.testing.assert_array_equal(reconstruct_span_corruption(inputs, targets, SPECIAL),
                                          tokens)
            if n >= 2:
                assert len(targets) - 1 - len(sent_in) == min(max(round(n * density), 1), n - 1)


def test_span_corruption_documented_example_and_errors():
    x = np.array([10, 11, 12, 13, 14, 15, 16, 17]) + LOW
    mask = np.array([0, 0, 1, 1, 0, 0, 0, 1], bool)
    s0, s1 = SPECIAL.sentinel_ids[:2]
    np.testing.assert_array_equal(_replace_spans(x, mask, np.asarray(SPECIAL.sentinel_ids)),
                                  [x[0], x[1], s0, x[4], x[5], x[6], s1])
    np.testing.assert_array_equal(_replace_spans(x, ~mask, np.asarray(SPECIAL.sentinel_ids)),
                                  [s0, x[2], x[3], s1, x[7]])
    with pytest.raises(ValueError, match="sentinel"):
        span_corruption(np.array([LOW, s0]), np.random.default_rng(0), SPECIAL)
    few = SpecialTokens(vocab_size=300, sentinel_ids=(7, 8))
    with pytest.raises(ValueError, match="sentinels"):
        span_corruption(np.arange(LOW, LOW + 100), np.random.default_rng(0), few)


def is_subsequence(short, long) -> bool:
    it = iter(long.tolist())
    return all(any(x == y for y in it) for x in short.tolist())


def test_denoise_text_infilling_statistics():
    rng = np.random.default_rng(2)
    spans = covered = total = 0
    for _ in range(10):
        tokens = rng.integers(LOW, SPECIAL.vocab_size, 1000)
        inputs, targets = denoise(tokens, rng, SPECIAL, infill_rate=0.3)
        np.testing.assert_array_equal(targets[:-1], tokens)
        body = inputs[:-1]
        k = int((body == SPECIAL.mask_id).sum())
        assert is_subsequence(body[body != SPECIAL.mask_id], tokens)
        covered += len(tokens) - (len(body) - k)
        spans += k
        total += len(tokens)
    assert covered == round(0.3 * 1000) * 10
    sigma = np.sqrt(3.0 / spans)  # Poisson(3) span lengths: variance 3
    truncation = 10 * 3.0 / spans  # each example's last span is cut short (≲ λ tokens lost)
    assert abs(covered / spans - 3.0) < 4 * sigma + truncation
    lengths = poisson_span_lengths(30000, np.random.default_rng(0), 3.0)
    assert lengths.sum() == 30000 and (lengths == 0).any()
    assert abs(lengths.mean() - 3.0) < 4 * np.sqrt(3.0 / lengths.size) + 1e-3


def test_denoise_masking_and_deletion_rates():
    rng = np.random.default_rng(3)
    tokens = rng.integers(LOW, SPECIAL.vocab_size, 20000)
    inputs, _ = denoise(tokens, rng, SPECIAL, infill_rate=0.0, token_mask_rate=0.2)
    assert len(inputs) == len(tokens) + 1
    frac = (inputs[:-1] == SPECIAL.mask_id).mean()
    assert abs(frac - 0.2) < 4 * np.sqrt(0.2 * 0.8 / 20000)
    keep = inputs[:-1] != SPECIAL.mask_id
    np.testing.assert_array_equal(inputs[:-1][keep], tokens[keep])
    inputs, _ = denoise(tokens, rng, SPECIAL, infill_rate=0.0, delete_rate=0.1)
    assert is_subsequence(inputs[:-1], tokens)
    assert abs(1 - (len(inputs) - 1) / 20000 - 0.1) < 4 * np.sqrt(0.1 * 0.9 / 20000)
    a = denoise(tokens[:100], np.random.default_rng(5), SPECIAL, delete_rate=0.1, token_mask_rate=0.1)
    b = denoise(tokens[:100], np.random.default_rng(5), SPECIAL, delete_rate=0.1, token_mask_rate=0.1)
    np.testing.assert_array_equal(a[0], b[0])
    with pytest.raises(ValueError, match="delete_rate"):
        denoise(tokens, rng, SPECIAL, delete_rate=1.0)


@pytest.mark.parametrize("name,model_preset,overrides", [
    ("clm", "gpt_tiny", {}),
    ("mlm", "bert_tiny", {"nsp_head": True}),
    ("seq2seq", "t5_tiny", {}),
    ("classify", "bert_tiny", {"head": "classify", "num_classes": 3}),
])
def test_model_inputs_fit_the_models(name, model_preset, overrides):
    cfg = ModelConfig.from_dict(preset(model_preset, vocab_size=SPECIAL.vocab_size, **overrides))
    batch = {**packed_batch(0, batch=2, length=12), **packed_batch(1, batch=2, length=8,
                                                                   prefix="targets"),
             "label": np.array([0, 2], np.int32), "nsp_label": np.array([1, 0], np.int32)}
    out = get_objective(name).prepare(batch, jax.random.key(0), SPECIAL, None)
    model = build_model(cfg)
    mi = out["model_inputs"]  # shapes only: trace init + apply without running them
    logits = jax.eval_shape(lambda: model.apply(model.init(jax.random.key(0)), **mi))
    if name == "mlm":
        logits, nsp_logits = logits
        assert nsp_logits.shape[:-1] == out["nsp_targets"].shape
    assert logits.shape[:-1] == out["targets"].shape == out["weights"].shape


def _whole_word_rows(rate_rows: int = 16, length: int = 48):
    """Rows of ``[CLS] sentence [SEP]`` pairs (two segments) from a real sentencepiece tokenizer,
    with each row's word spans taken from the *text* (encode(sentence) = the pieces of its
    whitespace-separated words, one after another)."""
    from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece

    rng = np.random.default_rng(0)
    syllables = "the un watch able ex tra or di nar ly per form ance heart felt dull a is".split()
    vocab = ["".join(rng.choice(syllables, int(rng.integers(1, 4)))) for _ in range(300)]
    texts = [" ".join(rng.choice(vocab, int(rng.integers(3, 8)))) for _ in range(400)]
    tok = Tokenizer(train_sentencepiece(texts, vocab_size=400, num_sentinels=0))
    sp = tok.special
    tokens = np.zeros((rate_rows, length), np.int32)
    seg = np.zeros_like(tokens)
    spans: list[list[tuple[int, int]]] = []
    for b in range(rate_rows):
        t, row_spans = 0, []
        for s in (1, 2):
            words = texts[2 * b + s].split()
            pieces = [tok.encode(w) for w in words]
            assert sum(pieces, []) == tok.encode(texts[2 * b + s])
            ids = [sp.cls_id, *sum(pieces, []), sp.sep_id]
            if t + len(ids) > length:
                break
            tokens[b, t:t + len(ids)], seg[b, t:t + len(ids)] = ids, s
            start = t + 1
            for p in pieces:
                row_spans.append((start, start + len(p)))
                start += len(p)
            t += len(ids)
        spans.append(row_spans)
    return tok, {"inputs": tokens, "inputs_segment_ids": seg}, spans


def test_whole_word_mask_chooses_whole_words_uniformly():
    tok, batch, spans = _whole_word_rows()
    assert any(e - s > 1 for row in spans for s, e in row), "no multi-piece word to test"
    cfg = MLMOptions(mask_rate=0.3, whole_word_mask=True)
    mlm = jax.jit(lambda b, k: prepare_mlm(b, k, tok.special, cfg, tok.word_initial()))
    hits = [np.zeros(len(row)) for row in spans]
    trials = 300
    for i in range(trials):
        w = np.asarray(mlm(batch, jax.random.key(i))["weights"]).astype(bool)
        for b, row in enumerate(spans):
            chosen = [bool(w[b, s:e].all()) for s, e in row]
            for s, e in row:
                assert w[b, s:e].all() or not w[b, s:e].any(), "a word was split"
            covered = np.zeros(w.shape[1], bool)
            for (s, e), c in zip(row, chosen):
                covered[s:e] |= c
            np.testing.assert_array_equal(w[b], covered)  # nothing outside the words
            assert sum(chosen) == max(round(0.3 * len(row)), 1)
            hits[b] += chosen
    freq = np.concatenate(hits) / trials
    multi = np.array([e - s > 1 for row in spans for s, e in row])
    for group in (multi, ~multi):  # long words are chosen as often as one-piece words
        sigma = np.sqrt(0.3 * 0.7 / (trials * group.sum()))
        assert abs(freq[group].mean() - 0.3) < 4 * sigma + 0.01


@pytest.mark.parametrize("name", ["clm", "mlm", "seq2seq", "span_corruption", "denoise", "classify",
                                  "sft"])
def test_an_option_of_another_objective_is_refused(name):
    """Each objective accepts a non-default value of exactly its own options (the MLM rates for
    mlm, T5's noise for span_corruption, BART's for denoise); any other is refused, naming it."""
    from jaxformer.objectives import check_objective, option_classes

    assert check_objective({"name": name}) == name  # every default is accepted
    own = get_objective(name).options
    for cls in option_classes():
        for key, default in dataclasses.asdict(cls()).items():
            changed = {"name": name, key: (not default) if isinstance(default, bool)
                       else default + "_other" if isinstance(default, str) else default + 0.05}
            if own is not None and key in dataclasses.asdict(own()):
                assert check_objective(changed) == name
            else:
                with pytest.raises(ValueError, match=f"objective.{key}=.* not '{name}'"):
                    check_objective(changed)


def test_whole_word_mask_needs_the_table_and_an_mlm_objective():
    from jaxformer.objectives import check_objective

    tok, batch, _ = _whole_word_rows(rate_rows=2)
    with pytest.raises(ValueError, match="word_initial"):
        prepare_mlm(batch, jax.random.key(0), tok.special, MLMOptions(whole_word_mask=True))
    with pytest.raises(ValueError, match="word_initial"):  # bound without the tokenizer
        bind_objective("mlm", MLMOptions(whole_word_mask=True), tok.special)
    with pytest.raises(ValueError, match="whole_word_mask=True applies to objective 'mlm'"):
        check_objective({"name": "clm", "whole_word_mask": True})
    with pytest.raises(ValueError, match="takes options ScheduledSamplingOptions, not dict"):
        bind_objective("clm", {"whole_word_mask": True}, tok.special)
    bound = bind_objective("mlm", MLMOptions(whole_word_mask=True), tok.special, tokenizer=tok)
    assert np.array_equal(bound.keywords["word_initial"], tok.word_initial())
    initial = tok.word_initial()
    for word in ("unwatchable", "the", "heartfelt", "extraordinarily"):
        first, *rest = tok.encode(word)  # a word's first piece begins it, the others continue it
        assert initial[first] and not initial[rest].any()


def test_denoise_from_the_base_config_masks_no_single_tokens():
    """MLM's ``mask_rate`` (0.15 in the base config) is not BART's token masking."""
    from jaxformer.train.config import base_config

    cfg = base_config().objective
    cfg.name, cfg.infill_rate = "denoise", 0.0
    tokens = np.arange(LOW, LOW + 60, dtype=np.int32)
    inputs, targets = host_transform("denoise", SPECIAL, get_objective("denoise").read_options(cfg))(
        tokens, np.random.default_rng(0))
    np.testing.assert_array_equal(inputs, targets)
    cfg.token_mask_rate = 0.5
    inputs, _ = host_transform("denoise", SPECIAL, get_objective("denoise").read_options(cfg))(
        tokens, np.random.default_rng(0))
    assert 15 < np.sum(inputs == SPECIAL.mask_id) < 45


def test_random_roll_makes_every_position_equally_likely_noise():
    """T5's mask always ends with noise, so a short example's one span is always its last tokens;
    rolled (seqio's random_roll), each position is noise with probability num_noise / length."""
    length, trials = 20, 4000
    rng = np.random.default_rng(3)
    plain = np.stack([random_spans_noise_mask(length, rng) for _ in range(200)])
    assert plain[:, -1].all() and plain[:, -3:].all()  # the bias the roll removes
    rolled = np.stack([random_spans_noise_mask(length, rng, random_roll=True)
                       for _ in range(trials)])
    p = 3 / length  # round(20 · 0.15) = 3 noise tokens
    assert (rolled.sum(axis=1) == 3).all()
    sigma = np.sqrt(p * (1 - p) / trials)
    assert np.abs(rolled.mean(axis=0) - p).max() < 5 * sigma
    tokens = rng.integers(LOW, SPECIAL.vocab_size, length)
    for _ in range(50):  # a span wrapped around the end still reconstructs exactly
        inputs, targets = span_corruption(tokens, rng, SPECIAL, random_roll=True)
        np.testing.assert_array_equal(reconstruct_span_corruption(inputs, targets, SPECIAL), tokens)
