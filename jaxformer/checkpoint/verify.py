"""Verified checkpoints: a manifest of every file's sha256, written inside Orbax's commit.

``<workdir>/checkpoints/<step>/jaxformer_manifest.json``::

    {"format": 1,
     "files": {"state/d/9f2…": [size, sha256], "data/process_0-of-1.json": [size, sha256], …},
     "tokenizer_sha256": "…",          # of <workdir>/tokenizer.model when the step was saved
     "config": {…}}                    # <workdir>/config.json when the step was saved

`write_manifest` runs in Orbax's post-finalization callback, after every file of the step is
written and before Orbax renames the temporary directory to ``<step>``, so a committed step always
has its manifest; ``_CHECKPOINT_METADATA`` (rewritten by Orbax at the commit) and
``commit_success.txt`` are the only files it does not hash. The step's Orbax metadata carries
``custom_metadata = {"jaxformer_manifest": …}``: a step that has that marker but no manifest lost
it. Steps with neither (written before jaxformer verified checkpoints, e.g.
``tests/data/legacy_gpt_jax010``) are read unverified, after a structural check.

`verify_step` reads every listed file back (sha256: 0.78 s/GB measured by
``bench/checkpoint_verify.py``, a quarter of Orbax's restore) and raises `CheckpointDamaged` naming
the step and the first bad file. `structure_mismatch` compares the train state a config builds
with the saved one from Orbax's metadata alone, so a changed optimizer is refused before any read.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from absl import logging
from etils import epath

from jaxformer.data.fetch import sha256_file

MANIFEST = "jaxformer_manifest.json"
MARKER = "jaxformer_manifest"  # key in the step's Orbax custom metadata
_UNHASHED = ("_CHECKPOINT_METADATA", "commit_success.txt", MANIFEST)  # top level of a step
# Files an item needs even without a manifest (legacy steps): Orbax's tree metadata of the state.
_REQUIRED = {"state": ("state/_METADATA",), "data": ()}
WHAT = {"state": "the train state", "data": "the data iterator state"}


class CheckpointDamaged(ValueError):
    """A checkpoint step that must not be read: ``step_dir`` and the ``problem`` (naming a file)."""

    def __init__(self, step_dir: Path, problem: str):
        self.step_dir, self.problem = Path(step_dir), problem
        super().__init__(f"checkpoint {self.step_dir} is damaged: {problem}")


def write_manifest(step_dir: Path, workdir: Path) -> None:
    """Hash every file under ``step_dir`` (plus the workdir's tokenizer and config) into
    ``step_dir/jaxformer_manifest.json``, written atomically (temporary file + rename)."""
    files = {}
    for p in sorted(step_dir.rglob("*")):
        rel = p.relative_to(step_dir).as_posix()
        if p.is_file() and rel not in _UNHASHED:
            files[rel] = [p.stat().st_size, sha256_file(p)]
    doc: dict[str, Any] = {"format": 1, "files": files}
    if (workdir / "tokenizer.model").is_file():
        doc["tokenizer_sha256"] = sha256_file(workdir / "tokenizer.model")
    try:
        doc["config"] = json.loads((workdir / "config.json").read_text())
    except (OSError, ValueError):
        pass  # e.g. a Checkpointer used without a run config (tests, notebooks)
    tmp = step_dir / f"{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_dir / MANIFEST)


def read_manifest(step_dir: Path) -> dict | None:
    """The step's manifest; None for a step written without one (legacy)."""
    path = step_dir / MANIFEST
    if not path.exists():
        if _has_marker(step_dir):
            raise CheckpointDamaged(step_dir, f"{MANIFEST} is missing (the save wrote one)")
        return None
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != 1 or not isinstance(doc.get("files"), dict):
            raise ValueError("not a format-1 manifest")
    except (ValueError, AttributeError) as e:
        raise CheckpointDamaged(step_dir, f"{MANIFEST} is unreadable ({e})") from None
    return doc


def _has_marker(step_dir: Path) -> bool:
    try:
        meta = json.loads((step_dir / "_CHECKPOINT_METADATA").read_text())
        return MARKER in (meta.get("custom_metadata") or {})
    except (OSError, ValueError, AttributeError):
        return False


def verify_step(step_dir: Path, need: Iterable[str] = ("state",)) -> dict | None:
    """Check ``step_dir`` before anything reads it; returns its manifest (None: legacy, unverified).

    Raises `CheckpointDamaged` naming the first file that is missing, has another size or other
    bytes than the save wrote, or an item of ``need`` ("state", "data") the step lacks.
    """
    step_dir = Path(step_dir)
    start, nbytes = time.perf_counter(), 0
    manifest = read_manifest(step_dir)
    listed = manifest["files"] if manifest else {
        p.relative_to(step_dir).as_posix(): None for p in step_dir.rglob("*") if p.is_file()}
    for item in need:
        present = [f for f in listed if f.startswith(f"{item}/") and f != f"{item}/commit_success.txt"]
        missing = [f for f in _REQUIRED[item] if f not in listed]
        if not present or missing:
            what = f"{missing[0]} is missing" if present else f"{item}/ ({WHAT[item]}) is missing"
            raise CheckpointDamaged(step_dir, what)
    if manifest is None:
        _check_legacy_json(step_dir, listed)
        logging.warning("%s has no %s (written before jaxformer verified checkpoints): read "
                        "without checksums", step_dir, MANIFEST)
        return None
    for item in {rel.split("/")[0] for rel in manifest["files"] if "/" in rel}:
        if not (step_dir / item).is_dir():
            raise CheckpointDamaged(step_dir, f"{item}/ ({WHAT.get(item, 'an item')}) is missing")
    for rel, (size, digest) in manifest["files"].items():
        path = step_dir / rel
        if not path.is_file():
            raise CheckpointDamaged(step_dir, f"{rel} is missing")
        if path.stat().st_size != size:
            raise CheckpointDamaged(step_dir, f"{rel} has {path.stat().st_size} bytes, the save "
                                              f"wrote {size} (truncated or overwritten)")
        if sha256_file(path) != digest:
            raise CheckpointDamaged(step_dir, f"{rel} does not match its sha256 (its bytes changed "
                                              "after the save)")
        nbytes += size
    seconds = time.perf_counter() - start
    manifest["verified"] = {"bytes": nbytes, "seconds": seconds}
    return manifest


def _check_legacy_json(step_dir: Path, listed: Iterable[str]) -> None:
    """Without checksums, at least the iterator states must be JSON."""
    for rel in listed:
        if rel.startswith("data/") and rel.endswith(".json"):
            try:
                json.loads((step_dir / rel).read_text())
            except ValueError as e:
                raise CheckpointDamaged(step_dir, f"{rel} is not JSON ({e})") from None


def verify_tokenizer(workdir: Path, manifest: dict | None, *, required: bool) -> Path | None:
    """``<workdir>/tokenizer.model`` checked against the manifest; None when absent and neither the
    manifest nor ``required`` asks for it. Raises ValueError naming the file."""
    path = Path(workdir) / "tokenizer.model"
    digest = (manifest or {}).get("tokenizer_sha256")
    if not path.is_file():
        if digest or required:
            raise ValueError(f"{path} is missing, but the run's checkpoints were written with it "
                             f"(sha256 {digest or 'not recorded'}): put the run's tokenizer.model "
                             "back (another tokenizer would read the embeddings with other ids)")
        return None
    if digest and sha256_file(path) != digest:
        raise ValueError(f"{path} is not the tokenizer the checkpoints were written with (sha256 "
                         f"differs from {digest[:12]}…): put the run's tokenizer.model back")
    return path


def verify_for_reading(ckpt_dir: Path, step: int) -> dict | None:
    """`verify_step` of a step read for fine-tuning or inference (no fallback: the error names an
    older step to read instead); returns its manifest."""
    try:
        return verify_step(ckpt_dir / str(step), ("state",))
    except CheckpointDamaged as e:
        older = [s for s in sorted(int(d.name) for d in ckpt_dir.iterdir() if d.name.isdigit())
                 if s < step]
        hint = (f"read an intact older step instead ({ckpt_dir / str(older[-1])})" if older else
                "restore it from a copy")
        raise CheckpointDamaged(e.step_dir, f"{e.problem}; {hint}") from None


class StateMismatch(ValueError):
    """The train state a config builds does not have the structure of the checkpoint's."""

    def __init__(self, step_dir: Path, differences: list[str]):
        self.step_dir, self.differences = step_dir, differences
        super().__init__(f"checkpoint {step_dir} holds another train-state structure: "
                         f"{'; '.join(differences)}")


def _path_names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path)


def structure_mismatch(abstract_state, step_dir: Path, limit: int = 3) -> list[str]:
    """Up to ``limit`` differences between ``abstract_state`` and the state saved in ``step_dir``
    (leaf paths present in one only, or other shapes), read from Orbax's metadata alone."""
    handler = ocp.PyTreeCheckpointHandler()
    try:
        saved_tree = handler.metadata(epath.Path(step_dir) / "state").tree
    finally:
        handler.close()
    saved = {_path_names(p): tuple(m.shape) for p, m in
             jax.tree_util.tree_flatten_with_path(saved_tree)[0]}
    now = {_path_names(p): tuple(a.shape) for p, a in
           jax.tree_util.tree_flatten_with_path(abstract_state)[0]}
    name = "/".join
    out = [f"{name(p)} only in the checkpoint" for p in sorted(saved.keys() - now.keys())]
    out += [f"{name(p)} only in the new state" for p in sorted(now.keys() - saved.keys())]
    out += [f"{name(p)}: shape {saved[p]} in the checkpoint, {now[p]} now"
            for p in sorted(saved.keys() & now.keys()) if saved[p] != now[p]]
    return out[:limit]
