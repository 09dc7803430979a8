"""The house's shape in numbers (issue 61), measured the same way before and after a refactor.

    PYTHONPATH=. python bench/house_metrics.py [--out metrics.json] [--static]

Static (AST and tokens of every ``jaxformer/**/*.py``; seconds):

- ``lines``: physical lines of the library, split into code, docstring, comment and blank lines
  (a docstring is a string expression statement; a line holding code and a comment is code);
- ``option_calls``: calls of a function named ``option`` (``jaxformer.options.option``), by file;
- ``get_calls``: every ``<expr>.get(...)`` call, by file, and the subset ``config_get_calls`` whose
  receiver is a config (the unparsed receiver is rooted at ``config``/``c``/``*_cfg``/``cfg`` or
  passes through a section name of the training config, `SECTIONS`), each with its text, and how
  many of those pass a default;
- ``raw_config_reads``: attribute chains ``<root>.<section>.<key>`` read (not written) where the
  root is ``config``, ``c``, ``self.config`` or ``resolved.config`` and ``<section>`` one of
  `SECTIONS` (``config.data.seq_len``), by file;
- ``raw_run_key_reads``: the same for the top-level keys, ``config.<key>`` (`RUN_KEYS`);
- ``duplicate_module_names``: module file names (``params.py``) found in several packages;
- ``feature_files``: library files naming a cross-cutting feature (case-insensitive): LoRA
  (``lora``), distillation (``distill``), the parallel modes (``pmap`` or ``shard_map``);
- ``stale``: occurrences of "former Linen" and of ``module_api`` in the library.

Dynamic (``--static`` skips them; ~1-2 min of CPU):

- ``imports``: the ``jaxformer`` modules loaded by ``import jaxformer.cli.train`` (a fresh
  interpreter), of all the library's modules;
- ``trace``: ``jaxformer.cli.train.run()`` (what ``train.py`` runs) on configs/gpt_pretrain_tiny.py
  with a tiny model for one step, no evaluation, one synchronous checkpoint, under `sys.setprofile`
  (and `threading.setprofile`) from the call of ``run`` on:

  - ``path``: the files and functions a newcomer opens to follow ``train.py`` → one GPT step →
    checkpoint: the union of the library frames on the call stack whenever an anchor is entered —
    ``forward`` (any function of ``jaxformer/ops/attention*.py``), ``loss`` (``jaxformer/ops/
    losses.py``), ``update`` (``optax.apply_updates``) and ``checkpoint`` (Orbax's
    ``CheckpointManager.save``); ``path_with_data`` adds ``data`` (any ``jaxformer/data/`` function);
  - ``path_step`` (a variant, reported next to ``path``): the same with ``forward`` and ``loss``
    counted only when entered under the train step (a frame of ``jaxformer/train/step.py`` on the
    stack), so a start-up check that calls an attention or loss function does not count;
  - ``executed``: every distinct library function (code object) entered, by file (an upper bound:
    start-up checks, logging and throughput included);
- ``config_walk``: within ``Trainer.__init__``, every library function called with a config object
  among its arguments (an ``ml_collections.ConfigDict``, a typed settings section — a dataclass
  whose fields carry ``setting`` docs, but not the model's own `ModelConfig` — or a dataclass holding
  a ConfigDict, such as ``ResolvedConfig``), linked to its nearest such caller. A reader follows each
  call site once: the walk's edges are the distinct (caller, line, callee) triples, in the order
  first run. Reported: the files visited; ``entries`` (edges into another file, per file);
  ``reentries`` (entries into a file entered before: the reader climbs back to a file already read,
  as the issue's "climbs back up" count; ``options.py`` is entered from every reader of an option);
  ``path_climbs`` (the strict case: entries into a file on the walk's path above the caller).

``--explain`` also prints, per file on the path, the anchor and the shortest library stacks that put
it there (always in the JSON: ``trace.path.explain``); the walk's JSON lists its cross-file call
sites (``edges``: ``caller file:line function -> file:function``).

Prints one JSON object and a short table.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIB = ROOT / "jaxformer"
# Sections of the training config (jaxformer.train.config.schema) and the nested ones.
SECTIONS = ("model", "objective", "data", "optimizer", "checkpoint", "eval", "mesh", "distill",
            "lora", "tokenizer")
CONFIG_ROOTS = re.compile(r"^(self\.)?(config|c|cfg|\w+_cfg|\w+_config|resolved\.config)\b")
RAW_ROOTS = ("config", "c", "self.config", "resolved.config")
# Receivers named like a config that hold no training config: Hugging Face JSON, a jax Mesh.
NOT_CONFIG = re.compile(r"hf_|read_config\(|extra_config|mesh\.shape")
NOT_CONFIG_FILES = ("jaxformer/data/fast_tokenizer.py",)  # reads tokenizer.json / tokenizer_config.json
# The training config's top-level keys (jaxformer.train.config.schema.RunSettings).
RUN_KEYS = ("name", "seed", "dropout_prng", "num_train_steps", "init_from", "init_from_step",
            "init_from_best", "parallel", "module_api", "log_every_steps", "nonfinite",
            "nonfinite_limit", "progress_bar", "profile_steps")
FEATURES = {"lora": r"lora", "distillation": r"distill", "parallel modes": r"pmap|shard_map"}
# A tiny one-step GPT run: the trace's command line (train.py's flags).
TRACE_OVERRIDES = dict(num_train_steps=1, log_every_steps=1, progress_bar=False,
                       **{"eval.num_batches": 0, "checkpoint.every_steps": 1,
                          "checkpoint.async_save": False, "checkpoint.best_metric": "",
                          "model.d_model": 32, "model.num_heads": 2, "model.d_ff": 64,
                          "model.num_layers": 1, "model.max_len": 64, "model.vocab_size": 512,
                          "data.tokenizer.vocab_size": 512, "data.tokenizer.max_train_texts": 1500,
                          "data.seq_len": 32, "data.batch_size": 8})


def library_files() -> list[Path]:
    return sorted(LIB.rglob("*.py"))


def rel(path: str | Path) -> str:
    return str(Path(path).resolve().relative_to(ROOT))


# --------------------------------------------------------------------------------------------------
# Static


def line_kinds(source: str) -> dict[str, int]:
    """Physical lines of ``source`` by kind: code, docstring, comment, blank."""
    lines = source.splitlines()
    doc: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            doc.update(range(node.lineno, node.end_lineno + 1))
    code: set[int] = set()
    comment: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comment.add(tok.start[0])
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER, tokenize.STRING):
            code.update(range(tok.start[0], tok.end[0] + 1))
        elif tok.type == tokenize.STRING and tok.start[0] not in doc:
            code.update(range(tok.start[0], tok.end[0] + 1))
    out = collections.Counter()
    for i, text in enumerate(lines, 1):
        kind = ("docstring" if i in doc else "code" if i in code else "comment" if i in comment
                else "blank" if not text.strip() else "code")
        out[kind] += 1
    out["total"] = len(lines)
    return dict(out)


def _chain(node: ast.AST) -> str | None:
    """``a.b.c`` of an attribute chain rooted at a name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def is_config_receiver(text: str) -> bool:
    if NOT_CONFIG.search(text):
        return False
    return bool(CONFIG_ROOTS.match(text)) or any(
        re.search(rf"(^|\.){s}(\.|$)", text) for s in SECTIONS)


