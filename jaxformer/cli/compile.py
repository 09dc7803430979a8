"""Command line: compile the trainer's real step for an accelerator topology this machine does not
have, and report its memory, collectives and roofline (`jaxformer.compile`, the library side).

    python -m jaxformer.cli.compile --preset gpt2_medium_bf16 --topology v5p:4x4x4 --mesh fsdp=64
    python -m jaxformer.cli.compile --config configs/gpt_pretrain_tiny.py --topology v5e:2x2 \\
        --config.mesh.fsdp=4 --config.model.attention_impl=splash
    python -m jaxformer.cli.compile --preset t5_base_bf16 --topology v5e:2x2 --num_slices 2 \\
        --mesh dcn_data=2,fsdp=4 --json t5.json
    python -m jaxformer.cli.compile --preset gpt2_small_bf16 --topology h100:8 --mesh fsdp=8

The flags are ``python -m jaxformer.cli.plan``'s (config or preset, sizes, mesh, ``--topology``,
``--json``). Prints a table, then the report as one JSON line. A plan that does not fit the chip's
HBM is refused with one line naming the largest part and what to change (exit status 1).
"""

from __future__ import annotations

import os
import sys

import jax
from absl import app, flags, logging

from jaxformer.cli import exit_with_error, run_absl
from jaxformer.cli import plan as plan_cli
from jaxformer.cli.plan import config_from_flags, define_flags, emit
from jaxformer.compilation_cache import disable_compilation_cache
from jaxformer.compile import compile_report, gib, refusal
from jaxformer.parallel.topology import parse_topology


def format_report(r: dict) -> str:
    """The human-readable view of a `jaxformer.compile.compile_report` report."""
    mesh = " ".join(f"{a}={s}" for a, s in r["mesh"].items())
    m, roof = r["memory"], r["roofline"]
    verb = "not compiled (refused by the compiler):" if r.get("refused_by_compiler") else "compiled"
    rows = [f"{verb} {r['name']} ({r['family']}) for {r['topology']}"
            f"{f' × {r['num_slices']} slices' if r['num_slices'] > 1 else ''} ({r['chip']}, "
            f"{r['devices']} chips), mesh {mesh}, batch {r['batch']} × {r['seq_len']}, "
            f"attention {r['attention']}, in {r['compile_s']:.1f} s",
            f"  per chip: arguments {gib(m['argument_size'])}, temporaries {gib(m['temp_size'])}, "
            f"outputs {gib(m['output_size'] - m['alias_size'])}; total {gib(m['peak_estimate'])}"
            f" of {gib(r['hbm_capacity'])} ({m['peak_estimate'] / r['hbm_capacity']:.0%})",
            f"  model FLOPs / step {r['model_flops_per_step']:.4e}"
            f" ({r['model_flops_per_step'] / r['devices']:.4e} per chip)"
            + (f"; XLA per chip: {r['xla']['flops']:.4e} FLOPs" if "flops" in r["xla"] else "")
            + (f", {r['xla']['bytes'] / 2**30:.2f} GiB accessed" if "bytes" in r["xla"] else ""),
            "  collectives (run per step: a loop body's once per iteration; bytes of their results):"]
    if r.get("refused_by_compiler"):  # no program: the planner's state, the compiler's figure
        return "\n".join(rows[:3] + [f"  the compiler refused the program: "
                                     f"{r['refused_by_compiler']}"])
    across = ("slices" if r["num_slices"] > 1 else
              "hosts" if r.get("platform") == "cuda" and r.get("hosts", 1) > 1 else None)
    for kind, c in r["collectives"].items():
        if c["count"]:
            dcn = (f"   (across {across}: {c['dcn_count']}, {c['dcn_bytes'] / 2**20:.2f} MiB)"
                   if across else "")
            rows.append(f"    {kind:20} {c['count']:6d}  {c['bytes'] / 2**20:12.2f} MiB{dcn}")
    if not any(c["count"] for c in r["collectives"].values()):
        rows.append("    none")
    terms = ", ".join(f"{k[:-2]} {v * 1e3:.2f} ms" for k, v in roof.items()
                      if k.endswith("_s") and k != "step_s" and v is not None)
    rows.append(f"  roofline: {terms} → step ≥ {roof['step_s'] * 1e3:.2f} ms ({roof['bound_by']}"
                f"-bound), MFU ≤ {roof['mfu_bound']:.1%}  [peaks: {r['chip_source']}]")
    if roof.get("mfu_bound_hbm_only") is not None:  # XLA's bytes count VMEM too (`hbm_bytes`)
        rows.append(f"  roofline with HBM-only bytes ({r['hbm_traffic']['hbm'] / 2**30:.2f} GiB, "
                    f"not XLA's {r['xla']['bytes'] / 2**30:.2f}): MFU ≤ "
                    f"{roof['mfu_bound_hbm_only']:.1%} ({roof['bound_by_hbm_only']}-bound)")
    return "\n".join(rows)


def main(argv) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)
    f = flags.FLAGS
    if (f.config is None) == (not f.preset):
        raise app.UsageError("give either --config configs/<name>.py or --preset <name>")
    if not f.topology:
        raise app.UsageError("give --topology, e.g. v5e:2x2, v5p:4x4x4, v6e:16x16 or h100:8")
    try:
        report = compile_report(config_from_flags(f), parse_topology(f.topology, f.num_slices))
    except (ValueError, KeyError) as e:
        exit_with_error("python -m jaxformer.cli.compile", e.args[0] if e.args else e)
    emit(format_report(report), report, f.json)
    why = refusal(report)
    if why:
        sys.exit(f"python -m jaxformer.cli.compile: {why}")


def run() -> None:
    """The console script (`[project.scripts]`): defines the flags, then absl runs `main` (`run_absl`)."""
    # Compile-only: this process needs no accelerator of its own (and must not wait for one).
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax.config.update("jax_platforms", os.environ["JAX_PLATFORMS"])  # jax read it on import
    disable_compilation_cache()  # topology programs cannot be loaded back from it
    define_flags()
    flags.adopt_module_key_flags(plan_cli)  # --help lists them as this command's own
    run_absl(main, __name__)


if __name__ == "__main__":
    run()
