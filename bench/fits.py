"""What fits where: for each base/large preset (bfloat16 compute, float32 parameters and AdamW
state) and each TPU chip or GPU, the smallest slice (GPU hosts) whose compiled train step fits the
chip's HBM, with its mesh, HBM per chip and the roofline MFU bound
(`jaxformer.compile.compile_report`: compiled by libtpu, or jax's CUDA plugin for ``h100``, for
compile-only devices; nothing runs).

    python bench/fits.py                                   # every preset × v5e, v5p, v6e, h100
    python bench/fits.py --chips v5p --presets gpt2_medium_bf16,t5_3b_bf16
    python bench/fits.py --fixed v5p:4x8x8                 # every preset on one slice (the target)

Search (`candidates`): slices of each chip in increasing size; the first tried is the smallest whose
chips hold the training state (parameters, gradients and AdamW moments: 16 bytes a float32
parameter, `STATE_BYTES_PER_PARAM`) in at most `STATE_SHARE` of their HBM, leaving the rest for
activations; on a compiled step that does not fit, the same slice with every layer
rematerialised (`REMAT`: a larger slice shrinks the state per chip, not the activations of its
4 rows), then the next larger slice. The mesh is fully
sharded data parallelism over every chip (``fsdp`` = chips); the batch is `ROWS_PER_CHIP`
sequences per chip (global batch = rows × chips) of the preset's length (1,024 for GPT-2, 512 for
BERT and T5, T5's targets 512 too). ``model.scan_layers=True`` (one compiled layer: minutes per
compile, not tens) and no remat.

Caveats: compile-only — HBM is XLA's buffer assignment for that chip, and the MFU is the roofline's
upper bound (`jaxformer.compile.roofline`: model FLOPs at peak vs bytes accessed at HBM bandwidth vs
collective bytes at ICI bandwidth), not a measured MFU. Two byte counts are given: XLA's "bytes
accessed" (every memory space; a prefetch into VMEM charged 4 times its bytes and its reader once
more) and, in brackets, the HBM-only count of the same program (`jaxformer.compile.hbm_bytes`); the
truth lies between them until a TPU measures it. With scanned layers XLA's cost analysis counts the
loop body once, so the HBM term undercounts the layers' bytes (the compute term uses the model-FLOPs
formula and is exact). Results are appended to the JSON file cell by cell, and cells already there
are skipped, so an interrupted run resumes; the markdown table is rewritten from the JSON after each
cell. ``--unrolled gpt2_medium_bf16@v5p:2x2x1`` gives the roofline with every layer's bytes
(`unrolled_roofline`: two small compiles); ``--rooflines v5p`` runs it for every preset on its
smallest fitting v5p slice of the JSON and adds the table's MFU column (``--rerun`` recomputes those
already in the JSON, e.g. after a change to the model or its kernels: ``python bench/fits.py
--rooflines v5p --rerun`` regenerates the column for every preset, with ``--presets
bert_base_bf16,bert_large_bf16`` for some; 2 compiles a preset, 10–40 min each on the shared 2-core
host): v5p's bound from those compiles, v5e's and v6e's from the same bytes and model FLOPs per chip
at their own peak and HBM bandwidth (the cells hold the same 4 sequences per chip; derived, not
compiled: marked ≈), none for GPUs (their compile-only programs report no bytes accessed).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only: this process needs no accelerator

PRESETS = ("gpt2_small_bf16", "gpt2_medium_bf16", "gpt2_large_bf16", "gpt2_xl_bf16",
           "bert_base_bf16", "bert_large_bf16", "t5_base_bf16", "t5_large_bf16", "t5_3b_bf16")
# Cloud TPU slice shapes, smallest first (v5e / v6e: 2-D tori; v5p: 3-D).
SLICES = {"v5e": ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
          "v5p": ("2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8"),
          "v6e": ("2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"),
          "h100": ("8", "2x8", "4x8")}  # GPU hosts of 8 (jax's CUDA plugin: the [cuda-aot] extra)
STATE_BYTES_PER_PARAM = 16  # float32 parameter + gradient + AdamW's two moments
STATE_SHARE = 0.5
REMAT = ("model.remat_policy=full",)  # the second try on a slice (module docstring)
ROWS_PER_CHIP = 4
HERE = os.path.dirname(os.path.abspath(__file__))


def chips_of(shape: str) -> int:
    """Chips of a slice shape such as ``"4x8x8"``."""
    out = 1
    for s in shape.split("x"):
        out *= int(s)
    return out


def candidates(chip: str, parameters: int, hbm_bytes: float) -> list[str]:
    """The slices of ``chip`` to try in order: from the smallest whose chips hold the sharded
    training state in `STATE_SHARE` of their HBM, upwards ([] when even the largest cannot)."""
    need = parameters * STATE_BYTES_PER_PARAM
    shapes = SLICES[chip]
    first = next((i for i, s in enumerate(shapes) if need / chips_of(s) <= STATE_SHARE * hbm_bytes),
                 len(shapes))
    return [f"{chip}:{s}" for s in shapes[first:]]


def cell_config(name: str, chips: int, overrides: tuple[str, ...] = ()):
    """The training config of one table cell: ``name`` on ``chips`` chips (module docstring), with
    ``key=value`` ``overrides`` (``model.attention_impl=splash``) as on the command line."""
    from jaxformer.models.presets import PRESETS as ALL
    from jaxformer.plan import preset_config
    from jaxformer.train.config import set_key

    seq = min(1024, ALL[name]["max_len"])
    c = preset_config(name, batch=ROWS_PER_CHIP * chips, seq_len=seq, mesh=f"fsdp={chips}")
    c.model.scan_layers = True
    for item in overrides:
        key, _, value = item.partition("=")
        try:  # numbers, booleans, None as Python literals; anything else a string
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass
        set_key(c, key, value)
    return c


def compile_cell(name: str, topology: str, overrides: tuple[str, ...] = ()) -> dict:
    """One compile: the row of the table for ``name`` on ``topology`` (with ``overrides``)."""
    from jaxformer.compile import compile_report
    from jaxformer.parallel.topology import parse_topology

    topo = parse_topology(topology)
    t0 = time.perf_counter()
    r = compile_report(cell_config(name, topo.num_chips, overrides), topo)
    m, roof = r["memory"], r["roofline"] or {"mfu_bound": None, "bound_by": "no program"}
    return {"preset": name, "topology": topology, "chips": topo.num_chips, "mesh": r["mesh"],
            "batch": r["batch"], "seq_len": r["seq_len"], "parameters": r["parameters"],
            "fits": bool(r["fits"]), "hbm_gib": m["peak_estimate"] / 2**30,
            "args_gib": m["argument_size"] / 2**30, "temp_gib": m["temp_size"] / 2**30,
            "capacity_gib": r["hbm_capacity"] / 2**30, "mfu_bound": roof["mfu_bound"],
            "bound_by": roof["bound_by"], "roofline": roof, "xla": r["xla"],
            "model_flops_per_chip": r["model_flops_per_step"] / topo.num_chips,
            "collectives": {k: [c["count"], c["bytes"]] for k, c in r["collectives"].items()
                            if c["count"]},
            "compile_s": r["compile_s"], "wall_s": time.perf_counter() - t0,
            "overrides": list(overrides)}


def cell_key(cell: dict) -> tuple:
    """A cell's identity in the JSON: preset, topology and config overrides."""
    return cell["preset"], cell["topology"], tuple(cell.get("overrides", ()))


