"""Command line: memory and compute plan of a config or a preset — nothing is allocated.

    python -m jaxformer.cli.plan --config configs/gpt_pretrain_tiny.py --config.mesh.fsdp=8
    python -m jaxformer.cli.plan --preset gpt2_small --batch 8 --seq_len 1024 --mesh fsdp=8
    python -m jaxformer.cli.plan ... --json plan.json --nocompile
    python -m jaxformer.cli.plan --preset gpt2_small --topology v5e:2x2 --mesh fsdp=4

Prints a table and the report as one JSON line (``--json PATH`` also writes it). What the report
holds, and how ``--devices`` and ``--nocompile`` decide where the step is compiled:
`jaxformer.plan` (the library side). ``python -m jaxformer.cli.compile`` reports more of a
topology's compiled program (collectives, roofline).
"""

from __future__ import annotations

import json
import os
import sys

import ml_collections
from absl import app, flags, logging

from jaxformer.cli import exit_with_error, run_absl
from jaxformer.compilation_cache import disable_compilation_cache
from jaxformer.parallel.mesh import make_mesh, mesh_shape
from jaxformer.parallel.topology import parse_topology
from jaxformer.plan import CHILD_FLAG, compile_step, plan, preset_config
from jaxformer.train.config import define_config_flag


def _gb(x: float) -> str:
    return f"{x / 2**30:,.3f} GiB" if x >= 2**27 else f"{x / 2**20:,.2f} MiB"


def format_table(r: dict) -> str:
    """The human-readable view of a `plan` report."""
    mesh = " ".join(f"{a}={s}" for a, s in r["mesh"].items())
    lens = f"{r['seq_len']}" + (f" → {r['target_len']}" if r["target_len"] else "")
    rows = [f"plan: {r['name']} ({r['family']}), batch {r['batch']} × {lens}, mesh {mesh} "
            f"({r['devices']} device{'s' if r['devices'] != 1 else ''}), params "
            f"{r['param_dtype']}, compute {r['dtype']}, attention {r['attention']}",
            f"  parameters            {r['parameters']:>18,}",
            f"  model FLOPs / step    {r['model_flops_per_step']:>18.4e}   (dense "
            f"{r['dense_flops_per_step']:.3e} + attention {r['attention_flops_per_step']:.3e})",
            f"  model FLOPs / token   {r['flops_per_token']:>18.4e}   "
            f"({r['tokens_per_step']:,} tokens / step)",
            f"  {'':20}  {'total':>18}  {'per device':>14}"]
    for label, key in (("parameters", "params_bytes"), ("optimizer state", "opt_state_bytes"),
                       ("frozen parameters", "frozen_bytes")):  # LoRA's base, DPO's reference
        if key not in r:
            continue
        rows.append(f"  {label:20}  {_gb(r[key]['total']):>18}  {_gb(r[key]['per_device']):>14}")
    c = r.get("compiled")
    if c:
        kind = "simulated " if c["simulated"] else "compile-only " if "compile_s" in c else ""
        rows += [f"  XLA, step compiled for {r['devices']} {kind}{c['platform']} devices, per device:",
                 f"    state + batch (arguments)     {_gb(c['argument_size']):>14}",
                 f"    activations + temporaries     {_gb(c['temp_size']):>14}",
                 f"    outputs not aliased to inputs {_gb(c['output_size'] - c['alias_size']):>14}",
                 f"    peak estimate (sum of above)  {_gb(c['peak_estimate']):>14}"]
        flops = c["xla_flops_per_device"]  # 0: not reported (GPU compile-only programs)
        rows.append(f"    compiled FLOPs / step         {f'{flops:.4e}' if flops else 'n/a':>14}   "
                    f"(model FLOPs / devices: {r['model_flops_per_step'] / r['devices']:.4e})")
    return "\n".join(rows)


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)  # not JAX's "Unable to initialize backend 'tpu'"
    f = flags.FLAGS
    if (f.config is None) == (not f.preset):
        raise app.UsageError("give either --config configs/<name>.py or --preset <name>")
    if f[CHILD_FLAG[2:]].value:
        config = config_from_flags(f)
        sizes = mesh_shape(dict(config.mesh), f.devices)
        print(json.dumps(compile_step(config, make_mesh(sizes))))
        return
    if f.topology:
        disable_compilation_cache()  # topology programs cannot be loaded back from it
    try:
        config = config_from_flags(f)
        topology = parse_topology(f.topology, f.num_slices) if f.topology else None
        report = plan(config, devices=f.devices, compile=f.compile, argv=sys.argv[1:],
                      topology=topology)
    except (ValueError, KeyError) as e:  # a bad preset, mesh, size: the message says which
        exit_with_error("python -m jaxformer.cli.plan", e.args[0] if e.args else e)
    emit(format_table(report), report, f.json)


