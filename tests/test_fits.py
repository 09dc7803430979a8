"""bench/fits.py's search and table (no TPU compiles: those take minutes each)."""

import importlib.util
import os

import pytest

from jaxformer.parallel.topology import CHIPS
from jaxformer.plan import plan

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "bench", "fits.py")
_SPEC = importlib.util.spec_from_file_location("fits", _PATH)
fits = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(fits)


@pytest.mark.parametrize("chip", sorted(fits.SLICES))
@pytest.mark.parametrize("parameters", [124_475_904, 1_557_686_400, 2_851_598_336, 10**12])
def test_candidates_start_at_the_smallest_slice_holding_the_state(chip, parameters):
    hbm = CHIPS[chip].hbm_bytes
    got = fits.candidates(chip, parameters, hbm)
    shapes = fits.SLICES[chip]
    # brute force: every slice whose chips hold 16 bytes a parameter in half their HBM, in order
    want = [f"{chip}:{s}" for s in shapes
            if all(16 * parameters / fits.chips_of(t) <= 0.5 * hbm
                   for t in shapes[shapes.index(s):])]
    assert got == want
    chips = [fits.chips_of(t.split(":")[1]) for t in got]
    assert chips == sorted(chips) and len(set(chips)) == len(chips)


def test_slice_sizes():
    assert [fits.chips_of(s) for s in fits.SLICES["v5p"]] == [4, 8, 16, 32, 64, 128, 256]
    assert fits.chips_of(fits.SLICES["v5e"][-1]) == fits.chips_of(fits.SLICES["v6e"][-1]) == 256


def test_state_bytes_per_parameter_matches_the_planner():
    """Parameters and AdamW moments as the trainer shards them are 12 bytes a float32 parameter
    (the 16 of the search add the gradient, a temporary)."""
    r = plan(fits.cell_config("gpt_tiny", 1), devices=1, compile=False)
    state = r["params_bytes"]["total"] + r["opt_state_bytes"]["total"]
    assert 12 * r["parameters"] <= state <= 12 * r["parameters"] + 64  # + step counters
    assert fits.STATE_BYTES_PER_PARAM == 12 + 4


def test_cell_config_is_fsdp_over_every_chip_with_scanned_layers():
    c = fits.cell_config("t5_base_bf16", 64)
    assert dict(c.mesh)["fsdp"] == 64 and c.data.batch_size == fits.ROWS_PER_CHIP * 64
    assert c.model.scan_layers and c.data.seq_len == 512
    assert fits.cell_config("gpt2_small_bf16", 4).data.seq_len == 1024


def test_markdown_reports_the_smallest_fitting_slice_and_the_misses():
    cell = dict(preset="gpt2_xl_bf16", parameters=1_557_686_400, hbm_gib=20.0,
                roofline=dict(compute_s=0.2, ici_s=0.01))
    cells = [dict(cell, topology="v5e:2x4", chips=8, fits=False),
             dict(cell, topology="v5e:4x4", chips=16, fits=True),
             dict(cell, topology="v5e:4x8", chips=32, fits=True),
             dict(cell, topology="v5p:2x2x1", chips=4, fits=False)]
    row = fits.markdown(cells).splitlines()[-1]
    assert row.startswith("| gpt2_xl_bf16 | 1,558 M | v5e:4x4 fsdp=16, 20.0 GiB, ICI 5% of compute")
    assert row.endswith("| not fit on v5p:2x2x1 |")


def test_mfu_column_is_v5ps_unrolled_bound_and_derived_for_v5e_and_v6e():
    """v5p's bound comes from its unrolled compiles; v5e's and v6e's are the same bytes per chip at
    their own peak and HBM bandwidth: compute / max(compute, bytes / bandwidth)."""
    flops, moved = 2e12, 4e10  # model FLOPs and bytes accessed per chip
    cell = dict(preset="gpt2_small_bf16", parameters=124_439_808, hbm_gib=8.0, fits=True,
                model_flops_per_chip=flops, roofline=dict(compute_s=0.1, ici_s=0.001))
    cells = [dict(cell, topology="v5e:2x2", chips=4),
             dict(cell, topology="v5p:2x2x1", chips=4,
                  unrolled=dict(bytes=moved, mfu_bound=0.46)),
             dict(cell, topology="v6e:2x2", chips=4)]
    table = fits.markdown(cells).splitlines()
    assert table[0].endswith("| MFU ≤ (v5e / v5p / v6e) |")
    want = ["≈{:.0%}".format(flops / c.bf16_flops / max(flops / c.bf16_flops,
                                                          moved / c.hbm_bytes_per_s))
            for c in (CHIPS["v5e"], CHIPS["v6e"])]
    assert table[-1].endswith(f"| {want[0]} / 46% / {want[1]} |"), table[-1]
    assert "MFU" not in fits.markdown(cells[:1]).splitlines()[0]  # no unrolled cell: no column