def static_metrics() -> dict:
    lines = collections.Counter()
    option_calls: dict[str, list[int]] = {}
    get_calls: dict[str, int] = collections.Counter()
    config_gets: list[dict] = []
    raw_reads: dict[str, list[str]] = collections.defaultdict(list)
    run_reads: dict[str, list[str]] = collections.defaultdict(list)
    names = collections.defaultdict(list)
    stale = {"former Linen": [], "module_api": []}
    features = {name: [] for name in FEATURES}
    for path in library_files():
        source = path.read_text()
        name = rel(path)
        names[path.name].append(name)
        for feature, pattern in FEATURES.items():
            if re.search(pattern, source, flags=re.I):
                features[feature].append(name)
        lines.update(line_kinds(source))
        for i, text in enumerate(source.splitlines(), 1):
            for needle in stale:
                if needle in text:
                    stale[needle].append(f"{name}:{i}")
        tree = ast.parse(source)
        # attribute chains that are themselves the value of a longer chain are not reads of it
        inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                if (isinstance(f, ast.Name) and f.id == "option") or (
                        isinstance(f, ast.Attribute) and f.attr == "option"):
                    option_calls.setdefault(name, []).append(node.lineno)
                if isinstance(f, ast.Attribute) and f.attr == "get":
                    get_calls[name] += 1
                    receiver = ast.unparse(f.value)
                    if is_config_receiver(receiver) and name not in NOT_CONFIG_FILES:
                        config_gets.append({"at": f"{name}:{node.lineno}",
                                            "call": ast.unparse(node)[:100],
                                            "default": len(node.args) > 1 or bool(node.keywords)})
            if (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                    and id(node) not in inner):
                chain = _chain(node)
                if chain is None:
                    continue
                for root in RAW_ROOTS:
                    rest = chain[len(root) + 1:].split(".") if chain.startswith(root + ".") else []
                    if len(rest) >= 2 and rest[0] in SECTIONS and rest[1] not in ("get", "to_dict",
                                                                                 "unlocked", "lock"):
                        raw_reads[name].append(f"{node.lineno}:{chain}")
                        break
                    if len(rest) == 1 and rest[0] in RUN_KEYS:
                        run_reads[name].append(f"{node.lineno}:{chain}")
                        break
    dup = {k: v for k, v in sorted(names.items()) if len(v) > 1 and k != "__init__.py"}
    by_file = lambda d: dict(sorted(((k, len(v)) for k, v in d.items()), key=lambda kv: -kv[1]))
    return {
        "lines": dict(lines),
        "files": len(library_files()),
        "option_calls": {"total": sum(map(len, option_calls.values())), "by_file": by_file(option_calls),
                         "at": option_calls},
        "get_calls": {"total": sum(get_calls.values()),
                      "by_file": dict(sorted(get_calls.items(), key=lambda kv: -kv[1]))},
        "config_get_calls": {"total": len(config_gets),
                             "with_default": sum(c["default"] for c in config_gets),
                             "by_file": dict(collections.Counter(c["at"].split(":")[0]
                                                                for c in config_gets).most_common()),
                             "at": config_gets},
        "raw_config_reads": {"total": sum(map(len, raw_reads.values())), "by_file": by_file(raw_reads),
                             "at": dict(raw_reads)},
        "raw_run_key_reads": {"total": sum(map(len, run_reads.values())), "by_file": by_file(run_reads),
                              "at": dict(run_reads)},
        "duplicate_module_names": dup,
        "feature_files": {k: {"count": len(v), "files": v} for k, v in features.items()},
        "stale": {k: {"count": len(v), "at": v} for k, v in stale.items()},
    }