def smallest_fit(name: str, chip: str, done: dict, save) -> dict | None:
    """Walk `candidates` for ``name`` on ``chip`` until a compiled step fits (cells in ``done``
    are reused; each new one is passed to ``save``); the fitting cell, or None."""
    from jaxformer.parallel.topology import CHIPS

    for topology in candidates(chip, _parameters(name), CHIPS[chip].hbm_bytes):
        for overrides in ((), REMAT):
            cell = (done.get((name, topology, overrides))
                    or save(compile_cell(name, topology, overrides)))
            if cell["fits"]:
                return cell
    return None


def unrolled_roofline(name: str, topology: str, overrides: tuple[str, ...] = ()) -> dict:
    """The roofline of ``name`` unrolled on ``topology`` (its `cell_config`), its HBM term from
    two small unrolled compiles (1 and 2 layers): XLA's bytes accessed are linear in the layers,
    so bytes(L) = bytes(1) + (L - 1)·(bytes(2) − bytes(1)) — the scanned program counts one layer."""
    from jaxformer.compile import compile_report
    from jaxformer.parallel.topology import parse_topology

    topo = parse_topology(topology)
    out = []
    for layers in (1, 2):
        c = cell_config(name, topo.num_chips, overrides)
        c.model.scan_layers, c.model.num_layers = False, layers
        r = compile_report(c, topo)
        if "bytes" not in r["xla"]:
            raise SystemExit(f"--unrolled {name}@{topology}: the {topo.chip.name} compiler reports "
                             "no bytes accessed (GPU compile-only programs have no cost analysis)")
        out.append((r["xla"]["bytes"], r["hbm_traffic"]["hbm"],
                    r["model_flops_per_step"] / topo.num_chips))
    layers = cell_config(name, 1).model.num_layers
    (b1, h1, f1), (b2, h2, f2) = out
    total, flops = b1 + (layers - 1) * (b2 - b1), f1 + (layers - 1) * (f2 - f1)
    hbm_only = h1 + (layers - 1) * (h2 - h1)
    compute_s, hbm_s = flops / topo.chip.bf16_flops, total / topo.chip.hbm_bytes_per_s
    hbm_only_s = hbm_only / topo.chip.hbm_bytes_per_s
    return {"preset": name, "topology": topology, "overrides": list(overrides),
            "model_flops_per_chip": flops, "bytes_per_layer": b2 - b1,
            "bytes_outside_layers": b1 - (b2 - b1), "bytes": total, "compute_s": compute_s,
            "hbm_s": hbm_s, "mfu_bound": compute_s / max(compute_s, hbm_s),
            "hbm_only_bytes_per_layer": h2 - h1, "hbm_only_bytes_outside_layers": h1 - (h2 - h1),
            "hbm_only_bytes": hbm_only, "hbm_only_s": hbm_only_s,
            "mfu_bound_hbm_only": compute_s / max(compute_s, hbm_only_s)}