def emit(table: str, report: dict, json_path: str = "") -> None:
    """Print the table, then the report as one JSON line (also written to ``json_path``)."""
    print(table)
    text = json.dumps(report)
    print(text)
    if json_path:
        with open(json_path, "w") as fh:
            fh.write(text + "\n")


# The sizes only ``--preset`` takes, and the config fields that set them with ``--config``.
PRESET_SIZES = {"batch": "data.batch_size=8", "seq_len": "data.seq_len=1024",
                "target_len": "data.target_len=128", "mesh": "mesh.fsdp=8"}


def config_from_flags(f) -> ml_collections.ConfigDict:
    """The config of ``--config`` (overrides applied) or of ``--preset`` and its sizes. With
    ``--config``, a size flag of ``--preset`` is refused (ValueError), not silently ignored."""
    if f.preset:
        return preset_config(f.preset, batch=f.batch, seq_len=f.seq_len,
                             target_len=f.target_len or None, mesh=f.mesh)
    given = [name for name in PRESET_SIZES if f[name].present]
    if given:
        raise ValueError(
            f"--{given[0]} sizes a --preset; with --config set the config's own field instead, "
            f"e.g. --config.{PRESET_SIZES[given[0]]}")
    return f.config


def define_flags() -> None:
    """The flags of this command (also `jaxformer.cli.compile`'s)."""
    define_config_flag("config")
    flags.declare_key_flag("config")  # listed by --help (it is defined in jaxformer.train.config)
    flags.DEFINE_string("preset", "", "Plan a model preset (jaxformer.models.presets) instead.")
    flags.DEFINE_integer("batch", 8, "--preset: global batch size.")
    flags.DEFINE_integer("seq_len", 1024, "--preset: tokens per row (encoder side).")
    flags.DEFINE_integer("target_len", 0, "--preset: decoder tokens (encoder-decoder; 0 = seq_len).")
    flags.DEFINE_string("mesh", "", "--preset: mesh sizes, e.g. 'fsdp=8' or 'data=2,tensor=4'.")
    flags.DEFINE_integer("devices", 0, "Devices to plan for (0: see the module docstring).")
    flags.DEFINE_bool("compile", True, "Compile the step for XLA's activation/temp bytes.")
    flags.DEFINE_string("json", "", "Also write the JSON report to this path.")
    flags.DEFINE_string("topology", "", "Plan for a TPU slice or GPU hosts, compiled by their own "
                        "compiler on compile-only devices: v5e:2x2, v5p:4x4x4, v6e:16x16, "
                        "v4:2x2x1, h100:8, h200:8, h100:2x8 (jaxformer.parallel.topology; needs "
                        "the [tpu] or [cuda-aot] extra).")
    flags.DEFINE_integer("num_slices", 1, "With --topology: slices of it (TPUs).")
    flags.DEFINE_bool(CHILD_FLAG[2:], False, "Internal: compile on simulated devices, print JSON.")


def run() -> None:
    """The console script (`[project.scripts]`): defines the flags, then absl runs `main` (`run_absl`)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # planning allocates nothing
    define_flags()
    run_absl(main, __name__)


if __name__ == "__main__":
    run()
