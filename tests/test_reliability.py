"""Fault injection on a tiny GPT run (issues 25, 44): damaged checkpoints fall back to the newest
intact one, two writers on one workdir, refusals that leave the workdir byte-identical (``.lock``
included), the nonfinite policy, metrics.jsonl and TensorBoard across crashes, the checkpoint limit,
a full disk during a background save, the checkpoint listing, and one-line errors.

The base run trains 4 steps and checkpoints steps 2 and 4; each test damages a copy of it.
``JAXFORMER_LONG_TESTS=1`` also runs a SIGKILL loop over random moments (minutes).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import hashlib
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest

from jaxformer.checkpoint import SaveFailed, load_checkpoint_params, read_metrics
from jaxformer.checkpoint.lock import WorkdirBusy
from jaxformer.train.config import load_config
from jaxformer.train.loop import Trainer
from jaxformer.train.metrics import MetricWriter, read_events
from jaxformer.train.throughput import TIMING_KEYS

ROOT = Path(__file__).resolve().parents[1]
TINY = {"model.vocab_size": 384, "model.d_model": 16, "model.num_heads": 2, "model.d_ff": 32,
        "model.num_layers": 1, "model.max_len": 32, "data.tokenizer.vocab_size": 384,
        "data.tokenizer.max_train_texts": 500, "data.seq_len": 16, "data.batch_size": 8,
        "checkpoint.every_steps": 2, "checkpoint.async_save": False, "eval.num_batches": 0,
        "log_every_steps": 1, "progress_bar": False, "optimizer.warmup_steps": 2}


def config(num_train_steps: int = 4, **overrides):
    """configs/gpt_pretrain_tiny.py at the sizes of the legacy fixture (a 8,912-parameter GPT)."""
    return load_config(ROOT / "configs" / "gpt_pretrain_tiny.py",
                       {**TINY, "num_train_steps": num_train_steps, **overrides})


def flags(num_train_steps: int, **overrides) -> list[str]:
    return [f"--config.{k}={v}" for k, v in
            {**TINY, "num_train_steps": num_train_steps, **overrides}.items()]


def release(trainer: Trainer) -> None:
    """What `Trainer.run` does at its end, for a trainer the test does not run."""
    trainer.lock.release()


def digest(workdir: Path) -> dict[str, str]:
    """Every file of a workdir, ``.lock`` included, by content (the tree hash)."""
    return {str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(workdir.rglob("*")) if p.is_file()}


def steps(workdir: Path) -> list[int]:
    return sorted(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("base") / "run"
    Trainer(config(), wd).run()
    assert steps(wd) == [2, 4]
    return wd


@pytest.fixture
def run(base, tmp_path) -> Path:
    shutil.copytree(base, tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    return tmp_path / "run"


def largest_state_file(step_dir: Path) -> Path:
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file() and "d" in p.parts),
               key=lambda p: p.stat().st_size)


def flip(path: Path, n: int = 3) -> None:
    b = bytearray(path.read_bytes())
    for i in range(n):
        b[len(b) // 2 + 97 * i] ^= 0xFF
    path.write_bytes(bytes(b))


DAMAGE = {  # what to do to checkpoints/4 → the file the one-line report names
    "truncated": (lambda s: largest_state_file(s).write_bytes(
        largest_state_file(s).read_bytes()[:100]), "the save wrote"),
    "random_bytes": (lambda s: largest_state_file(s).write_bytes(
        os.urandom(largest_state_file(s).stat().st_size)), "does not match its sha256"),
    "flipped_bytes": (lambda s: flip(largest_state_file(s)), "does not match its sha256"),
    "state_deleted": (lambda s: shutil.rmtree(s / "state"), "state/ (the train state) is missing"),
    "metadata_deleted": (lambda s: (s / "state" / "_METADATA").unlink(),
                         "state/_METADATA is missing"),
    "data_deleted": (lambda s: shutil.rmtree(s / "data"),
                     "data/ (the data iterator state) is missing"),
    "garbage_iterator_json": (lambda s: (s / "data" / "process_0-of-1.json").write_text("{garbage"),
                              "data/process_0-of-1.json"),
    "manifest_deleted": (lambda s: (s / "jaxformer_manifest.json").unlink(),
                         "jaxformer_manifest.json is missing"),
}


# 1. Verified checkpoints with fallback ------------------------------------------------------------

@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_latest_checkpoint_is_reported_and_the_run_falls_back(run, damage, capsys):
    make, named = DAMAGE[damage]
    make(run / "checkpoints" / "4")
    before = digest(run / "checkpoints" / "4")
    trainer = Trainer(config(6), run)
    assert trainer.start_step == 2
    lines = [x for x in capsys.readouterr().out.splitlines() if "damaged checkpoint" in x]
    assert len(lines) == 1 and "checkpoint 4" in lines[0] and named in lines[0], lines
    assert digest(run / "checkpoints" / "4.damaged") == before  # kept as it was, never read
    if damage == "data_deleted":  # the run continues from step 2 and writes step 4 anew
        trainer.run()
        assert steps(run) == [2, 4, 6] and (run / "checkpoints" / "4" / "data").is_dir()
        assert digest(run / "checkpoints" / "4.damaged") == before  # Orbax's clean-up spares it
    else:
        release(trainer)


def test_an_intact_checkpoint_resumes_as_saved(base, run):
    trainer = Trainer(config(6), run)
    assert trainer.start_step == 4
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(trainer.state.params),
                 load_checkpoint_params(base))
    release(trainer)


def test_no_intact_checkpoint_is_one_error_and_leaves_the_workdir_intact(run):
    flip(largest_state_file(run / "checkpoints" / "4"))
    (run / "checkpoints" / "2" / "jaxformer_manifest.json").write_text("")
    before = digest(run)
    with pytest.raises(ValueError, match=r"no intact checkpoint in .*checkpoints: 4: state/.* does "
                                         r"not match its sha256.*; 2: jaxformer_manifest.json is "
                                         r"unreadable") as e:
        Trainer(config(6), run)
    assert "\n" not in str(e.value) and digest(run) == before


def test_init_from_generate_and_convert_refuse_a_damaged_checkpoint_in_one_line(run, tmp_path,
                                                                               capsys):
    from jaxformer.checkpoint.verify import CheckpointDamaged
    from jaxformer.cli.convert import main as convert
    from jaxformer.cli.generate import main as generate

    flip(largest_state_file(run / "checkpoints" / "4"))
    with pytest.raises(CheckpointDamaged, match=r"checkpoints/4 is damaged: state/.*sha256.*read an "
                                                r"intact older step instead \(.*checkpoints/2\)"):
        Trainer(config(4, init_from=str(run)), tmp_path / "ft")
    assert generate(["--workdir", str(run), "--prompt", "to be"]) == 2
    assert convert(["--from", str(run), "--to-hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("checkpoints/4 is damaged: state/" in x for x in err), err
    assert not (tmp_path / "hf").exists()
    load_checkpoint_params(run / "checkpoints" / "2")  # an intact older step is still readable


def test_a_missing_tokenizer_is_a_failed_resume_not_a_new_tokenizer(run):
    (run / "tokenizer.model").unlink()
    before = digest(run)
    with pytest.raises(ValueError, match=r"tokenizer.model is missing, but the run's checkpoints "
                                         r"were written with it"):
        Trainer(config(6), run)
    assert digest(run) == before and not (run / "tokenizer.model").exists()


def test_an_empty_config_json_resumes_from_the_checkpoint_copy(run):
    (run / "config.json").write_text("")
    trainer = Trainer(config(6), run)
    assert trainer.start_step == 4 and (run / "config.json").stat().st_size > 0
    release(trainer)


# 2. One writer per workdir ------------------------------------------------------------------------

def test_a_second_writer_exits_at_once_naming_the_holder(run):
    holder = Trainer(config(6), run)
    with pytest.raises(WorkdirBusy, match=rf"in use by another run \(PID {os.getpid()},"):
        Trainer(config(6), run)
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config",
                           str(ROOT / "configs/gpt_pretrain_tiny.py"), "--workdir", str(run),
                           *flags(6)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert last.startswith("train.py: error: workdir") and f"PID {os.getpid()}" in last, last
    holder.run()  # releases the lock when done
    release(Trainer(config(6), run))


def test_the_lock_of_a_killed_run_is_not_stale(tmp_path):
    """The holder is named by its live PID (the kernel's lock table), not by the stale PID in
    ``.lock``: a run holds the lock before it writes its PID, after its checks."""
    (tmp_path / ".lock").write_text("999999\n")  # a run long gone
    code = ("import sys, time; from jaxformer.checkpoint.lock import WorkdirLock; "
            f"lock = WorkdirLock({str(tmp_path)!r}).acquire(); print('locked', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.stdout.readline().strip() == "locked"
    from jaxformer.checkpoint.lock import WorkdirLock

    with pytest.raises(WorkdirBusy, match=f"PID {proc.pid}"):
        WorkdirLock(tmp_path).acquire()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    WorkdirLock(tmp_path).acquire().release()
    assert (tmp_path / ".lock").read_text() == "999999\n"  # neither run claimed the workdir


# 3. Refusals before any write ---------------------------------------------------------------------

@pytest.mark.parametrize("change, message", [
    ({"optimizer.clip_norm": 0.0}, r"cannot resume: checkpoint .*/4 holds another train-state "
                                   r"structure: opt_state/1/0/count only in the checkpoint.*"
                                   r"changed: optimizer.clip_norm: 1.0 -> 0.0\. .*init_from="),
    ({"model.d_ff": 64}, r"model.d_ff: 32 -> 64"),
    ({"data.tokenizer.vocab_size": 360}, r"data.tokenizer.vocab_size: 384 -> 360"),
])
def test_refused_resumes_leave_the_workdir_byte_identical(run, change, message):
    (run / ".lock").write_text("999999\n")  # the last holder's PID: not rewritten by a refusal
    before = digest(run)
    with pytest.raises(ValueError, match=message) as e:
        Trainer(config(6, **change), run)
    assert "\n" not in str(e.value)
    assert digest(run) == before


@pytest.mark.parametrize("data, message", [
    ("missing.txt", r"files '.*missing.txt': no file matches it"),
    ("garbage.txt", r"garbage.txt:1 .*not UTF-8"),
])
def test_a_run_refused_for_its_data_leaves_no_workdir(tmp_path, data, message):
    (tmp_path / "garbage.txt").write_bytes(b"\xff\xfe\x00 not text \x80\x81\n" * 50)
    with pytest.raises(ValueError, match=message):
        Trainer(config(4, **{"data.source": f"files:{tmp_path / data}"}), tmp_path / "new" / "wd")
    assert not (tmp_path / "new" / "wd").exists()


def test_a_run_that_fails_before_its_first_step_removes_the_workdir_it_created(tmp_path,
                                                                                monkeypatch):
    import jaxformer.train.loop as loop

    def bad_record(batch, cfg, labels):  # e.g. a token id the model cannot embed
        raise ValueError("batch['inputs'] holds token id 999 >= model.vocab_size=384")

    trainer = Trainer(config(4), tmp_path / "wd")
    assert (tmp_path / "wd" / "config.json").is_file()  # written once the checks had passed
    monkeypatch.setattr(loop, "_check_batch", bad_record)
    with pytest.raises(ValueError, match="token id 999"):
        trainer.run()
    assert not (tmp_path / "wd").exists()
    assert tmp_path.exists()


# 4. The nonfinite policy --------------------------------------------------------------------------

def poisoned(trainer: Trainer, bad_steps: set[int], monkeypatch) -> Trainer:
    """Make the loss (so every gradient) NaN at ``bad_steps``: the host marks those batches, the
    objective multiplies their weights by NaN."""
    import jaxformer.train.loop as loop

    count = iter(range(trainer.start_step + 1, 10**6))
    check = loop._check_batch

    def mark(batch, cfg, labels):
        check(batch, cfg, labels)
        batch["poison"] = np.full(len(batch["inputs"]), next(count) in bad_steps, np.float32)

    prepare = trainer.prepare

    def prepare_poisoned(batch, rng):
        out = prepare({k: v for k, v in batch.items() if k != "poison"}, rng)
        return {**out, "weights": out["weights"] * jnp.where(batch["poison"][0] > 0, jnp.nan, 1.0)}

    monkeypatch.setattr(loop, "_check_batch", mark)
    trainer.prepare = prepare_poisoned
    return trainer


def test_nonfinite_stop_names_the_step_and_the_last_good_checkpoint(tmp_path, monkeypatch):
    trainer = poisoned(Trainer(config(6), tmp_path), {3}, monkeypatch)
    with pytest.raises(FloatingPointError, match=r"training stopped at step 3: non-finite "
                                                 r"loss=nan.*last good checkpoint is step 2") as e:
        trainer.run()
    assert "\n" not in str(e.value)
    assert steps(tmp_path) == [2]
    jax.tree.map(lambda x: np.testing.assert_(np.isfinite(x).all()), load_checkpoint_params(tmp_path))


def test_a_nonfinite_stop_before_any_checkpoint_says_so(tmp_path, monkeypatch):
    trainer = poisoned(Trainer(config(6), tmp_path), {1}, monkeypatch)
    with pytest.raises(FloatingPointError, match=r"training stopped at step 1: non-finite .*; no "
                                                 r"checkpoint was saved yet \(rerunning the command "
                                                 r"starts from scratch\)") as e:
        trainer.run()
    assert "None" not in str(e.value)


def test_nonfinite_skip_leaves_the_update_out_and_counts_it(tmp_path, monkeypatch):
    c = config(4, nonfinite="skip", **{"checkpoint.every_steps": 1, "checkpoint.keep": 5})
    poisoned(Trainer(c, tmp_path), {3}, monkeypatch).run()
    assert steps(tmp_path) == [1, 2, 3, 4]
    ckpt = tmp_path / "checkpoints"
    jax.tree.map(np.testing.assert_array_equal, load_checkpoint_params(ckpt / "3"),
                 load_checkpoint_params(ckpt / "2"))
    rows = {r["step"]: r for r in read_metrics(tmp_path)}
    assert rows[3]["skipped"] == 1.0 and rows[4]["skipped"] == 0.0
    # the row of the skipped step says so (issue 60 §3: it was one row behind, checked only when
    # the next step was pushed, so step 3's row showed no skip)
    assert rows[2].get("skipped_updates") is None
    assert rows[3]["skipped_updates"] == 1 and rows[4]["skipped_updates"] == 1
    assert np.isfinite(rows[4]["loss"]) and rows[4]["loss"] != rows[2]["loss"]


def test_nonfinite_skip_stops_after_the_limit_in_a_row(tmp_path, monkeypatch):
    trainer = poisoned(Trainer(config(8, nonfinite="skip", nonfinite_limit=2), tmp_path),
                       {3, 4, 5}, monkeypatch)
    with pytest.raises(FloatingPointError, match=r"step 4: non-finite .*2 non-finite steps in a "
                                                 r"row \(nonfinite_limit=2\).*checkpoint is step 2"):
        trainer.run()


# 5. metrics.jsonl and the checkpoint limit across crashes -----------------------------------------

def test_metrics_keep_one_row_per_step_across_a_crash(run):
    with (run / "metrics.jsonl").open("a") as f:  # rows a killed run wrote after its checkpoint
        f.write('{"step": 5, "loss": 1.0}\n{"step": 6, "loss": 1.0}\n{"step": 7, "lo')
    killed = MetricWriter(run)  # and its TensorBoard events, in an event file of its own
    for step in (5, 6, 7):
        killed.write(step, {"loss": 1.0})
    killed.close()
    Trainer(config(6), run).run()
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3, 4, 5, 6]
    assert all(r["loss"] != 1.0 for r in read_metrics(run))
    losses = [(step, value) for tag, step, value in read_events(run) if tag == "loss"]
    assert [step for step, _ in losses] == [1, 2, 3, 4, 5, 6]  # no step twice, none after 6
    assert 1.0 not in [value for _, value in losses]
    counts = collections.Counter((tag, step) for tag, step, _ in read_events(run))
    assert max(counts.values()) == 1, counts


KILLED_AFTER_COMMIT = """
import os, signal, sys
from jaxformer.checkpoint.write import Checkpointer
save = Checkpointer.save
def save_then_die(self, step, *args, **kwargs):  # SIGKILL just after step {step}'s commit
    save(self, step, *args, **kwargs)
    self.wait()
    if step == {step}:
        os.kill(os.getpid(), signal.SIGKILL)
Checkpointer.save = save_then_die
from jaxformer.cli.train import run
run()
"""


def test_tensorboard_keeps_every_step_across_a_kill_after_a_commit(tmp_path):
    """Issue 60 §4: a SIGKILL just after step 4's checkpoint commit, then a resume from step 4.
    Read from the event files, every step's scalars are there once — step 4's were lost for good
    when tensorboardX's writer thread still held them at the kill."""
    wd = tmp_path / "run"
    killed = subprocess.run([sys.executable, "-c", KILLED_AFTER_COMMIT.format(step=4), "--config",
                             str(ROOT / "configs" / "gpt_pretrain_tiny.py"), "--workdir", str(wd),
                             *flags(6)], cwd=ROOT, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert steps(wd) == [2, 4]
    Trainer(config(6), wd).run()  # resumes after step 4
    rows = read_metrics(wd)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    events = collections.Counter((tag, step) for tag, step, _ in read_events(wd))
    for r in rows:
        tags = {k for k, v in r.items() if k != "step" and isinstance(v, (int, float))}
        assert {tag: events[(tag, r["step"])] for tag in tags} == dict.fromkeys(tags, 1), r["step"]
    assert sum(events.values()) == sum(1 for r in rows for k, v in r.items()
                                       if k != "step" and isinstance(v, (int, float)))


def test_the_checkpoint_limit_holds_after_kills(run):
    """A kill between a commit and Orbax's clean-up leaves keep + 1 steps, a kill during a save a
    temporary directory (of step 5: a SIGTERM save, say, that the rerun does not repeat); the next
    run removes both."""
    shutil.copytree(run / "checkpoints" / "4", run / "checkpoints" / "5.orbax-checkpoint-tmp")
    trainer = Trainer(config(6, **{"checkpoint.keep": 1}), run)
    assert trainer.start_step == 4
    trainer.run()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["6"]


# 6. A full disk during a background save ---------------------------------------------------------

class _FailedWrite:
    """A commit future whose write failed, as TensorStore's does on a full disk."""

    def __init__(self, error: BaseException):
        self.error = error

    def result(self, timeout=None):
        raise self.error


def full_disk_at(step: int, monkeypatch) -> None:
    """Orbax's array writes of ``step``'s save fail with ENOSPC (in its background thread, where a
    real full disk makes TensorStore's writes fail); other steps are written as usual."""
    serialize = ocp.type_handlers.ArrayHandler.serialize

    async def failing(self, values, infos, args=None):
        futures = await serialize(self, values, infos, args)
        where = str(infos[0].parent_dir)
        if f"{os.sep}{step}.orbax-checkpoint-tmp" in where:
            futures = [*futures, _FailedWrite(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                                                      where))]
        return futures

    monkeypatch.setattr(ocp.type_handlers.ArrayHandler, "serialize", failing)


def test_a_failed_background_save_stops_the_run_and_a_rerun_resumes_bitwise(tmp_path,
                                                                               monkeypatch):
    c = config(8, **{"checkpoint.async_save": True})
    wd = tmp_path / "full"
    full_disk_at(4, monkeypatch)
    with pytest.raises(SaveFailed, match=r"^checkpoint step 4 could not be saved: No space left "
                                         r"on device \(ENOSPC\); a save takes \d+\.\d MB, .* MB "
                                         r"free on the disk of .*; the last good checkpoint is "
                                         r"step 2 \(rerunning the command resumes there\)") as e:
        Trainer(c, wd).run()
    assert "\n" not in str(e.value)
    assert os.listdir(wd / "checkpoints") == ["2"]  # no temporary directory of step 4 left
    assert [r["step"] for r in read_metrics(wd)][-1] <= 6  # stopped before the step-6 save
    monkeypatch.undo()  # space freed
    Trainer(c, wd).run()
    Trainer(c, tmp_path / "straight").run()
    def rows(workdir):  # every metric but the wall-clock ones (rates, step time, MFU)
        return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in read_metrics(workdir)]

    assert rows(wd) == rows(tmp_path / "straight")  # one row per step, the same bits
    jax.tree.map(np.testing.assert_array_equal, load_checkpoint_params(wd),
                 load_checkpoint_params(tmp_path / "straight"))