def _parameters(name: str) -> int:
    """Parameters of preset ``name`` (shapes only; nothing is allocated)."""
    from jaxformer.plan import plan

    return plan(cell_config(name, 1), devices=1, compile=False)["parameters"]


def markdown(cells: list[dict]) -> str:
    """The docs table: one row a preset, one column a chip: the smallest fitting slice, its HBM per
    chip and its collectives' ICI time as a share of the compute time (the roofline's compute and
    ICI terms; the HBM term of a scanned compile counts one layer, see `unrolled_roofline`)."""
    chips = [c for c in SLICES if any(x["topology"].startswith(c) for x in cells)]
    bounds = any("unrolled" in x for x in cells)
    head = ("| preset | params | " + " | ".join(chips) + " |" + (" MFU ≤ (v5e / v5p / v6e) |"
            if bounds else "") + "\n|---|---:|" + "---|" * (len(chips) + bounds))
    rows = []
    for name in dict.fromkeys(x["preset"] for x in cells):
        mine = [x for x in cells if x["preset"] == name]
        out = []
        for chip in chips:
            fit = [x for x in mine if x["topology"].startswith(chip) and x["fits"]]
            if fit:
                x = min(fit, key=lambda x: x["chips"])
                roof = x["roofline"] if "roofline" in x else {}
                ici = (f", ICI {roof['ici_s'] / roof['compute_s']:.0%} of compute"
                       if roof.get("compute_s") else "")
                remat = ", remat full" if x.get("overrides") else ""
                out.append(f"{x['topology']} fsdp={x['chips']}{remat}, {x['hbm_gib']:.1f} GiB{ici}")
            else:
                tried = [x["topology"] for x in mine if x["topology"].startswith(chip)]
                out.append(f"not fit on {', '.join(tried)}" if tried else "not compiled")
        if bounds:
            out.append(" / ".join(mfu_bounds(mine)))
        rows.append(f"| {name} | {mine[0]['parameters'] / 1e6:,.0f} M | " + " | ".join(out) + " |")
    return "\n".join([head, *rows])


