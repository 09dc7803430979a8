"""A checkpoint written by the previous release (jax 0.10.2, orbax-checkpoint 0.12.4, Python 3.11;
``tests/data/legacy_gpt_jax010``, made as its README says) still restores on the current stack:
inference gives the recorded parameters and logits, a resumed run continues on the recorded
batch with the recorded losses, and ``init_from`` reads it. Nothing here writes into the fixture.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxformer.checkpoint import load_for_inference
from jaxformer.models import Transformer, build_model
from jaxformer.train.loop import Trainer

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "data" / "legacy_gpt_jax010"
REF = json.loads((FIXTURE / "reference.json").read_text())
sys.path.insert(0, str(FIXTURE))
from make_reference import make_config, params_sha256  # noqa: E402

sys.path.remove(str(FIXTURE))


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


ORBAX_DEPRECATIONS: list[str] = []  # Orbax reports use of its deprecated paths as these events
jax.monitoring.register_event_listener(
    lambda name, **kw: ORBAX_DEPRECATIONS.append(name) if "deprecation" in name else None)


@pytest.fixture
def untouched():
    """The fixture's files are byte-identical after the test, which used no deprecated API."""
    before = tree_digest(FIXTURE)
    ORBAX_DEPRECATIONS.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DeprecationWarning)
        yield FIXTURE / "workdir"
    assert tree_digest(FIXTURE) == before
    ours = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught
            if issubclass(w.category, DeprecationWarning) and "orbax" in w.filename + str(w.message)]
    assert not ours and not ORBAX_DEPRECATIONS, (ours, ORBAX_DEPRECATIONS)


def test_inference_gives_the_recorded_parameters_and_logits(untouched, capsys):
    from jaxformer.cli.generate import main as generate

    model_cfg, params, tokenizer = load_for_inference(untouched)
    assert params_sha256(params) == REF["params_sha256"]  # bit for bit
    logits = np.asarray(build_model(model_cfg).apply(params, jnp.asarray(REF["tokens"], jnp.int32)))
    assert list(logits.shape) == REF["logits_shape"]
    np.testing.assert_allclose(logits[..., :48], REF["logits_first_48"], rtol=1e-5, atol=1e-6)
    assert np.sum(logits, dtype=np.float64) == pytest.approx(REF["logits_sum"], abs=1e-3)
    # the NNX class holds this Linen-era params tree as it is
    held = np.asarray(Transformer(model_cfg, params=params)(jnp.asarray(REF["tokens"], jnp.int32)))
    np.testing.assert_allclose(held[..., :48], REF["logits_first_48"], rtol=1e-5, atol=1e-6)
    assert tokenizer.vocab_size == model_cfg.vocab_size
    assert generate(["--workdir", str(untouched), "--prompt_ids", "2,17,45",
                     "--max_new_tokens", "3"]) == 0
    assert "OUTPUT_IDS" in capsys.readouterr().out


@pytest.mark.slow
def test_resuming_continues_on_the_recorded_batch_with_the_recorded_losses(untouched, tmp_path):
    """The reference script itself, run on the current stack (one CPU device and a batch of 2, as
    the fixture was made; DeprecationWarnings from our code are errors): it resumes a copy of the workdir."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu",
               XLA_FLAGS=" ".join(f for f in os.environ.get("XLA_FLAGS", "").split()
                                  if "device_count" not in f))
    out = tmp_path / "now.json"
    # DeprecationWarnings attributed to our code are errors (a dependency's own stay warnings)
    code = ("import runpy, sys, warnings; warnings.filterwarnings('error', "
            "category=DeprecationWarning, module='jaxformer'); sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code,
                           str(FIXTURE / "make_reference.py"), str(untouched), str(out)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    now = json.loads(out.read_text())
    for key in ("latest_step", "state_step", "rng", "params_sha256", "next_batch_inputs"):
        assert now[key] == REF[key], key  # restored bit for bit, iterator included
    np.testing.assert_allclose(now["logits_first_48"], REF["logits_first_48"], rtol=1e-5, atol=1e-6)
    assert now["resumed_losses"].keys() == REF["resumed_losses"].keys()
    for step, loss in REF["resumed_losses"].items():  # jax 0.10 vs 0.12 XLA: last bits may differ
        assert now["resumed_losses"][step] == pytest.approx(loss, rel=1e-5), step


def test_init_from_the_legacy_workdir(untouched, tmp_path):
    config = make_config(ROOT, 6)
    config.init_from = str(untouched)
    config.data.batch_size = 8  # a new run: one row per simulated device
    trainer = Trainer(config, tmp_path / "ft")
    assert trainer.start_step == 0
    assert params_sha256(jax.device_get(trainer.state.params)) == REF["params_sha256"]
    assert (tmp_path / "ft" / "tokenizer.model").read_bytes() == \
        (untouched / "tokenizer.model").read_bytes()