def test_mfu_column_gives_the_hbm_only_bound_beside_xlas():
    """A rerun roofline carries the HBM-only bytes (`jaxformer.compile.hbm_bytes`): each bound is
    XLA's figure, then the HBM-only one in brackets, v5p's as compiled, v5e's derived from the same
    bytes at v5e's peak and bandwidth."""
    flops, moved, only = 1e12, 4e10, 1e10
    cell = dict(preset="bert_base_bf16", parameters=110_000_000, hbm_gib=3.0, fits=True,
                model_flops_per_chip=flops, roofline=dict(compute_s=0.1, ici_s=0.001))
    cells = [dict(cell, topology="v5e:2x2", chips=4),
             dict(cell, topology="v5p:2x2x1", chips=4,
                  unrolled=dict(bytes=moved, mfu_bound=0.35, hbm_only_bytes=only,
                                mfu_bound_hbm_only=0.88, model_flops_per_chip=flops))]
    c = CHIPS["v5e"]
    compute = flops / c.bf16_flops
    v5e, v5e_only = (compute / max(compute, b / c.hbm_bytes_per_s) for b in (moved, only))
    assert fits.mfu_bounds(cells) == [f"≈{v5e:.0%} (HBM only ≈{v5e_only:.0%})",
                                      "35% (HBM only 88%)", "–"]


def test_derived_bounds_take_the_unrolled_compiles_model_flops():
    """A rerun roofline (`--rooflines v5p --rerun`) carries its own model FLOPs per chip (BERT's
    count fell when its MLM head moved to the masked positions): v5e's derived bound uses them,
    not the older FLOPs of the scanned cell."""
    old, new, moved = 2e12, 1e12, 4e10
    cell = dict(preset="bert_base_bf16", parameters=110_000_000, hbm_gib=3.0, fits=True,
                model_flops_per_chip=old, roofline=dict(compute_s=0.1, ici_s=0.001))
    cells = [dict(cell, topology="v5e:2x2", chips=4),
             dict(cell, topology="v5p:2x2x1", chips=4,
                  unrolled=dict(bytes=moved, mfu_bound=0.3, model_flops_per_chip=new))]
    c = CHIPS["v5e"]
    want = new / c.bf16_flops / max(new / c.bf16_flops, moved / c.hbm_bytes_per_s)
    assert fits.mfu_bounds(cells)[0] == f"≈{want:.0%}" != f"≈{2 * want:.0%}"


def test_a_slice_whose_activations_do_not_fit_is_tried_again_rematerialised(monkeypatch):
    """A larger slice shrinks the state per chip, not the activations of its 4 rows: the search
    tries full remat on the same slice before moving on, and the table says so."""
    tried = []

    def compile_cell(name, topology, overrides=()):
        tried.append((topology, overrides))
        return dict(preset=name, topology=topology, chips=fits.chips_of(topology.split(":")[1]),
                    parameters=354_823_168, hbm_gib=12.0, overrides=list(overrides),
                    fits=bool(overrides), roofline=dict(compute_s=0.1, ici_s=0.01))

    monkeypatch.setattr(fits, "compile_cell", compile_cell)
    monkeypatch.setattr(fits, "_parameters", lambda name: 354_823_168)
    saved = []
    cell = fits.smallest_fit("gpt2_medium_bf16", "v5e", {}, lambda c: saved.append(c) or c)
    assert tried == [("v5e:2x2", ()), ("v5e:2x2", fits.REMAT)] and cell is saved[-1]
    assert "v5e:2x2 fsdp=4, remat full, 12.0 GiB" in fits.markdown(saved)
