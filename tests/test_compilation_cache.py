"""The command lines' persistent compilation cache: where it goes, what turns it off, and that a
second process reads what the first compiled instead of compiling again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = """
import json, jax, jax.numpy as jnp
from jaxformer.compilation_cache import enable_compilation_cache
where = enable_compilation_cache()
seconds = []
jax.monitoring.register_event_duration_secs_listener(
    lambda e, d, **k: seconds.append(d) if e.endswith("backend_compile_duration") else None)
hits = []
jax.monitoring.register_event_listener(
    lambda e, **k: hits.append(e) if e == "/jax/compilation_cache/cache_hits" else None)
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum() + jnp.linalg.norm(jnp.sin(x) @ x))
f(jnp.ones((64, 64))).block_until_ready()
print(json.dumps({"dir": where, "hits": len(hits)}))
"""


def _run(env: dict) -> dict:
    env = {k: v for k, v in {**os.environ, **env}.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # cache even this small program
    out = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_commands_reuse_compiled_programs_from_the_jaxformer_cache(tmp_path):
    env = {"JAXFORMER_CACHE": str(tmp_path)}
    first, second = _run(env), _run(env)
    assert first["dir"] == second["dir"] == str(tmp_path / "xla")
    assert first["hits"] == 0 and second["hits"] >= 1  # the second process compiled nothing new
    assert any((tmp_path / "xla").iterdir())
    assert _run({**env, "JAXFORMER_COMPILATION_CACHE": "0"})["dir"] is None
