"""The trainer's own throughput logs (issue 59 §4, issue 60 §7): model FLOPs against a hand count,
the logged TFLOP/s per device = FLOPs per step / step time / devices, MFU against the peak, the
phases of the clock and the goodput line, a profile of the asked steps, plain log lines when the
progress bar is off, and the chip table read by device kind."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import pytest

from jaxformer.checkpoint import read_metrics
from jaxformer.config import ModelConfig
from jaxformer.flops import chip_of, model_flops, train_step_flops
from jaxformer.models import build_model
from jaxformer.parallel.topology import CHIPS
from jaxformer.plan import preset_config
from jaxformer.train import throughput
from jaxformer.train.config import load_config, train_settings, validate_config
from jaxformer.train.loop import Trainer
from jaxformer.train.throughput import Throughput, goodput_line, profile_window

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model.vocab_size": 384, "model.d_model": 16, "model.num_heads": 2, "model.d_ff": 32,
        "model.num_layers": 1, "model.max_len": 32, "data.tokenizer.vocab_size": 384,
        "data.tokenizer.max_train_texts": 500, "data.seq_len": 16, "data.batch_size": 8,
        "checkpoint.every_steps": 2, "checkpoint.async_save": False, "eval.num_batches": 1,
        "eval.every_steps": 2, "log_every_steps": 1, "progress_bar": False,
        "optimizer.warmup_steps": 2, "num_train_steps": 4, "profile_steps": "3,3"}


def test_model_flops_equal_a_hand_count():
    """A 2-layer GPT (d=16, 2 heads × 8, d_ff=32, vocab 64, tied output), batch 3 × 10 tokens:
    per layer q, k, v, o (4 · 16·16) and the FFN (2 · 16·32), plus the tied unembedding 64·16, at
    6 FLOPs per weight per token; attention 12 · B · L² · H·Dh per layer, halved (causal)."""
    cfg = ModelConfig(family="decoder", vocab_size=64, d_model=16, num_heads=2, d_ff=32,
                      num_layers=2, max_len=32)
    params = build_model(cfg).abstract()
    b, length = 3, 10
    weights = 2 * (4 * 16 * 16 + 2 * 16 * 32) + 64 * 16
    dense = 6 * weights * b * length
    attention = 12 * b * length**2 * 16 * 2 / 2
    f = model_flops(cfg, params, b, length, length)
    assert f["dense_flops_per_step"] == dense and f["attention_flops_per_step"] == attention
    assert f["model_flops_per_step"] == dense + attention and f["tokens_per_step"] == b * length
    bidirectional = dataclasses.replace(cfg, family="encoder", head="mlm")
    assert model_flops(bidirectional, build_model(bidirectional).abstract(),
                       b, length, length)["attention_flops_per_step"] == 2 * attention


def test_mlm_head_flops_count_only_the_predicted_positions():
    """A 2-layer BERT (d=16, 2 heads × 8, d_ff=32, vocab 64, tied output, BERT's MLM transform),
    batch 3 × 10 tokens, the head at 2 gathered positions a row: per layer q, k, v, o and the FFN
    at 30 tokens; the MLM transform (16·16) and the tied decoder (64·16) at 3·2 rows; attention
    12 · B · L² · H·Dh per layer (bidirectional)."""
    cfg = ModelConfig(family="encoder", head="mlm", vocab_size=64, d_model=16, num_heads=2, d_ff=32,
                      num_layers=2, max_len=32, mlm_transform=True)
    params = build_model(cfg).abstract()
    b, length, p = 3, 10, 2
    layers = 6 * 2 * (4 * 16 * 16 + 2 * 16 * 32) * b * length
    head = 6 * (16 * 16 + 64 * 16) * b * p
    f = model_flops(cfg, params, b, length, length, predictions=p)
    assert f["dense_flops_per_step"] == layers + head
    assert f["attention_flops_per_step"] == 12 * b * length**2 * 16 * 2
    every = model_flops(cfg, params, b, length, length)  # predictions=0: the head at all L
    assert every["dense_flops_per_step"] - f["dense_flops_per_step"] == 6 * (16 * 16 + 64 * 16) * b * (
        length - p)


def test_train_step_flops_read_the_mlm_objective_slots():
    """The trainer's and the roofline's count (`train_step_flops`): bert_base at L=512 runs its MLM
    head at BERT's 80 slots a row (`max_predictions`); ``max_predictions_per_seq=0`` (every
    position) counts all 512, and GPT's LM head is unchanged."""
    c = preset_config("bert_base", batch=2, seq_len=512)
    cfg = ModelConfig.from_dict(c.model)
    params = build_model(cfg).abstract()
    flops = train_step_flops(train_settings(c, cfg), params)
    assert flops == model_flops(cfg, params, 2, 512, 512, predictions=80)
    c.objective.max_predictions_per_seq = 0
    assert train_step_flops(train_settings(c, cfg), params) == model_flops(cfg, params, 2, 512, 512)


def test_the_chip_table_is_read_by_device_kind():
    assert chip_of("TPU v5 lite") is CHIPS["v5e"] and chip_of("TPU v5p") is CHIPS["v5p"]
    assert chip_of("NVIDIA H100 80GB HBM3") is CHIPS["h100"] and chip_of("NVIDIA H200") is CHIPS["h200"]
    assert chip_of("cpu") is None


