"""Packing: every token of every example exactly once, per-segment positions, aligned seq2seq
segments, and packed rows computing what the examples compute alone, in all three families."""

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.config import ModelConfig
from jaxformer.data.packing import TruncationCounter, pack, pad_example, unpack_row
from jaxformer.models import build_model
from jaxformer.models.presets import preset


def _examples(n, max_len, seed=0, with_targets=False):
    """Unique examples: token 0 of example i is 100 + i, so segments can be matched to examples."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = rng.integers(1, 99, size=int(rng.integers(1, max_len + 1))).astype(np.int32)
        x[0] = 100 + i
        ex = {"inputs": x}
        if with_targets:  # a different length, derived from the example's id
            ex["targets"] = np.full(int(rng.integers(1, max_len + 1)), 100 + i, np.int32)
        out.append(ex)
    return out


def _pack_all(examples, lengths, num_bins, **kw):
    ds = grain.MapDataset.source(examples).to_iter_dataset()
    return list(pack(ds, lengths, num_bins=num_bins, **kw))


@pytest.mark.parametrize("num_bins", [1, 4, 16])
def test_packing_keeps_every_token_once_in_order(num_bins):
    examples = _examples(60, 20)
    rows = _pack_all(examples, {"inputs": 24}, num_bins)
    got = []
    for row in rows:
        seg, pos = row["inputs_segment_ids"], row["inputs_positions"]
        assert row["inputs"].shape == seg.shape == pos.shape == (24,)
        assert seg.dtype == pos.dtype == np.int32
        k = seg.max()
        # segments are 1..k in contiguous runs, then padding (0, pad token 0, position 0)
        runs = [s for i, s in enumerate(seg) if i == 0 or seg[i - 1] != s]
        assert runs[:k] == list(range(1, k + 1)) and runs[k:] in ([], [0])
        assert np.all(row["inputs"][seg == 0] == 0) and np.all(pos[seg == 0] == 0)
        for s in range(1, k + 1):  # positions restart at 0 in every segment
            np.testing.assert_array_equal(pos[seg == s], np.arange(np.sum(seg == s)))
        got += unpack_row(row, "inputs")
    assert len(got) == len(examples)
    by_id = {int(x[0]): x for x in got}
    for i, ex in enumerate(examples):
        np.testing.assert_array_equal(by_id[100 + i], ex["inputs"])
    if num_bins == 1:  # one open row: rows are consecutive runs of the stream
        assert [int(x[0]) for x in got] == [100 + i for i in range(len(examples))]


def test_packing_is_denser_than_padding():
    examples = _examples(200, 20)
    rows = _pack_all(examples, {"inputs": 64}, 16)
    tokens = sum(len(e["inputs"]) for e in examples)
    assert len(rows) < len(examples) / 4
    assert tokens / (64 * len(rows)) > 0.9


def test_seq2seq_packing_is_joint_and_aligned():
    examples = _examples(50, 12, seed=1, with_targets=True)
    rows = _pack_all(examples, {"inputs": 16, "targets": 13}, 4)
    seen = []
    for row in rows:
        ins, tgs = unpack_row(row, "inputs"), unpack_row(row, "targets")
        assert len(ins) == len(tgs)  # an example enters a row only if both features fit
        for x, y in zip(ins, tgs):
            assert np.all(y == x[0])  # segment k of the targets is the same example's
            seen.append(int(x[0]))
        assert np.all(row["targets_positions"][row["targets_segment_ids"] == 0] == 0)
    assert sorted(seen) == [100 + i for i in range(len(examples))]


def test_meta_features_are_packed_without_segment_keys():
    examples = [{"inputs": np.arange(1, n + 1, dtype=np.int32),
                 "inputs_loss_mask": (np.arange(n) >= n // 2).astype(np.int32)} for n in (3, 5, 4)]
    rows = _pack_all(examples, {"inputs": 8, "inputs_loss_mask": 8}, 2,
                     meta_features=("inputs_loss_mask",))
    assert set(rows[0]) == {"inputs", "inputs_segment_ids", "inputs_positions", "inputs_loss_mask"}
    np.testing.assert_array_equal(rows[0]["inputs_loss_mask"], [0, 1, 1, 0, 0, 1, 1, 1])


def test_pad_example_and_errors():
    out = pad_example({"inputs": np.array([5, 6, 7], np.int32), "label": np.int32(1)},
                      {"inputs": 5}, pad_id=0)
    np.testing.assert_array_equal(out["inputs"], [5, 6, 7, 0, 0])
    np.testing.assert_array_equal(out["inputs_segment_ids"], [1, 1, 1, 0, 0])
    np.testing.assert_array_equal(out["inputs_positions"], [0, 1, 2, 0, 0])
    assert out["label"] == 1
    with pytest.raises(ValueError, match="more than the row length"):
        pad_example({"inputs": np.arange(6)}, {"inputs": 5})
    with pytest.raises(ValueError, match="num_bins"):
        pack(grain.MapDataset.source([]).to_iter_dataset(), {"inputs": 4}, num_bins=0)


def test_truncation_counter_counts():
    c = TruncationCounter("t")
    for cut in (0, 3, 0, 5):
        c.record(cut)
    c.record_empty()
    assert (c.seen, c.truncated, c.tokens_cut, c.empty) == (5, 2, 8, 1)


# --------------------------------------------------------------------------------------------------
# Packed rows through the models: each segment's outputs equal the example run alone.

# First fit into rows of 16: inputs [6, 8, 2] + [6, 8], targets [7, 5, 4] + [7, 5]. Few distinct
# shapes keep the number of compilations (and the test time) low.
LENGTHS = (6, 8, 6, 8, 2)
TARGET_LENGTHS = (7, 5, 7, 5, 4)


def _tiny(name, **kw):
    return ModelConfig.from_dict(preset(name, dropout_rate=0.0, attention_dropout_rate=0.0, **kw))


def _packed_rows(with_targets):
    rng = np.random.default_rng(0)
    exs = []
    for i, n in enumerate(LENGTHS):
        ex = {"inputs": rng.integers(7, 500, n).astype(np.int32)}
        ex["inputs"][0] = 7 + i  # distinct first tokens identify the examples
        if with_targets:
            ex["targets"] = rng.integers(7, 500, TARGET_LENGTHS[i]).astype(np.int32)
        exs.append(ex)
    lengths = {"inputs": 16, **({"targets": 16} if with_targets else {})}
    rows = _pack_all(exs, lengths, 2)
    batch = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    np.testing.assert_array_equal(batch["inputs_segment_ids"].max(axis=1), [3, 2])
    return exs, batch


def _check_segments(exs, batch, feature, packed, run_alone):
    """Compare every packed segment of ``feature`` with its example run alone (examples of one
    shape run together as a batch: rows of a batch do not interact)."""
    seg = batch[f"{feature}_segment_ids"]
    groups = {}
    for ex in exs:
        groups.setdefault(tuple(len(v) for v in ex.values()), []).append(ex)
    alone = {}
    for group in groups.values():
        out = run_alone({k: jnp.asarray(np.stack([e[k] for e in group])) for k in group[0]})
        alone.update({int(e["inputs"][0]): out[i] for i, e in enumerate(group)})
    checked = 0
    for r in range(seg.shape[0]):
        for s in range(1, seg[r].max() + 1):
            first = int(batch["inputs"][r][batch["inputs_segment_ids"][r] == s][0])
            np.testing.assert_allclose(packed[r][seg[r] == s], alone[first], atol=1e-5, rtol=1e-5)
            checked += 1
    assert checked == len(exs)


@pytest.mark.slow
@pytest.mark.parametrize("name, kw", [("gpt_tiny", {}), ("gpt_tiny", {"position": "rope"}),
                                      ("gpt_tiny", {"position": "sinusoidal"}),
                                      ("bert_tiny", {"head": "none", "pooler": False})])
def test_packed_rows_match_separate_examples_single_stack(name, kw):
    cfg = _tiny(name, **kw)
    model = build_model(cfg)
    exs, batch = _packed_rows(with_targets=False)
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    params = model.init(jax.random.key(0))
    apply = jax.jit(model.apply)
    packed = apply(params, b["inputs"], positions=b["inputs_positions"],
                   segment_ids=b["inputs_segment_ids"])
    _check_segments(exs, batch, "inputs", packed, lambda e: apply(params, e["inputs"]))


@pytest.mark.slow
def test_packed_rows_match_separate_examples_encoder_decoder():
    """Decoder logits per target segment (T5: relative position bias from the packed positions)."""
    model = build_model(_tiny("t5_tiny"))
    exs, batch = _packed_rows(with_targets=True)
    b = {k: jnp.asarray(v) for k, v in batch.items()}
    params = model.init(jax.random.key(0))
    # "targets" stand in for the shifted decoder inputs: packing treats both alike.
    apply = jax.jit(model.apply)
    packed = apply(params, b["inputs"], b["targets"], inputs_positions=b["inputs_positions"],
                   inputs_segment_ids=b["inputs_segment_ids"],
                   targets_positions=b["targets_positions"],
                   targets_segment_ids=b["targets_segment_ids"])
    _check_segments(exs, batch, "targets", packed,
                    lambda e: apply(params, e["inputs"], e["targets"]))