# --------------------------------------------------------------------------------------------------
# Dynamic


def import_metrics() -> dict:
    code = ("import sys, jaxformer.cli.train; "
            "print(sum(1 for m in sys.modules if m == 'jaxformer' or m.startswith('jaxformer.')))")
    loaded = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                cwd=ROOT).stdout.split()[-1])
    return {"loaded_by_import_of_train_command": loaded, "library_modules": len(library_files())}


def _is_config(value) -> bool:
    import ml_collections

    from jaxformer.config import ModelConfig
    if isinstance(value, ml_collections.ConfigDict | ml_collections.FrozenConfigDict):
        return True
    if not dataclasses.is_dataclass(value) or isinstance(value, type | ModelConfig):
        return False
    fields = dataclasses.fields(value)
    if any("doc" in f.metadata for f in fields):
        return True
    return any(isinstance(getattr(value, f.name, None), ml_collections.ConfigDict) for f in fields)


class Tracer:
    """`sys.setprofile` hook: library code entered, the newcomer's path and the config walk."""

    def __init__(self, anchors: dict[str, object], anchor_files: dict[str, str]):
        self.lib, self.root_script = str(LIB), str(ROOT / "train.py")
        self.functions: set[tuple[str, str, int]] = set()
        self.anchors = {code: name for name, code in anchors.items()}  # code object → anchor name
        self.anchor_files = anchor_files  # library file → anchor name
        self.path: dict[str, set[tuple[str, str, int]]] = collections.defaultdict(set)
        self.stacks: dict[str, set[tuple]] = collections.defaultdict(set)  # anchor → library stacks
        self.edges: dict[tuple, dict] = {}  # config walk: distinct call sites, first seen first
        self.frames: dict[int, dict] = {}  # id(frame) → walk node, while the frame runs
        self.init_code = None
        self._mine: dict[str, bool] = {}

    def _ours(self, filename: str) -> bool:
        mine = self._mine.get(filename)
        if mine is None:
            mine = self._mine[filename] = filename.startswith(self.lib) or filename == self.root_script
        return mine

    @staticmethod
    def _key(code) -> tuple[str, str, int]:
        return rel(code.co_filename), code.co_qualname, code.co_firstlineno

    def __call__(self, frame, event, arg):
        if event == "return":
            self.frames.pop(id(frame), None)
            return
        if event != "call":
            return
        code = frame.f_code
        anchor = self.anchors.get(code)
        ours = self._ours(code.co_filename)
        if ours:
            self.functions.add(self._key(code))
            anchor = anchor or self.anchor_files.get(rel(code.co_filename))
        if anchor is not None:
            stack, f = [], frame
            while f is not None:
                if self._ours(f.f_code.co_filename):
                    stack.append(self._key(f.f_code))
                f = f.f_back
            self.path[anchor].update(stack)
            self.stacks[anchor].add(tuple(reversed(stack)))  # outermost first
        if ours and self.init_code is not None and self._inside_init(frame):
            self._walk(frame, code)

    def _walk(self, frame, code) -> None:
        n = code.co_argcount + code.co_kwonlyargcount
        args = [frame.f_locals.get(v) for v in code.co_varnames[:n]]
        if code.co_flags & 0x08:  # **kwargs
            args += list((frame.f_locals.get(code.co_varnames[n + bool(code.co_flags & 0x04)])
                          or {}).values())
        if code is not self.init_code and not any(_is_config(a) for a in args):
            return
        caller = self._config_caller(frame)
        parent = None if caller is None else self.frames[id(caller)]
        node = {"file": rel(code.co_filename), "function": code.co_qualname, "parent": parent}
        self.frames[id(frame)] = node
        site = (None if caller is None else (parent["file"], parent["function"], caller.f_lineno))
        key = (site, self._key(code))
        if key not in self.edges:
            above = set()
            p = None if parent is None else parent["parent"]
            while p is not None:  # the files on the walk's path above the caller
                above.add(p["file"])
                p = p["parent"]
            self.edges[key] = {"file": node["file"], "function": node["function"],
                               "caller_file": None if parent is None else parent["file"],
                               "site": None if site is None else f"{site[0]}:{site[2]} {site[1]}",
                               "above": above}

    def _inside_init(self, frame) -> bool:
        while frame is not None:
            if frame.f_code is self.init_code:
                return True
            frame = frame.f_back
        return False

    def _config_caller(self, frame):
        frame = frame.f_back
        while frame is not None:
            if id(frame) in self.frames:
                return frame
            frame = frame.f_back
        return None