def test_the_clock_leaves_phases_and_the_compiled_step_out(monkeypatch):
    """Fake seconds: step 1 compiles (10 s); steps 2–5 take 1 s each, with a 3 s evaluation and a
    2 s checkpoint between: the row of step 5 has a step time of 1 s, not (20 − 10) / 4."""
    now = iter([0.0, 19.0, 19.0, 24.0])
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(now))
    clock = Throughput(0, flops_per_step=4e12, num_devices=2, peak_flops=1e12)  # start: 0
    clock.add("compilation", 10.0, steps=1)
    clock.add("evaluation", 3.0)
    clock.add("checkpoint", 2.0)
    row = clock.row(5, count=100.0)  # at 19 s
    assert row == {"step_time_s": 1.0, "tokens_per_s": 100.0, "tflops_per_device": 2.0, "mfu": 2.0}
    assert clock.row(5) == {}  # no step since
    clock.add("data_wait", 1.0)
    g = clock.goodput()  # at 24 s, a 1 s data wait since
    assert g["wall_s"] == 24.0 and g["steps_s"] == 24.0 - 16.0 and g["goodput"] == 8.0 / 24.0
    assert goodput_line(g) == ("goodput 33.3%: 8.0 s of 24.0 s in training steps; compilation "
                               "10.0 s, data wait 1.0 s, evaluation 3.0 s, checkpoint 2.0 s")


@pytest.mark.parametrize("value", ["3", "2,4", ""])
def test_profile_steps_are_parsed(value):
    assert profile_window(value) == {"3": (3, 3), "2,4": (2, 4), "": None}[value]


def test_bad_profile_steps_are_refused_naming_the_key():
    with pytest.raises(ValueError, match=r"profile_steps='4,2' is invalid: expected 'N,M'"):
        validate_config(load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", {"profile_steps": "4,2"}))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """4 steps of a tiny GPT, a row per step, evaluated at 2 and 4, step 3 profiled, no bar."""
    wd = tmp_path_factory.mktemp("throughput") / "run"
    trainer = Trainer(load_config(ROOT / "configs" / "gpt_pretrain_tiny.py", TINY), wd)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        summary = trainer.run()
    return wd, trainer, summary, out.getvalue()


def test_logged_tflops_are_model_flops_over_the_step_time(run):
    wd, trainer, _, out = run
    c = trainer.config
    flops = model_flops(trainer.model_cfg, trainer.state.params, c.data.batch_size, c.data.seq_len,
                        c.data.target_len)["model_flops_per_step"]
    rows = [r for r in read_metrics(wd) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert "step_time_s" not in rows[0]  # step 1: compiled, left out
    devices = trainer.mesh.devices.size  # 1, or 8 on the many-device worker of `make test`
    for r in rows[1:]:
        assert r["tflops_per_device"] * 1e12 == pytest.approx(flops / r["step_time_s"] / devices,
                                                              rel=1e-12)
        assert r["tokens_per_s"] == pytest.approx(r["tokens"] / r["step_time_s"], rel=1e-12)
    peaks = {r["tflops_per_device"] * 1e12 / r["mfu"] for r in rows[1:]}  # one peak, measured once
    assert max(peaks) == pytest.approx(min(peaks), rel=1e-9)
    assert (f"MFU: model FLOPs {flops:.4g} per step over {devices} device{'s' * (devices != 1)}, "
            "against cpu: float32 512² matmul measured at start-up") in out


def test_the_run_ends_with_a_goodput_line(run):
    wd, _, summary, out = run
    g = json.loads((wd / "goodput.json").read_text())
    assert 0 < g["goodput"] < 1
    assert not set(throughput.TIMING_KEYS) & set(summary)  # the same summary on every process
    assert g["steps_s"] + sum(g[f"{k}_s"] for k in throughput.PHASES) == pytest.approx(g["wall_s"])
    assert g["compilation_s"] > 0 and g["evaluation_s"] > 0 and g["checkpoint_s"] > 0
    assert goodput_line(g) in out  # the same figures, printed


def test_profile_steps_write_a_trace(run):
    wd = run[0]
    traces = list((wd / "profile" / "plugins" / "profile").glob("*/*"))
    names = {p.name.split(".", 1)[-1] for p in traces}
    assert {"xplane.pb", "trace.json.gz"} <= names, traces
    assert all(p.stat().st_size > 0 for p in traces)


def test_a_log_without_a_bar_has_a_line_per_row_and_evaluation(run):
    out = run[3].splitlines()
    steps = [line for line in out if line.startswith("step ") and " eval:" not in line]
    assert [line.split(":")[0] for line in steps] == ["step 1/4", "step 2/4", "step 3/4", "step 4/4"]
    assert "tokens/s" in steps[1] and "TFLOP/s/device" in steps[1] and "MFU " in steps[1]
    assert "ETA 0:00:00" in steps[3]
    evals = [line for line in out if " eval: " in line]
    assert [line.split(" eval:")[0] for line in evals] == ["step 2/4", "step 4/4"]
    assert "eval_loss " in evals[0] and "eval_accuracy " in evals[0]
