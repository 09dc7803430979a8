"""Runs in other processes: multi-host training simulated on one machine (two processes joined by
`jax.distributed`), one of them killed or preempted, and the memory planner compiling for a mesh
this process does not have.

Each process runs ``train.py`` with 4 simulated CPU devices (collectives over Gloo), so the mesh
``data=2,fsdp=2,tensor=2`` spans 8 devices in 2 processes. The run is launched exactly as on
several GPU hosts (``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``); each
process reads its own half of the data and feeds its 4 rows of every 8-row global batch; process 0
writes the metrics and both write the checkpoint collectively through Orbax.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxformer.checkpoint import load_checkpoint_params, read_metrics, resolve_checkpoint
from jaxformer.train.throughput import TIMING_KEYS

ROOT = Path(__file__).resolve().parents[1]
WORDS = ("the king and queen of a far land rode out at dawn with their men to the sea where ships "
         "lay waiting under grey skies while old songs rose from the harbour and children ran "
         "along the walls calling names of lost sailors who never came home").split()
STEPS = 4


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _corpus(path: Path, lines: int = 400) -> None:
    r = np.random.default_rng(0)
    path.write_text("\n".join(" ".join(r.choice(WORDS, size=r.integers(6, 20)))
                              for _ in range(lines)) + "\n")


MESH = ["--config.mesh.data=2", "--config.mesh.fsdp=2", "--config.mesh.tensor=2"]


def _start(workdir: Path, corpus: Path, num_processes: int = 2, parallel: list[str] = MESH,
           steps: int = STEPS, extra: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    port = _free_port()
    args = [sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/gpt_pretrain_tiny.py"),
            "--workdir", str(workdir), f"--config.data.source=files:{corpus}",
            "--config.data.tokenizer.vocab_size=320",
            "--config.data.seq_len=32", "--config.data.batch_size=8",
            "--config.model.vocab_size=320", "--config.model.d_model=32", "--config.model.d_ff=64",
            "--config.model.num_layers=1", "--config.model.max_len=32",
            *parallel, f"--config.num_train_steps={steps}", "--config.checkpoint.every_steps=2",
            f"--config.eval.every_steps={STEPS}", "--config.eval.num_batches=1",
            "--config.log_every_steps=1", "--config.progress_bar=False",
            "--config.optimizer.warmup_steps=1", *extra]
    procs = []
    for pid in range(num_processes):
        env = dict(os.environ, JAX_PLATFORMS="cpu", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                   JAXFORMER_HEARTBEAT_TIMEOUT="5",
                   JAX_NUM_PROCESSES=str(num_processes), JAX_PROCESS_ID=str(pid),
                   XLA_FLAGS="--xla_force_host_platform_device_count=4 "
                             "--xla_backend_optimization_level=0")
        procs.append(subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def _wait(procs: list[subprocess.Popen], timeout: float = 240) -> list[subprocess.CompletedProcess]:
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return results


def _launch(workdir: Path, corpus: Path, **kwargs) -> list[subprocess.CompletedProcess]:
    return _wait(_start(workdir, corpus, **kwargs))


@pytest.fixture(scope="module")
def jit_run(tmp_path_factory):
    """One two-process run on the data=2×fsdp=2×tensor=2 mesh: (corpus, workdir, the processes'
    results, its metrics rows as written then), shared by the tests below."""
    tmp = tmp_path_factory.mktemp("multiprocess")
    corpus = tmp / "corpus.txt"
    _corpus(corpus)
    workdir = tmp / "jit"
    results = _launch(workdir, corpus)
    for r in results:
        assert r.returncode == 0, r.stderr[-4000:]
    return corpus, workdir, results, read_metrics(workdir)


def test_two_processes_train_and_checkpoint(jit_run):
    corpus, workdir, results, _ = jit_run
    # Every process ends with the same (global) metrics dict.
    finals = [r.stdout.strip().splitlines()[-1] for r in results]
    assert finals[0] == finals[1], finals
    rows = read_metrics(workdir)  # written by process 0 only: one row per step
    steps = [row["step"] for row in rows]
    assert steps == list(range(1, STEPS + 1)), steps
    assert all(np.isfinite(row["loss"]) for row in rows)
    assert "eval_loss" in rows[-1] and np.isfinite(rows[-1]["eval_loss"])
    assert rows[-1]["tokens"] > 0
    ckpt_dir, step = resolve_checkpoint(workdir)
    assert step == STEPS and sorted(int(p.name) for p in ckpt_dir.iterdir()
                                    if p.name.isdigit()) == [2, 4]
    # Both processes saved their data-iterator state next to the collectively written arrays.
    data_files = {p.name for p in (ckpt_dir / str(STEPS) / "data").iterdir()}
    assert {"process_0-of-2.json", "process_1-of-2.json"} <= data_files, data_files
    params = load_checkpoint_params(workdir)  # read back in this (single) process
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(params))
    assert json.loads((workdir / "config.json").read_text())["mesh"] == {
        "data": 2, "fsdp": 2, "expert": 1, "context": 1, "tensor": 2, "dcn_data": 1,
        "dcn_fsdp": 1}  # one slice
    # The manifest (process 0) covers both processes' files.
    # (Both resume from it: the reruns of the killed and the preempted runs below resume both
    # processes from their latest verified step and continue bit for bit.)
    files = json.loads((ckpt_dir / str(STEPS) / "jaxformer_manifest.json").read_text())["files"]
    assert {"data/process_0-of-2.json", "data/process_1-of-2.json"} <= set(files)


@pytest.mark.slow
def test_two_process_data_parallel_trains_one_model(jit_run, tmp_path):
    """pmap and shard_map over the devices of both processes: gradients are summed globally, so
    both processes report the same metrics, which equal the sharded jit run's (the same update).
    pmap over each process's local devices only trained a different model per process; shard_map
    runs over the global ``data=8`` mesh, fed by both processes as on the jit path."""
    corpus, _, jit_results, jit_rows = jit_run
    runs = {"jit": jit_rows}
    finals = [r.stdout.strip().splitlines()[-1] for r in jit_results]
    assert finals[0] == finals[1], ("jit", finals)
    for name in ("pmap", "shard_map"):
        results = _launch(tmp_path / name, corpus, parallel=[f"--config.parallel={name}"])
        for r in results:
            assert r.returncode == 0, r.stderr[-4000:]
        finals = [r.stdout.strip().splitlines()[-1] for r in results]
        assert finals[0] == finals[1], (name, finals)
        runs[name] = read_metrics(tmp_path / name)
    for name in ("pmap", "shard_map"):
        assert len(runs[name]) == len(runs["jit"]) == STEPS
        for a, b in zip(runs["jit"], runs[name]):
            assert a["step"] == b["step"] and a["tokens"] == b["tokens"], name
            np.testing.assert_allclose(b["loss"], a["loss"], rtol=1e-5, err_msg=name)
            np.testing.assert_allclose(b["grad_norm"], a["grad_norm"], rtol=1e-4, err_msg=name)


LONG = 40  # steps of the runs that one process's death or preemption interrupts


def _rows(workdir: Path) -> list[dict]:
    """The metrics rows of a run, but their wall-clock figures (rates, step time, MFU)."""
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in read_metrics(workdir)]


@pytest.fixture(scope="module")
def straight(jit_run, tmp_path_factory) -> Path:
    """An uninterrupted two-process run of `LONG` steps: what the interrupted ones must equal."""
    workdir = tmp_path_factory.mktemp("straight") / "run"
    for r in _launch(workdir, jit_run[0], steps=LONG):
        assert r.returncode == 0, r.stderr[-4000:]
    return workdir


def _signal_mid_training(workdir: Path, corpus: Path, process: int, sig: int
                         ) -> tuple[list[subprocess.CompletedProcess], float]:
    """Start a `LONG`-step run, send ``sig`` to ``process`` once 6 steps are logged; the results
    and the seconds from the signal until process 0 ended."""
    procs = _start(workdir, corpus, steps=LONG)
    deadline = time.time() + 240
    while (len(read_metrics(workdir)) < 6 and time.time() < deadline
           and all(p.poll() is None for p in procs)):
        time.sleep(0.05)
    procs[process].send_signal(sig)
    sent = time.time()
    survivor = procs[0].communicate(timeout=120)  # the other process: not waiting forever
    ended = time.time() - sent
    rest = _wait(procs[1:], timeout=120)
    first = subprocess.CompletedProcess(procs[0].args, procs[0].returncode, *survivor)
    return [first, *rest], ended


@pytest.mark.slow
def test_a_killed_process_stops_the_other_in_one_line_and_a_rerun_resumes_bitwise(
        jit_run, straight, tmp_path):
    corpus, workdir = jit_run[0], tmp_path / "killed"
    (survivor, killed), seconds = _signal_mid_training(workdir, corpus, 1, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    assert survivor.returncode == 1 and "Traceback" not in survivor.stderr, survivor.stderr[-3000:]
    last = survivor.stderr.strip().splitlines()[-1]
    assert last.startswith("train.py: error: process 0: process 1 of 2 is gone (no heartbeat for "
                           "5 s: killed, crashed or preempted)"), last
    assert seconds < 60, seconds  # JAXFORMER_HEARTBEAT_TIMEOUT=5, and one look per second
    assert len(read_metrics(workdir)) < LONG
    for r in _launch(workdir, corpus, steps=LONG):
        assert r.returncode == 0, r.stderr[-4000:]
    assert _rows(workdir) == _rows(straight)


@pytest.mark.slow
def test_a_sigterm_to_one_process_checkpoints_one_step_of_both(jit_run, straight, tmp_path):
    """A preemption notice on one host of a pod: JAX's preemption sync point has every process
    save the same step and stop (143); the rerun resumes there bit for bit."""
    from jaxformer.checkpoint.verify import verify_step

    corpus, workdir = jit_run[0], tmp_path / "preempted"
    results, _ = _signal_mid_training(workdir, corpus, 1, signal.SIGTERM)
    assert [r.returncode for r in results] == [143, 143], [r.stderr[-2000:] for r in results]
    said = {line for r in results for line in r.stdout.splitlines() if line.startswith("Preempted")}
    assert len(said) == 1, said  # the same step in both processes
    step = int(said.pop().split(" at step ")[1].split(":")[0])
    ckpt_dir, latest = resolve_checkpoint(workdir)
    assert latest == step < LONG
    verify_step(ckpt_dir / str(step), ("state", "data"))
    assert {"process_0-of-2.json", "process_1-of-2.json"} <= {
        p.name for p in (ckpt_dir / str(step) / "data").iterdir()}
    for r in _launch(workdir, corpus, steps=LONG):
        assert r.returncode == 0 and f"checkpoints/{step}" in r.stdout, r.stderr[-4000:]
    assert _rows(workdir) == _rows(straight)


@pytest.mark.slow
def test_plan_cli_compiles_on_simulated_devices(tmp_path):
    """One CPU device here, a plan for fsdp=8: the step is compiled in a child process on 8
    simulated devices, and XLA's per-device argument bytes equal the planner's sharding math."""
    out = tmp_path / "plan.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_backend_optimization_level=0")
    proc = subprocess.run(
        [sys.executable, "-m", "jaxformer.cli.plan", "--config", str(ROOT / "configs/gpt_pretrain_tiny.py"),
         "--config.mesh.fsdp=8", "--config.model.num_layers=1", "--config.data.seq_len=64",
         f"--json={out}"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "per device" in proc.stdout
    r = json.loads(out.read_text())
    c = r["compiled"]
    assert r["devices"] == 8 and r["mesh"] == {"data": 1, "fsdp": 8, "expert": 1, "context": 1, "tensor": 1}
    assert c["simulated"] and c["platform"] == "cpu"
    state = r["params_bytes"]["per_device"] + r["opt_state_bytes"]["per_device"] + 4 + 8  # + step, rng
    batch = 3 * r["batch"] * r["seq_len"] * 4 // 8  # inputs, segment ids, positions; 1/8 each
    assert c["alias_size"] == state  # the donated state is updated in place
    assert c["argument_size"] == state + batch
    assert c["temp_size"] > 0 and c["xla_flops_per_device"] > r["model_flops_per_step"] / 8 / 2