def walk_summary(edges: list[dict]) -> dict:
    """The config walk over distinct call sites (as a reader follows them), in first-seen order."""
    entries, seen, reentries, path_climbs = collections.Counter(), set(), 0, 0
    for e in edges:
        if e["caller_file"] == e["file"]:
            continue
        entries[e["file"]] += 1
        reentries += e["file"] in seen
        path_climbs += e["file"] in e["above"] - {e["caller_file"]}
        seen.add(e["file"])
    return {"files": len(entries), "call_sites": len(edges), "entries": sum(entries.values()),
            "reentries": reentries, "path_climbs": path_climbs,
            "entries_by_file": dict(entries.most_common()),
            "functions": sorted({f"{e['file']}:{e['function']}" for e in edges}),
            "edges": [f"{e['site']} -> {e['file']}:{e['function']}" for e in edges
                      if e["caller_file"] != e["file"]]}


def path_summary(path: dict[str, set], names: tuple[str, ...]) -> dict:
    union = set().union(*(path.get(n, set()) for n in names))
    files = collections.Counter(f for f, _, _ in union)
    return {"files": len(files), "functions": len(union), "missing_anchors":
            [n for n in names if not path.get(n)], "functions_by_file": dict(files.most_common())}


def path_explain(stacks: dict[str, set[tuple]], names: tuple[str, ...], per_file: int = 2) -> dict:
    """Why each file is on the path: per path file, the anchor and the shortest library stacks
    (outermost first, ``file:function``) in which one of its functions was running when the anchor
    was entered. A file is there for the reason its stacks show, e.g. a start-up check calling an
    attention function."""
    out: dict[str, list[dict]] = collections.defaultdict(list)
    for name in names:
        for stack in stacks.get(name, ()):
            for f in {f for f, _, _ in stack}:
                out[f].append({"anchor": name, "stack": [f"{g}:{q}" for g, q, _ in stack]})
    return {f: sorted(v, key=lambda e: (len(e["stack"]), e["stack"]))[:per_file]
            for f, v in sorted(out.items())}