def test_a_save_that_cannot_fit_is_refused_before_it_starts(tmp_path, monkeypatch):
    """The free space is checked against the previous save's size (the disk reports 1 kB free)."""
    import jaxformer.checkpoint.write as checkpoint

    trainer = Trainer(config(4), tmp_path)
    usage = checkpoint.shutil.disk_usage
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: usage(p)._replace(free=1000))
    with pytest.raises(SaveFailed, match=r"^checkpoint step 4 was not saved: 0.0 MB free on the "
                                         r"disk of .*checkpoints, the previous save took \d+\.\d "
                                         r"MB; the last good checkpoint is step 2"):
        trainer.run()
    assert steps(tmp_path) == [2]


LATE_WRITES = """
import asyncio, gc, sys
import tensorstore as ts
from etils import epath
from orbax.checkpoint._src.path import async_path
from jaxformer.checkpoint.write import Checkpointer

Checkpointer(sys.argv[1]).manager  # installs what quiets a failed save's aftermath
promise, future = ts.Promise.new()  # a TensorStore write still in flight ...
loop = asyncio.new_event_loop()
async def waiter():
    return await future
task = loop.create_task(waiter())
loop.run_until_complete(asyncio.sleep(0.01))
# ... and an Orbax write that failed, its exception never retrieved (as a failed save leaves them)
failed = loop.create_task(async_path.write_text(epath.Path(sys.argv[1]) / "no" / "file", "x"))
loop.run_until_complete(asyncio.wait([failed]))
del failed
loop.close()  # Orbax's background thread ends its event loop
promise.set_result(1)  # TensorStore completes the write: call_soon_threadsafe on a closed loop
gc.collect()  # asyncio: "Task exception was never retrieved"
print("after", file=sys.stderr)
"""