def mfu_bounds(mine: list[dict]) -> list[str]:
    """One preset's MFU bounds on v5e, v5p and v6e: v5p's from its unrolled compiles (``unrolled``
    of its fitting v5p cell), the others from the same bytes per chip at their own peak FLOP/s
    and HBM bandwidth (≈: derived; not for a rematerialised cell, whose step moves other bytes),
    each with the model FLOPs per chip of the unrolled compiles (the fitting cell's in older JSON).
    Each is XLA's bytes accessed, then in brackets the same with HBM-only bytes
    (`jaxformer.compile.hbm_bytes`: VMEM buffers and prefetch copies counted as HBM moves them)."""
    from jaxformer.parallel.topology import CHIPS

    measured = next((x["unrolled"] for x in mine if "unrolled" in x), None)
    out = []
    for chip in ("v5e", "v5p", "v6e"):
        fit = [x for x in mine if x["topology"].startswith(chip + ":") and x["fits"]]
        if measured is None or not fit:
            out.append("–")
            continue
        cell = min(fit, key=lambda x: x["chips"])
        only = measured.get("hbm_only_bytes")  # older JSON: XLA's bytes alone
        if "unrolled" in cell:
            u = cell["unrolled"]
            out.append(f"{u['mfu_bound']:.0%}" + (f" (HBM only {u['mfu_bound_hbm_only']:.0%})"
                                                  if "mfu_bound_hbm_only" in u else ""))
            continue
        if cell.get("overrides"):  # rematerialised: other bytes than v5p's step; not derived
            out.append("–")
            continue
        spec = CHIPS[chip]
        flops = measured.get("model_flops_per_chip", cell["model_flops_per_chip"])  # older JSON
        compute = flops / spec.bf16_flops
        bound = [f"≈{compute / max(compute, moved / spec.hbm_bytes_per_s):.0%}"
                 for moved in (measured["bytes"], only) if moved]
        out.append(bound[0] + (f" (HBM only {bound[1]})" if only else ""))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--chips", default=",".join(SLICES))
    ap.add_argument("--fixed", default="", help="compile every preset on this one slice instead")
    ap.add_argument("--unrolled", default="",
                    help="preset@topology: its unrolled roofline by 1- and 2-layer compiles")
    ap.add_argument("--rooflines", default="", metavar="CHIP",
                    help="--unrolled for each preset's smallest fitting CHIP cell of the JSON")
    ap.add_argument("--rerun", action="store_true",
                    help="with --rooflines: recompute the presets' unrolled rooflines already in the JSON")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for --unrolled, e.g. model.attention_impl=splash")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "fits.json"))
    ap.add_argument("--markdown", default=os.path.join(HERE, "results", "fits.md"))
    args = ap.parse_args()
    if args.unrolled:
        print(json.dumps(unrolled_roofline(*args.unrolled.split("@"), tuple(args.set))))
        return
    cells = json.load(open(args.json)) if os.path.exists(args.json) else []
    done = {cell_key(c): c for c in cells}

    def save(cell: dict) -> dict:
        cells.append(cell)
        done[cell_key(cell)] = cell
        with open(args.json, "w") as f:
            json.dump(cells, f, indent=1)
        with open(args.markdown, "w") as f:
            f.write(markdown(cells) + "\n")
        print(json.dumps({k: v for k, v in cell.items() if k not in ("roofline", "collectives")}),
              flush=True)
        return cell

    if args.rooflines:
        for name in args.presets.split(","):
            fit = [c for c in cells if c["preset"] == name and c["fits"]
                   and c["topology"].startswith(args.rooflines + ":")]
            if fit and (args.rerun or "unrolled" not in min(fit, key=lambda c: c["chips"])):
                cell = min(fit, key=lambda c: c["chips"])
                cell["unrolled"] = unrolled_roofline(
                    name, cell["topology"], tuple(cell.get("overrides", ())) + tuple(args.set))
                cells.remove(cell)
                save(cell)
        print(markdown(cells))
        return
    for name in args.presets.split(","):
        if args.fixed:
            done.get((name, args.fixed, ())) or save(compile_cell(name, args.fixed))
            continue
        for chip in args.chips.split(","):
            if smallest_fit(name, chip, done, save) is None:
                print(f"{name}: nothing in {SLICES[chip]} of {chip} fits", file=sys.stderr)
    print(markdown(cells))


if __name__ == "__main__":
    main()