STEP_FILE = "jaxformer/train/step.py"


def step_only(stacks: dict[str, set[tuple]]) -> dict[str, set[tuple]]:
    """The anchor stacks with ``forward`` and ``loss`` kept only when entered under the train step (a
    frame of `STEP_FILE` on the stack): start-up checks that call an attention or loss function are
    left out, whatever their files are named."""
    return {name: {s for s in v if name not in ("forward", "loss") or any(f == STEP_FILE for f, _, _ in s)}
            for name, v in stacks.items()}


def trace_metrics() -> dict:
    import optax
    import orbax.checkpoint as ocp

    import jaxformer.cli.train as cli_train
    from jaxformer.train.loop import Trainer

    anchors = {"update": optax.apply_updates.__code__, "checkpoint": ocp.CheckpointManager.save.__code__}
    anchor_files = {**{rel(p): "forward" for p in (LIB / "ops").glob("attention*.py")},
                    "jaxformer/ops/losses.py": "loss",
                    **{rel(p): "data" for p in (LIB / "data").rglob("*.py")}}
    tracer = Tracer(anchors, anchor_files)
    tracer.init_code = Trainer.__init__.__code__
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["train.py", "--config", str(ROOT / "configs" / "gpt_pretrain_tiny.py"),
                "--workdir", f"{tmp}/run", *(f"--config.{k}={v}" for k, v in TRACE_OVERRIDES.items())]
        old_argv, sys.argv = sys.argv, argv
        threading.setprofile(tracer)
        sys.setprofile(tracer)
        try:
            cli_train.run()
        except SystemExit as e:
            if e.code not in (0, None):
                raise
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
            sys.argv = old_argv
        steps = sorted(p.name for p in Path(f"{tmp}/run/checkpoints").iterdir())
    files = collections.Counter(f for f, _, _ in tracer.functions)
    no_data = {f: n for f, n in files.items() if not f.startswith("jaxformer/data/")}
    core = ("forward", "loss", "update", "checkpoint")
    return {
        "command": " ".join(argv[:1] + argv[1:3] + ["--workdir", "<tmp>"] + argv[5:]),
        "checkpoints_written": steps,
        "path": {**path_summary(tracer.path, core), "explain": path_explain(tracer.stacks, core)},
        "path_step": path_summary({k: set().union(*v) for k, v in step_only(tracer.stacks).items()},
                                  core),
        "path_with_data": path_summary(tracer.path, (*core, "data")),
        "executed": {"files": len(files), "functions": sum(files.values()),
                     "files_without_data": len(no_data), "functions_without_data": sum(no_data.values()),
                     "functions_by_file": dict(files.most_common())},
        "config_walk": walk_summary(list(tracer.edges.values())),
    }


