"""DPO (jaxformer/ops/preference.py, objectives/dpo.py, data/preference.py): the loss and its gradient
against float64 NumPy formulas, the pair layout against each half run alone, step 0 (log 2, zero
rewards) on random decoders and encoder-decoders, and JSONL pairs through the ``files:`` source."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from golden import GOLDEN
from test_pipeline import _texts

from jaxformer.config import ModelConfig
from jaxformer.data.preference import decoder_pair, seq2seq_pair
from jaxformer.models import build_model
from jaxformer.models.presets import preset
from jaxformer.objectives.dpo import DPOOptions, pair_logprobs, pair_losses, prepare_dpo
from jaxformer.objectives.dpo import dpo_sums as _dpo_sums
from jaxformer.ops.preference import preference_loss, segment_sums
from jaxformer.vocab import SpecialTokens

SPECIAL = SpecialTokens(vocab_size=61, pad_id=0, eos_id=1, bos_id=2)
SMALL = dict(vocab_size=61, d_model=32, num_heads=2, d_ff=64, num_layers=2, max_len=64)


def _np_loss(pc, pr, rc, rr, beta, eps, loss_type):
    """float64 DPO (Rafailov et al. eq. 7), cDPO and IPO (Azar et al. eq. 17) and dL/d(pc, pr)."""
    h = (pc - rc) - (pr - rr)
    sig = lambda x: 1.0 / (1.0 + np.exp(-x))
    if loss_type == "ipo":
        loss, dh = (h - 1 / (2 * beta)) ** 2, 2 * (h - 1 / (2 * beta))
    else:
        loss = -(1 - eps) * np.log(sig(beta * h)) - eps * np.log(sig(-beta * h))
        dh = -(1 - eps) * beta * sig(-beta * h) + eps * beta * sig(beta * h)
    return loss, dh, -dh


@pytest.mark.parametrize("beta,eps,loss_type", [(0.1, 0.0, "sigmoid"), (0.5, 0.2, "sigmoid"),
                                                (2.0, 0.0, "sigmoid"), (0.3, 0.0, "ipo")])
def test_loss_and_gradient_match_float64_formulas(beta, eps, loss_type):
    rng = np.random.default_rng(0)
    pc, pr, rc, rr = (rng.normal(-20, 6, 16) for _ in range(4))
    loss, dpc, dpr = _np_loss(pc, pr, rc, rr, beta, eps, loss_type)
    f = lambda a, b: preference_loss(a, b, jnp.asarray(rc, jnp.float32), jnp.asarray(rr, jnp.float32),
                                     beta=beta, label_smoothing=eps, loss_type=loss_type)
    losses, chosen, rejected = f(jnp.asarray(pc, jnp.float32), jnp.asarray(pr, jnp.float32))
    np.testing.assert_allclose(losses, loss, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(chosen, beta * (pc - rc), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rejected, beta * (pr - rr), rtol=1e-5, atol=1e-5)
    ga, gb = jax.grad(lambda a, b: f(a, b)[0].sum(), argnums=(0, 1))(
        jnp.asarray(pc, jnp.float32), jnp.asarray(pr, jnp.float32))
    np.testing.assert_allclose(ga, dpc, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(gb, dpr, rtol=1e-4, atol=1e-6)


def test_no_gradient_reaches_the_reference_and_bad_options_are_refused():
    g = jax.grad(lambda r: preference_loss(jnp.ones(3), jnp.zeros(3), r, r, beta=0.1)[0].sum())(
        jnp.ones(3))
    assert not np.any(g)
    with pytest.raises(ValueError, match="loss_type='hinge'"):
        preference_loss(jnp.ones(1), jnp.ones(1), jnp.ones(1), jnp.ones(1), beta=1, loss_type="hinge")
    with pytest.raises(ValueError, match="label_smoothing"):
        preference_loss(jnp.ones(1), jnp.ones(1), jnp.ones(1), jnp.ones(1), beta=1,
                        label_smoothing=0.5)


def test_segment_sums_match_a_loop():
    rng = np.random.default_rng(1)
    values, seg = rng.normal(size=(3, 11)), rng.integers(0, 6, (3, 11))
    got = segment_sums(jnp.asarray(values), jnp.asarray(seg), 4)
    want = np.array([[values[b][seg[b] == s + 1].sum() for s in range(4)] for b in range(3)])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def _decoder_batch(pairs, seq_len=40, bos=True):
    """``pairs`` (prompt, chosen, rejected) packed one after another into one row per call."""
    rows = [decoder_pair(*map(np.asarray, p), bos=np.array([2] if bos else [], np.int32), eos=1,
                         seq_len=seq_len)[0] for p in pairs]
    batch = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    batch["inputs_segment_ids"] = np.concatenate([np.full(len(r["inputs"]), i + 1)
                                                  for i, r in enumerate(rows)])
    pad = seq_len - len(batch["inputs"])
    return {k: jnp.asarray(np.pad(v, (0, pad)))[None] for k, v in batch.items()}


def _seq2seq_batch(pairs, seq_len=24, target_len=24):
    rows = [seq2seq_pair(*map(np.asarray, p), eos=1, seq_len=seq_len, target_len=target_len)[0]
            for p in pairs]
    batch = {}
    for side, n in (("inputs", seq_len), ("targets", target_len)):
        for k in (side, f"{side}_pair"):
            batch[k] = np.pad(np.concatenate([r[k] for r in rows]),
                              (0, n - sum(len(r[k]) for r in rows)))
        batch[f"{side}_segment_ids"] = np.pad(np.concatenate(
            [np.full(len(r[side]), i + 1) for i, r in enumerate(rows)]), (0, n - len(
                np.concatenate([r[side] for r in rows]))))
    return {k: jnp.asarray(v)[None] for k, v in batch.items()}


PAIRS = [([5, 6, 7], [8, 9], [10, 11, 12]), ([13, 14], [15], [16, 17])]


def test_decoder_pairs_split_into_halves_with_their_own_positions():
    out = prepare_dpo(_decoder_batch(PAIRS), None, SPECIAL)
    seg, pos = out["model_inputs"]["segment_ids"][0], out["model_inputs"]["positions"][0]
    # pair 1: [2 5 6 7 8 9 1 | 2 5 6 7 10 11 12 1], pair 2: [2 13 14 15 1 | 2 13 14 16 17 1], pad
    np.testing.assert_array_equal(seg[:27], [1] * 7 + [2] * 8 + [3] * 5 + [4] * 6 + [0])
    np.testing.assert_array_equal(pos[:15], list(range(7)) + list(range(8)))
    # weights: the positions whose next token is a response token (or its EOS)
    np.testing.assert_array_equal(np.flatnonzero(out["weights"][0]), [3, 4, 5, 10, 11, 12, 13,
                                                                      17, 18, 22, 23, 24])


def _model(name, **kw):
    cfg = ModelConfig.from_dict({**preset(name), **SMALL, **kw})
    return cfg, build_model(cfg)


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def test_each_half_of_a_packed_pair_scores_as_that_sequence_alone():
    cfg, model = _model("gpt_tiny")
    params = model.init(jax.random.key(0))
    out = prepare_dpo(_decoder_batch(PAIRS), None, SPECIAL)
    logp, count = pair_logprobs(model.apply(params, **out["model_inputs"]), out)
    alone = [([2, *p, *resp, 1], 1 + len(p)) for p, c, r in PAIRS for resp in (c, r)]
    rows = np.array([np.pad(t, (0, 16 - len(t))) for t, _ in alone])  # right padding: causal
    want = _log_softmax(np.asarray(model.apply(params, tokens=jnp.asarray(rows)), np.float64))
    for k, (tokens, start) in enumerate(alone):
        pair, half = divmod(k, 2)
        by_hand = sum(want[k, t - 1, tokens[t]] for t in range(start, len(tokens)))
        np.testing.assert_allclose(logp[half, 0, pair], by_hand, rtol=1e-4)
        assert count[half, 0, pair] == len(tokens) - start


@pytest.mark.parametrize("name,batch_fn,seed", [("gpt_tiny", _decoder_batch, 0),
                                                ("gpt_tiny", _decoder_batch, 3),
                                                ("llama_tiny", _decoder_batch, 0),
                                                ("t5_tiny", _seq2seq_batch, 0)])
def test_at_step_zero_the_loss_is_log_2_and_the_rewards_are_0(name, batch_fn, seed):
    cfg, model = _model(name)
    params = model.init(jax.random.key(seed))
    prepared = prepare_dpo(batch_fn(PAIRS), None, SPECIAL)
    options = DPOOptions(dpo_beta=0.5)
    grads = jax.jit(jax.grad(lambda p: _dpo_sums(model, p, params, prepared, options)["loss"]))(params)
    sums = jax.tree.map(float, _dpo_sums(model, params, params, prepared, options))
    assert sums["weight"] == 2
    np.testing.assert_allclose(sums["loss"] / 2, np.log(2), rtol=1e-6)
    for k in ("rewards_chosen", "rewards_rejected", "rewards_margins"):
        assert sums[k] == 0.0
    assert sums["logps_chosen"] < 0 and sums["logps_rejected"] < 0
    assert optax_norm(grads) > 0  # the gradient −β/2 ∇(log π(y_w) − log π(y_l)) is not zero


def optax_norm(tree) -> float:
    return float(jnp.sqrt(sum(jnp.sum(jnp.square(x)) for x in jax.tree.leaves(tree))))


def test_truncation_cuts_the_prompt_from_the_left_then_the_responses():
    bos = np.array([2], np.int32)
    ex, cut = decoder_pair(np.arange(10, 20), np.array([30, 31]), np.array([40]), bos=bos, eos=1,
                           seq_len=16)
    # room for the prompt: (16 − 3 − 2) // 2 − 1 = 4 tokens, its last ones
    np.testing.assert_array_equal(ex["inputs"], [2, 16, 17, 18, 19, 30, 31, 1,
                                                 2, 16, 17, 18, 19, 40, 1])
    assert cut == 2 * 6
    ex, cut = decoder_pair(np.arange(10, 13), np.arange(30, 40), np.arange(40, 45), bos=bos, eos=1,
                           seq_len=12)
    assert len(ex["inputs"]) <= 12 and cut == 2 * 4 + 11 + 6 - len(ex["inputs"])
    assert ex["inputs_loss_mask"].sum() == len(ex["inputs"]) - 2  # no prompt token left
    ex, cut = seq2seq_pair(np.arange(10, 20), np.array([30]), np.array([40]), eos=1, seq_len=8,
                           target_len=8)
    np.testing.assert_array_equal(ex["inputs"], [17, 18, 19, 1, 17, 18, 19, 1])
    np.testing.assert_array_equal(ex["targets"], [30, 1, 40, 1])
    assert cut == 2 * 7


@pytest.mark.parametrize("objective", ["dpo", "dpo_seq2seq"])
def test_jsonl_pairs_through_the_files_source(objective, tmp_path):
    from jaxformer.data.pipeline import DataSettings, make_dataset
    from jaxformer.data.tokenizer import Tokenizer, train_sentencepiece

    words = ["red", "green", "blue", "stone", "river", "cloud", "light", "table"]
    path = tmp_path / "pairs.jsonl"
    with open(path, "w") as f:
        for i in range(12):
            p = " ".join(words[(i + j) % 8] for j in range(3 + i % 4))
            f.write(json.dumps({"prompt": p, "chosen": " ".join(p.split()[::-1]),
                                "rejected": words[i % 8]}) + "\n")
    tok = Tokenizer(train_sentencepiece(_texts(300, seed=1), vocab_size=400))
    data = DataSettings(source=f"files:{path}", seq_len=64, target_len=48, batch_size=4,
                        shuffle=False)
    it = iter(make_dataset(data, "train", tok, seed=0, objective=objective, num_epochs=1,
                           report=False))
    batch = next(it)
    prepared = prepare_dpo(batch, None, tok.special)
    seg = np.asarray(prepared["pair_segment_ids"])
    first = json.loads(path.read_text().splitlines()[0])
    pair_tokens = [tok.encode(first[k]) for k in ("prompt", "chosen", "rejected")]
    targets = np.asarray(prepared["targets"][0])
    w = np.asarray(prepared["weights"][0]) > 0
    chosen = targets[w & (seg[0] == 1)]
    rejected = targets[w & (seg[0] == 2)]
    eos = tok.special.eos_id
    np.testing.assert_array_equal(chosen, [*pair_tokens[1], eos])
    np.testing.assert_array_equal(rejected, [*pair_tokens[2], eos])
    it.close()


TRL = np.load(GOLDEN / "trl_dpo" / "reference.npz")  # tests/make_golden_trl.py (TRL 1.16)


@pytest.mark.parametrize("case", sorted({k.partition("/")[0] for k in TRL.files}))
def test_matches_trls_dpo_trainer_loss_gradient_and_metrics(case):
    """TRL's ``DPOTrainer._compute_loss`` (run by the golden maker) on the same per-token
    log-probabilities: the mean loss, its gradient with respect to them, and TRL's logged rewards."""
    g = {k.partition("/")[2]: TRL[k] for k in TRL.files if k.startswith(case + "/")}
    loss_type, beta = case.split("_beta")[0], float(g["beta"])
    options = DPOOptions(dpo_beta=beta, dpo_loss=loss_type)
    mask = g["completion_mask"][:, 1:].astype(np.float32)  # the positions whose token is scored
    n = len(mask) // 2
    counts = jnp.asarray(mask.sum(1).reshape(2, n))
    reference = jnp.asarray(np.stack([g["ref_chosen_logps"], g["ref_rejected_logps"]]), jnp.float32)

    def mean_loss(token_logps):
        policy = (token_logps * mask).sum(1).reshape(2, n)
        losses, chosen, rejected = pair_losses(policy, reference, counts, options)
        return losses.mean(), (chosen, rejected, policy)

    (loss, (chosen, rejected, policy)), grad = jax.value_and_grad(mean_loss, has_aux=True)(
        jnp.asarray(g["token_logps"], jnp.float32))
    np.testing.assert_allclose(loss, g["loss"], rtol=1e-5)
    # TRL sums every position of its log_probs (0 off the completion), so its gradient there is the
    # row's; ours reaches only the scored positions, where the two agree
    np.testing.assert_allclose(grad, g["grad"] * mask, rtol=1e-4, atol=1e-7)
    ours = {"rewards_chosen": chosen.mean(), "rewards_rejected": rejected.mean(),
            "rewards_accuracies": (chosen > rejected).mean(), "rewards_margins": (chosen - rejected).mean(),
            "logps_chosen": policy[0].mean(), "logps_rejected": policy[1].mean()}
    for k, v in ours.items():
        np.testing.assert_allclose(v, g[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_the_plan_counts_the_reference_and_lora_keeps_no_second_copy(tmp_path):
    """`jaxformer.plan` (what jaxformer-plan reports): full DPO holds the policy, its optimizer state
    and the reference (a second copy of the parameters); LoRA-DPO holds the base once (its frozen
    tree is the reference) and trains adapters only."""
    from jaxformer.convert import save_hf
    from jaxformer.plan import plan
    from jaxformer.train.config import load_config, set_key

    cfg = ModelConfig.from_dict(preset("llama_tiny", vocab_size=512))
    save_hf(cfg, build_model(cfg).init(jax.random.key(0)), tmp_path / "llama")
    reports = {}
    for rank in (0, 4):
        config = load_config(Path(__file__).resolve().parents[1] / "configs" / "llama_dpo.py")
        for key, value in {"init_from": str(tmp_path / "llama"), "data.seq_len": 32,
                           "data.batch_size": 8, "optimizer.lora.rank": rank,
                           "data.tokenizer.vocab_size": 512}.items():
            set_key(config, key, value)
        reports[rank] = plan(config, compile=False)
    full, lora = reports[0], reports[4]
    n_bytes = 4 * full["parameters"]  # float32
    assert full["params_bytes"]["total"] == full["frozen_bytes"]["total"] == n_bytes
    assert lora["frozen_bytes"]["total"] == n_bytes  # the base: the reference, once
    assert lora["params_bytes"]["total"] < 0.1 * n_bytes  # adapters only
    assert lora["parameters"] == full["parameters"]  # the model's, as its FLOPs
    assert lora["opt_state_bytes"]["total"] < 0.1 * full["opt_state_bytes"]["total"]


@pytest.mark.parametrize("name,batch_fn", [("t5_tiny", _seq2seq_batch)])  # decoders: test_dpo_run
def test_a_few_dpo_steps_raise_the_chosen_ratio_and_lower_the_rejected(name, batch_fn):
    """The trainer's step with the DPO hook (reference: the initial weights) on a toy preference
    (chosen = the prompt reversed, rejected = a shuffle): after 12 steps every pair is ranked right,
    the chosen log-ratio rose and the rejected one fell, for an encoder-decoder (the decoder's toy:
    tests/test_dpo_run.py)."""
    import optax

    from jaxformer.train.dpo_run import DPOLoss
    from jaxformer.train.state import TrainState
    from jaxformer.train.step import StepHooks, make_train_step

    rng = np.random.default_rng(0)
    pairs = []
    for _ in range(4):
        prompt = rng.choice(np.arange(3, 40), 5, replace=False)
        pairs.append((prompt, prompt[::-1], rng.permutation(prompt)))
    rows = [batch_fn([p]) for p in pairs]  # one pair a row
    batch = {k: jnp.concatenate([r[k] for r in rows]) for k in rows[0]}
    cfg, model = _model(name, dropout_rate=0.0)
    params, options, tx = model.init(jax.random.key(0)), DPOOptions(dpo_beta=0.5), optax.adam(3e-3)
    prepare = lambda b, k: prepare_dpo(b, k, SPECIAL)
    step = jax.jit(make_train_step(model, tx, prepare, lambda s: 3e-3,
                                   hooks=StepHooks(loss=DPOLoss(options))))
    state = TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params),
                       rng=jax.random.key_data(jax.random.key(0)))
    for _ in range(12):
        state, metrics = step(state, batch, params)
    after = jax.tree.map(float, _dpo_sums(model, state.params, params, prepare(batch, None), options))
    assert after["weight"] == 4 and after["correct"] == 4
    assert after["rewards_chosen"] > 0 > after["rewards_rejected"], after