def test_a_failed_background_save_leaves_no_asyncio_tracebacks(tmp_path):
    """Issue 60: a disk full during a background save printed 520-928 lines, 86-154 tracebacks of
    ``RuntimeError: Event loop is closed`` (TensorStore finishing writes after Orbax closed its
    event loop), and asyncio's "exception was never retrieved" for Orbax's failed writes, around
    the one `SaveFailed` line. Both, made here with the real TensorStore and Orbax calls, print
    nothing once a `Checkpointer` exists (``test_train_py_on_a_full_tmpfs``: on a real full disk)."""
    proc = subprocess.run([sys.executable, "-c", LATE_WRITES, str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 0 and proc.stderr.strip().endswith("after"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "never retrieved" not in proc.stderr, proc.stderr


@pytest.mark.skipif(not os.environ.get("JAXFORMER_LONG_TESTS"),
                    reason="opt-in (mounts a tmpfs, ~1 min): set JAXFORMER_LONG_TESTS=1")
def test_train_py_on_a_full_tmpfs(tmp_path):
    """A real full disk (a tmpfs, as root). 200 kB: the first save (~330 kB) fails in Orbax's
    background thread: one line, rc 1. 600 kB: step 2 is saved, step 4 is refused before it starts
    (less free space than step 2 took). 8 MB: the rerun finishes, one metrics row per step."""
    fs = tmp_path / "fs"
    fs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", str(fs)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    cmd = [sys.executable, str(ROOT / "train.py"), "--config",
           str(ROOT / "configs/gpt_pretrain_tiny.py"), "--workdir", str(fs / "wd"),
           *flags(8, **{"checkpoint.async_save": True})]
    try:
        for size, expected in (("200k", "checkpoint step 2 could not be saved: No space left on "
                                        "device (ENOSPC)"),
                               ("600k", "checkpoint step 4 was not saved")):
            subprocess.run(["mount", "-o", f"remount,size={size}", str(fs)], check=True)
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
            errors = [x for x in proc.stderr.splitlines() if "error" in x.lower()]
            assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
            assert len(errors) == 1 and expected in errors[0], errors
            assert not list((fs / "wd" / "checkpoints").glob("*tmp*"))
        subprocess.run(["mount", "-o", "remount,size=8m", str(fs)], check=True)
        assert subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=300).returncode == 0
        assert [r["step"] for r in read_metrics(fs / "wd")] == list(range(1, 9))
    finally:
        subprocess.run(["umount", str(fs)])


@pytest.mark.skipif(not os.environ.get("JAXFORMER_LONG_TESTS"),
                    reason="opt-in (mounts tmpfs, ~3 min): set JAXFORMER_LONG_TESTS=1")
@pytest.mark.parametrize("size,filler", [("8m", False), ("100m", True)])
def test_a_disk_full_in_a_background_save_is_one_line_and_resumable(tmp_path, size, filler):
    """Issue 60's two cases, as found: configs/gpt_pretrain_tiny.py (a 12.9 MB train state) saving
    every 10 steps in the background, on an 8 MB tmpfs (step 10 cannot fit), and on a 100 MB tmpfs
    that a filler file takes when step 30's temporary directory appears. Before: 520-928 lines,
    86-154 tracebacks of ``RuntimeError: Event loop is closed``. Now stderr is the one line, and
    the committed steps are intact (10 and 20 with the filler), no temporary directory left."""
    import threading

    fs = tmp_path / "fs"
    fs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(fs)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    wd = fs / "wd"
    cmd = [sys.executable, str(ROOT / "train.py"), "--config",
           str(ROOT / "configs/gpt_pretrain_tiny.py"), "--workdir", str(wd),
           "--config.num_train_steps=60", "--config.checkpoint.every_steps=10",
           "--config.checkpoint.async_save=True", "--config.checkpoint.keep=10",
           "--config.checkpoint.best_metric=", "--config.eval.every_steps=1000",
           "--config.data.tokenizer.max_train_texts=2000", "--config.optimizer.warmup_steps=5",
           "--config.progress_bar=False"]

    def fill_at_step_30(proc):
        while proc.poll() is None:
            if list((wd / "checkpoints").glob("30.orbax-checkpoint-tmp*")):
                st = os.statvfs(fs)
                with open(fs / "filler", "wb") as f, contextlib.suppress(OSError):
                    f.write(b"\0" * (st.f_bavail * st.f_frsize))
                return
            time.sleep(0.002)

    try:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        if filler:
            threading.Thread(target=fill_at_step_30, args=(proc,), daemon=True).start()
        _, err = proc.communicate(timeout=600)
        step = 30 if filler else 10
        assert proc.returncode == 1 and err.strip().splitlines() == [err.strip()], err[-3000:]
        assert err.startswith(f"train.py: error: checkpoint step {step} could not be saved: No "
                              "space left on device (ENOSPC)"), err
        assert steps(wd) == ([10, 20] if filler else [])
        assert not list((wd / "checkpoints").glob("*tmp*"))
    finally:
        subprocess.run(["umount", str(fs)])


# 7. Listing checkpoints ---------------------------------------------------------------------------

def test_the_checkpoint_listing_verifies_steps_and_removes_damaged_ones(run, capsys):
    from jaxformer.cli.checkpoints import main as checkpoints

    shutil.copytree(run / "checkpoints" / "4", run / "checkpoints" / "4.damaged")
    flip(largest_state_file(run / "checkpoints" / "4.damaged"))
    before = digest(run)
    assert checkpoints(["--workdir", str(run)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert digest(run) == before  # listing writes nothing
    rows = {line.split()[0]: line for line in out[1:]}
    assert set(rows) == {"2", "4", "4.damaged"}, out
    loss = {r["step"]: r["loss"] for r in read_metrics(run)}
    for step in ("2", "4"):
        assert "intact (" in rows[step] and f"loss={loss[int(step)]:.4g}" in rows[step]
    assert "never read" in rows["4.damaged"] and "does not match its sha256" in rows["4.damaged"]
    assert checkpoints(["--workdir", str(run), "--remove-damaged"]) == 0
    assert sorted(os.listdir(run / "checkpoints")) == ["2", "4"]
    assert not (run / ".lock").exists()  # the lock it took left nothing behind


# 8. One-line errors from the command line --------------------------------------------------------

def test_train_py_reports_a_workdir_without_intact_checkpoints_in_one_line(run):
    for step in (2, 4):
        shutil.rmtree(run / "checkpoints" / str(step) / "data")
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config",
                           str(ROOT / "configs/gpt_pretrain_tiny.py"), "--workdir", str(run),
                           *flags(6)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]  # refused
    assert proc.stderr.strip().splitlines()[-1] == (
        f"train.py: error: no intact checkpoint in {run}/checkpoints: 4: data/ (the data iterator "
        "state) is missing; 2: data/ (the data iterator state) is missing. Restore the files from "
        "a copy, or move the checkpoints folder away to train from scratch")


def test_convert_onto_an_existing_file_is_one_line(run, tmp_path, capsys):
    from jaxformer.cli.convert import main as convert

    (tmp_path / "model.bin").write_text("keep me")
    assert convert(["--from", str(run), "--to-hf", str(tmp_path / "model.bin")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"python -m jaxformer.cli.convert: error: --to-hf {tmp_path / 'model.bin'} exists "
                   "and is not a directory; give a new directory (nothing is overwritten)"], err
    assert (tmp_path / "model.bin").read_text() == "keep me"


def test_evaluate_names_the_file_it_cannot_read(run, tmp_path):
    from jaxformer.evaluate_run import evaluate_run

    (tmp_path / "x.bin").write_bytes(os.urandom(64))
    with pytest.raises(ValueError, match=rf"^files '{tmp_path / 'x.bin'}': cannot tell the format"):
        evaluate_run(run, data=f"files:{tmp_path / 'x.bin'}", progress=False)
    with pytest.raises(ValueError, match=rf"^files '{tmp_path / 'none.txt'}': no file matches it$"):
        evaluate_run(run, data=f"files:{tmp_path / 'none.txt'}", progress=False)


def test_a_config_directory_is_named_as_one():
    with pytest.raises(ValueError, match=r"config file '.*configs' is a directory; give one of its "
                                         r"config files"):
        load_config(ROOT / "configs")


# Opt-in: SIGKILL at random moments ---------------------------------------------------------------

@pytest.mark.skipif(not os.environ.get("JAXFORMER_LONG_TESTS"),
                    reason="opt-in long test (15 SIGKILLs, ~3 min): set JAXFORMER_LONG_TESTS=1")
def test_kill9_loop_resumes_bitwise(tmp_path):
    """Kill ``train.py`` (async saves every 3 steps, keep 2) 15 times, rerunning the command each
    time — a third of the kills at random moments of start-up, the others at random moments of
    training — then finish. Losses equal an uninterrupted run's bit for bit, every step
    has one metrics row and one TensorBoard loss, at most ``keep`` checkpoints remain and no
    temporary directory."""
    total, kills = 399, int(os.environ.get("JAXFORMER_KILLS", "15"))
    extra = {"checkpoint.every_steps": 3, "checkpoint.keep": 2, "checkpoint.async_save": True}
    cmd = [sys.executable, str(ROOT / "train.py"), "--config",
           str(ROOT / "configs/gpt_pretrain_tiny.py"), "--workdir", str(tmp_path / "killed"),
           *flags(total, **extra)]
    rng, killed_at, last = random.Random(0), [], lambda: ([0] + [
        r["step"] for r in read_metrics(tmp_path / "killed")])[-1]
    for i in range(kills):
        before = last()
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if i % 3 == 0:  # during start-up: tokenizer, verification, restore, compilation
            time.sleep(rng.uniform(0.5, 6.0))
        else:  # during training (steps, async saves and their manifests, Orbax's clean-up)
            deadline = time.time() + 180
            while last() <= before and proc.poll() is None and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(rng.uniform(0.0, 2.0))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed_at.append(last())
    print(f"last metrics row at each kill: {killed_at}")
    assert subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=600).returncode == 0
    Trainer(config(total, **extra), tmp_path / "straight").run()
    killed = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "killed")}
    straight = {r["step"]: r["loss"] for r in read_metrics(tmp_path / "straight")}
    assert [r["step"] for r in read_metrics(tmp_path / "killed")] == list(range(1, total + 1))
    assert killed == straight
    losses = collections.Counter(step for tag, step, _ in read_events(tmp_path / "killed")
                                 if tag == "loss")  # TensorBoard: every step once (issue 60 §4)
    assert sorted(losses) == list(range(1, total + 1)) and set(losses.values()) == {1}
    left = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert left == [str(total - 3), str(total)], left