def table(m: dict) -> str:
    s = m["static"]
    rows = [("library lines (code / docstring / comment / blank)",
             f"{s['lines']['total']} ({s['lines'].get('code', 0)} / {s['lines'].get('docstring', 0)} / "
             f"{s['lines'].get('comment', 0)} / {s['lines'].get('blank', 0)}) in {s['files']} files"),
            ("option( call sites", s["option_calls"]["total"]),
            (".get( call sites (all / on a config / with a default)",
             f"{s['get_calls']['total']} / {s['config_get_calls']['total']} / "
             f"{s['config_get_calls']['with_default']}"),
            ("raw config.<section>.<key> reads (+ config.<run key>)",
             f"{s['raw_config_reads']['total']} (+ {s['raw_run_key_reads']['total']})"),
            ("module names in several packages", ", ".join(f"{k}×{len(v)}" for k, v in
                                                          s["duplicate_module_names"].items())),
            ("library files naming LoRA / distillation / pmap or shard_map",
             " / ".join(str(v["count"]) for v in s["feature_files"].values())),
            ("'former Linen' / 'module_api' in the library",
             f"{s['stale']['former Linen']['count']} / {s['stale']['module_api']['count']}")]
    if "imports" in m:
        i = m["imports"]
        rows.append(("modules loaded by importing the train command",
                     f"{i['loaded_by_import_of_train_command']} of {i['library_modules']}"))
    if "trace" in m:
        t, w = m["trace"], m["trace"]["config_walk"]
        p, pd, x = t["path"], t["path_with_data"], t["executed"]
        rows += [("train.py → one GPT step → checkpoint, path: files / functions",
                  f"{p['files']} / {p['functions']} (with the data pipeline: {pd['files']} / "
                  f"{pd['functions']})"),
                 ("  variant: forward / loss anchors counted under the train step only",
                  f"{t['path_step']['files']} / {t['path_step']['functions']}"),
                 ("  every library function executed: files / functions",
                  f"{x['files']} / {x['functions']} (without data/: {x['files_without_data']} / "
                  f"{x['functions_without_data']})"),
                 ("config walk from Trainer.__init__: files / entries / re-entries (path climbs)",
                  f"{w['files']} / {w['entries']} / {w['reentries']} ({w['path_climbs']})")]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def explain_text(explain: dict) -> str:
    lines = ["why each file is on the path (anchor: its shortest library stacks, outermost first):"]
    for f, entries in explain.items():
        lines.append(f"{f}")
        lines += [f"  {e['anchor']}: " + " > ".join(e["stack"]) for e in entries]
    return "\n".join(lines)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", help="also write the JSON here")
    p.add_argument("--static", action="store_true", help="skip the import count and the trace")
    p.add_argument("--explain", action="store_true",
                   help="also print, per file on the path, the anchor stacks that put it there")
    args = p.parse_args(argv)
    m = {"static": static_metrics()}
    if not args.static:
        m["imports"] = import_metrics()
        m["trace"] = trace_metrics()
    text = json.dumps(m, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    if args.explain and "trace" in m:
        print(explain_text(m["trace"]["path"]["explain"]))
    print(table(m))
    return m


if __name__ == "__main__":
    main()
