"""Compile the trainer's real step for an accelerator topology this machine does not have
(`compile_report`); its command line is `jaxformer.cli.compile`:

    python -m jaxformer.cli.compile --preset gpt2_medium_bf16 --topology v5p:4x4x4 --mesh fsdp=64
    python -m jaxformer.cli.compile --config configs/gpt_pretrain_tiny.py --topology v5e:2x2 \\
        --config.mesh.fsdp=4 --config.model.attention_impl=splash
    python -m jaxformer.cli.compile --preset t5_base_bf16 --topology v5e:2x2 --num_slices 2 \\
        --mesh dcn_data=2,fsdp=4 --json t5.json

The step is the one `train.py` runs — same config resolution and checks, mesh rules, optimizer,
remat, scan, attention implementation, objective and gradient accumulation (`jaxformer.plan`'s
`_setup`) — lowered from abstract inputs onto compile-only devices of the topology
(`jaxformer.parallel.topology`: libtpu on a CPU host, as MaxText's ``train_compile``; for GPUs jax's
CUDA plugin with our description of the GPU, no GPU needed). Nothing is allocated. Kernel choices
are checked against the topology's platform, not this machine's. The report (the CLI prints a
table, then one JSON line):

* compile time;
* per-chip HBM from XLA's buffer assignment — arguments (state + batch), temporaries, outputs
  not aliased to donated inputs, their sum — against the chip's capacity (`topology.CHIPS`);
* model FLOPs per step (`jaxformer.flops.model_flops`) and, where the backend reports them, XLA's
  FLOPs and bytes accessed per chip (the TPU compiler does; the GPU compiler's compile-only
  programs report none);
* the collectives of the compiled HLO by kind (all-gather, reduce-scatter, all-reduce,
  all-to-all, collective-permute): how many run per step and the bytes of their results. An
  instruction inside a while loop's body (a scanned layer, ``model.scan_layers``) runs once per
  iteration and counts so: the trip count is XLA's ``known_trip_count`` where the compiler
  states it (GPU), else the bound of the loop condition's ``counter < N`` (TPU);
* a roofline: the step cannot be faster than its model FLOPs at the chip's peak, nor than its
  bytes accessed at the HBM bandwidth (where XLA reports them), nor than its collective bytes at
  the ICI (NVLink) bandwidth; the largest bounds the step time, and model-FLOPs time / that bound
  bounds the MFU.

A plan that does not fit the chip's HBM is refused with one line naming the largest part and what
to change (exit status 1).
"""

from __future__ import annotations

import math
import re
import time

import jax
import numpy as np

from jaxformer.parallel.topology import Topology
from jaxformer.plan import compile_on_topology, compiled_cost, compiled_memory, plan

COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1}


def _shape_bytes(text: str) -> list[int]:
    """Bytes of each array type in an HLO result type, e.g. ``(bf16[8,128]{1,0}, f32[4])``."""
    out = []
    for dtype, dims in re.findall(r"\b([a-z]+\d*(?:e\dm\d(?:fn)?)?)\[([\d,]*)\]", text):
        if dtype in _DTYPE_BYTES:
            out.append(_DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d))
    return out


def _top_level(type_text: str) -> list[str]:
    """The elements of an HLO tuple type, ``(a, (b, c), d)`` → ``["a", "(b, c)", "d"]`` (commas
    inside shapes, layouts and nested tuples are not separators); ``[type_text]`` if no tuple."""
    text = type_text.strip()
    if not text.startswith("("):
        return [text]
    parts, depth, start = [], 0, 1
    for i, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if (ch == "," and depth == 1) or (ch == ")" and depth == 0):
            parts.append(text[start:i].strip())
            start = i + 1
    return [p for p in parts if p]


def _result_bytes(type_text: str, kind: str, start: bool) -> int:
    """Bytes a collective produces, from its HLO result type. Synchronous: all its results (a
    combined collective's tuple summed). Asynchronous ``-start``: the GPU compiler's result is
    ``((operands…), results…)`` — the results summed; the TPU compiler's is flat: an all-reduce's
    outputs (summed), or the others' input and output buffers and scalar sync flags, of which
    the output is the largest."""
    parts = _top_level(type_text)
    if start and len(parts) > 1 and parts[0].startswith("("):
        return sum(sum(_shape_bytes(p)) for p in parts[1:])
    sizes = _shape_bytes(type_text)
    if start and kind != "all-reduce":
        return max(sizes, default=0)
    return sum(sizes)


def _groups(line: str) -> list[list[int]]:
    """Device groups of a collective's HLO line: ``replica_groups={{0,1},{2,3}}``, the iota form
    ``replica_groups=[2,4]<=[4,2]T(1,0)``, the mesh form ``replica_groups=mesh['data'=2,
    'fsdp'=4] {'fsdp'}`` (the devices in order over the named axes, a group for each index of
    the axes not in braces), or a permute's ``source_target_pairs={{0,1},{1,2}}`` (each pair a
    group); [] when the line names none."""
    m = re.search(r"(?:replica_groups|source_target_pairs)=\{((?:\{[\d,]*\},?)*)\}", line)
    if m:
        return [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}",
                                                                        m.group(1))]
    m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
    if m:
        axes = [(a, int(n)) for a, n in re.findall(r"'([^']+)'=(\d+)", m.group(1))]
        inside = re.findall(r"'([^']+)'", m.group(2))
        order = [i for i, (a, _) in enumerate(axes) if a not in inside] + [
            [a for a, _ in axes].index(a) for a in inside]
        ids = np.arange(math.prod(n for _, n in axes)).reshape([n for _, n in axes])
        size = math.prod(n for a, n in axes if a in inside)
        return ids.transpose(order).reshape(-1, size).tolist()
    m = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if not m:
        return []
    shape, dims = [int(x) for x in m.group(1).split(",")], [int(x) for x in m.group(2).split(",")]
    ids = np.arange(math.prod(dims)).reshape(dims)
    if m.group(3):
        ids = ids.transpose([int(x) for x in m.group(3).split(",")])
    return ids.reshape(shape).tolist()


def collectives(hlo_text: str, slice_of: list[int] | None = None) -> dict[str, dict[str, int]]:
    """``{kind: {"count", "bytes", "dcn_count", "dcn_bytes"}}`` of the collectives that one run of
    compiled HLO text executes: an instruction in a computation that runs ``n`` times (a while
    body, `_executions`) counts ``n`` times, its bytes too. ``dcn_*``: those that cross slices (or
    GPU hosts) — a device group spanning several (``slice_of[i]``: the slice or host of the
    program's device ``i``), or the TPU's transfers to the data-center network
    (``_xla_megascale_*`` sends, bytes summed over their chunks). An asynchronous
    pair (``all-gather-start`` … ``-done``) counts once, by its ``-start``, sized by its results
    (`_result_bytes`); a combined collective (the GPU compiler merges FSDP's gathers into one
    instruction over a tuple of weights) counts once, its results summed. Every other collective
    instruction counts, except the TPU compiler's clones: it clones a collective into each fusion
    of an async-collective chain (an all-gather overlapped with the matmuls of a layer), 18 copies
    of one table all-gather in a 2-layer GPT, each marked with the chain
    (``frontend_attributes={chain_id="3"}``) and sharing the original's ``channel_id``; those count
    once per (chain, channel). A ``channel_id`` alone identifies no collective: XLA gives every
    ``ppermute`` of a `shard_map` the same one (``channel_id=1`` for all the ring attention's
    collective-permutes, on CPU and TPU alike: 20 distinct instructions in a 2-layer GPT on
    ``mesh.context=4``), so distinct collectives sharing it each count, as often as they run.
    The TPU's fused reduce-scatter (an ``all-reduce-scatter`` fusion: all-reduce and
    dynamic-slice of the shard) is a reduce-scatter of its result (the shards), not the all-reduce
    its body holds."""
    stats = {k: {"count": 0, "bytes": 0, "dcn_count": 0, "dcn_bytes": 0} for k in COLLECTIVES}
    chains = set()

    def add(kind: str, moved: int, line: str, times: int) -> None:
        chain = re.search(r'\bchain_id(?:=|":)"?(\d+)', line)
        if chain:
            channel = re.search(r"\bchannel_id=(\d+)", line)
            key = (kind, chain.group(1), channel.group(1) if channel else None)
            if key in chains:
                return  # the same collective again, in the next fusion of its async chain
            chains.add(key)
        stat = stats[kind]
        stat["count"] += times
        stat["bytes"] += moved * times
        if slice_of and any(len({slice_of[d] for d in g}) > 1 for g in _groups(line)):
            stat["dcn_count"] += times
            stat["dcn_bytes"] += moved * times

    pattern = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.+?) (" + "|".join(COLLECTIVES)
                         + r")(-start)?\(.*$", re.M)
    computations, fused = _fused_reduce_scatters(_computations(hlo_text))
    keys, executions = set(), _executions(computations)
    for name, text in computations.items():
        times = executions.get(name, 1)
        for m in _FUSED_RS_CALL.finditer(text):  # counted where called, sized by their shards
            add("reduce-scatter", sum(_shape_bytes(m.group(1))), fused.get(m.group(2), ""), times)
        for m in pattern.finditer(text):
            if _shape_bytes(m.group(1)):
                add(m.group(2), _result_bytes(m.group(1), m.group(2), bool(m.group(3))),
                    m.group(0), times)
        # TPU multi-slice: the compiler splits a collective over slices into an ICI part (above,
        # within a slice) and host transfers to the DCN runtime ("megascale" sends, named by a
        # rendezvous key, counted once per key: about one per tensor, so more than the ICI count).
        sends = re.finditer(r"^\s*%?[\w.\-]+ = (.+?) send\(.*?_xla_host_transfer_rendezvous="
                            r"\"([^\"]+)\".*?_xla_megascale_transfer_type=\"(\w+)\"", text, re.M)
        for m in sends:
            kind = _MEGASCALE_KINDS.get(m.group(3), "collective-permute")
            stats[kind]["dcn_bytes"] += max(_shape_bytes(m.group(1)) or [0]) * times
            key = m.group(2).rsplit("_", 1)[0]
            if key not in keys:
                keys.add(key)
                stats[kind]["dcn_count"] += times
    return stats


_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_CALLS = re.compile(r"\b(calls|to_apply|body|condition|true_computation|false_computation)="
                    r"%?([\w.\-]+)|\b(?:branch_computations|called_computations)=\{([^}]*)\}")
# A brace outside a string, or a whole string (skipped: braces in a backend config's JSON count not).
_BRACE_OR_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"|[{}]')


def _computations(hlo_text: str) -> dict[str, str]:
    """{name: text} of the computations of HLO module text (``ENTRY`` under ``"ENTRY"``), one
    instruction per line; text that is no module (instruction lines only, as in tests) is one
    computation, ``"ENTRY"``.

    Computations and instructions are delimited by brace depth outside strings, not by line starts:
    an attribute may span lines — the splash kernel's ``frontend_attributes={kernel_metadata={`` …
    ``}}, metadata=…`` on the next lines — and such a line starting with ``}`` ends no
    computation. An instruction's continuation lines are joined to it."""
    out, name, lines, depth, instruction = {}, None, [], 0, ""
    for line in hlo_text.splitlines():
        before = depth
        for token in _BRACE_OR_STRING.findall(line):
            depth += (token == "{") - (token == "}")
        if before == 0:  # between computations: a header opens one (depth 0 -> 1)
            header = _HEADER.match(line) if depth == 1 else None
            name, lines = (("ENTRY" if line.startswith("ENTRY") else header.group(1)), []) \
                if header else (None, [])
        elif name is not None and depth == 0:  # its closing brace
            out[name], name = "\n".join(lines), None
        elif name is not None:
            instruction = line if before == 1 else f"{instruction} {line.strip()}"
            if depth == 1:  # the instruction is complete
                lines.append(instruction)
    return out or {"ENTRY": hlo_text}


def _trip_count(while_line: str, computations: dict[str, str], condition: str) -> int:
    """Iterations of a ``while``: XLA's ``known_trip_count`` on the instruction (GPU), else
    ``N`` of a condition ``counter < N`` with a constant N (a `lax.scan`'s loop on TPU; the
    counter starts at 0); 1 when neither is there (counted as one iteration)."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"', while_line)
    if known:
        return int(known.group(1))
    text = computations.get(condition, "")
    bound = re.search(r"ROOT .*compare\(%?[\w.\-]+, %?([\w.\-]+)\), direction=LT", text)
    if bound:
        constant = re.search(r"%?" + re.escape(bound.group(1)) + r" = s(?:32|64)\[\]\S* "
                             r"constant\((\d+)\)", text)
        if constant:
            return int(constant.group(1))
    return 1


def _executions(computations: dict[str, str]) -> dict[str, int]:
    """How many times each computation runs per execution of the module: ENTRY once; a callee
    as often as its callers call it, a while body ``trip count`` times per run of the ``while``
    (nested loops multiply). ``computations``: `_computations` of the module."""
    callers: dict[str, list[tuple[str, int]]] = {}
    for parent, text in computations.items():
        for line in text.splitlines():
            condition = re.search(r"\bcondition=%?([\w.\-]+)", line)
            for kind, callee, listed in _CALLS.findall(line):
                times = (_trip_count(line, computations, condition.group(1))
                         if kind == "body" and condition else 1)
                for c in ([callee] if callee else re.findall(r"%?([\w.\-]+)", listed)):
                    callers.setdefault(c, []).append((parent, times))
    result: dict[str, int] = {}

    def runs(name: str) -> int:  # HLO's call graph is acyclic
        if name not in result:
            sites = callers.get(name)
            result[name] = 1 if name == "ENTRY" or not sites else sum(runs(p) * t
                                                                     for p, t in sites)
        return result[name]

    for name in computations:
        runs(name)
    return result


# The TPU compiler's reduce-scatter of a GSPMD-partitioned gradient: a ``kind=kCustom`` fusion
# calling a computation ``%all-reduce-scatter.N`` whose body is an all-reduce of the whole array and
# the dynamic-slice of this device's shard, and whose result is the shard. It is one reduce-scatter
# (sized by the shards, as `psum_scatter`'s ``reduce-scatter`` instruction is), not an all-reduce.
_FUSED_RS_CALL = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (.+?) fusion\(.*?calls=%?"
                            r"(all-reduce-scatter[\w.\-]*).*$", re.M)


def _fused_reduce_scatters(computations: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(``computations`` without the ``all-reduce-scatter`` ones, {their name: the line of the
    all-reduce in their body}, whose device groups are the reduce-scatter's)."""
    inner = {}
    for name, text in computations.items():
        if name.startswith("all-reduce-scatter"):
            line = re.search(r"^.* all-reduce(?:-start)?\(.*$", text, re.M)
            inner[name] = line.group(0) if line else ""
    return {k: v for k, v in computations.items() if k not in inner}, inner


# ---- Bytes by memory space -------------------------------------------------------------------
# XLA's "bytes accessed" (`HloCostAnalysis`, which libtpu's figure follows) charges every top-level
# instruction its operands' and results' bytes whatever memory they live in: an asynchronous copy
# of S bytes from HBM (memory space 0) to VMEM (``S(1)`` in the layout) costs 4·S (copy-start: its
# operand and its (destination, source) result; copy-done: its result), and the fusion that reads
# the VMEM buffer S more — 5·S for S bytes that cross HBM once. `hbm_bytes` counts HBM alone.
_LEAF = re.compile(r"\b([a-z]+\d*(?:e\dm\d(?:fn)?)?)\[([\d,]*)\](?:\{([^{}]*)\})?")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][\w\-]*)\((.*)$")
# Top-level instructions that move no array bytes of their own (a while's or call's body is
# counted as its own computation).
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all",
         "partition-id", "replica-id", "opt-barrier", "while", "call", "conditional",
         "add-dependency", "domain", "call-start", "call-update", "call-done", "async-start",
         "async-update", "async-done"}
# Instructions whose computations run as top-level programs (not fused, not a reducer).
_RUNS_CALLEES = {"while", "conditional", "call", "call-start", "async-start"}


def _leaves(type_text: str) -> list[tuple[int, int]]:
    """``(bytes, memory space)`` of each array of an HLO type, the bytes as the layout stores
    them: the dimensions padded to the layout's first tile (``{1,0:T(8,128)(2,1)}`` pads the two
    most-minor dimensions to multiples of 8 and 128, as libtpu's cost analysis sizes them); the
    memory space is the layout's ``S(n)``, 0 (HBM) when it names none."""
    out = []
    for dtype, dims, layout in _LEAF.findall(type_text):
        if dtype not in _DTYPE_BYTES:
            continue
        shape = [int(d) for d in dims.split(",") if d]
        order, _, tiling = (layout or "").partition(":")
        minor_to_major = [int(d) for d in order.split(",") if d] or list(range(len(shape)))[::-1]
        padded = [shape[d] for d in reversed(minor_to_major)]  # major to minor
        tile = re.match(r"T\(([\d,]+)\)", tiling)
        if tile:
            sizes = [int(t) for t in tile.group(1).split(",")]
            padded = [1] * max(0, len(sizes) - len(padded)) + padded
            for i, t in enumerate(sizes[::-1]):
                padded[-1 - i] = -(-padded[-1 - i] // t) * t
        space = re.search(r"S\((\d+)\)", tiling)
        out.append((_DTYPE_BYTES[dtype] * math.prod(padded), int(space.group(1)) if space else 0))
    return out


def _operands(rest: str) -> list[str]:
    """Names of an instruction's operands: the ``%names`` inside its balanced opcode parentheses
    (``rest`` is the line after ``opcode(``)."""
    depth = 1
    for i, ch in enumerate(rest):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return re.findall(r"%([\w.\-]+)", rest[:i])
    return re.findall(r"%([\w.\-]+)", rest)


def _parse(text: str) -> list[tuple[str, str, str, list[str], str]]:
    """``(name, type, opcode, operands, line)`` of each instruction of a computation's text."""
    out = []
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            out.append((m.group(1), m.group(2), m.group(3), _operands(m.group(4)), line))
    return out


def _fusion_bytes(fused: list, operand_types: list[str], result_type: str, hbm_only: bool,
                  ) -> tuple[int, int]:
    """(operand bytes, result bytes) of a fusion, by XLA's fusion rules: a parameter read only
    through slices, dynamic slices or (HBM count: gathers) costs what they take; the buffer a
    root ``dynamic-update-slice`` updates in place costs only the update, read or written."""
    by_name = {f[0]: f for f in fused}
    params = {int(re.search(r"parameter\((\d+)\)", f[4]).group(1)): f[0]
              for f in fused if f[2] == "parameter"}
    users: dict[str, list] = {}
    for f in fused:
        for o in f[3]:
            users.setdefault(o, []).append(f)
    root = next((f for f in fused if f[4].lstrip().startswith("ROOT")), fused[-1] if fused else None)
    read = 0
    for index, type_text in enumerate(operand_types):
        leaves = [b for b, space in _leaves(type_text) if not hbm_only or space == 0]
        name = params.get(index)
        if not leaves or name is None:
            continue
        whole, part = False, 0
        for user in users.get(name, []):
            first = user[3] and user[3][0] == name
            if first and user[2] in ("slice", "dynamic-slice") or (
                    hbm_only and first and user[2] == "gather"):
                part += sum(b for b, _ in _leaves(user[1]))
            elif first and user[2] == "dynamic-update-slice":  # updated in place
                continue
            else:
                whole = True
        read += min(sum(leaves), part + (sum(leaves) if whole else 0))
    results = _leaves(result_type)
    written = sum(b for b, space in results if not hbm_only or space == 0)
    for name in ({root[0]} if root and root[2] == "dynamic-update-slice" else
                 {o for o in (root[3] if root and root[2] == "tuple" else [])
                  if o in by_name and by_name[o][2] == "dynamic-update-slice"}):
        full = sum(b for b, _ in _leaves(by_name[name][1]))
        update = sum(b for b, _ in _leaves(by_name[by_name[name][3][1]][1])) \
            if by_name[name][3][1] in by_name else full
        written -= full - update
    return read, max(0, written)


def hbm_bytes(hlo_text: str) -> dict:
    """Bytes of one run of a compiled program's HLO, each top-level instruction charged its
    operands' and results' bytes (fusions by XLA's fusion rules, `_fusion_bytes`), two ways:

    * ``"xla_rule"``: every memory space, copies as XLA charges them (copy-start: operand +
      (destination, source); copy-done: result), each computation once — XLA's "bytes
      accessed", reproduced (it checks the parser against ``cost_analysis()``);
    * ``"hbm"``: only arrays in HBM (memory space 0): a copy between memory spaces once, on
      its HBM side (a prefetch reads HBM, an eviction writes it), a VMEM operand or result not at
      all, a gather's table as the rows it takes, and a while body as often as it runs
      (`_executions`).

    Sizes are the layouts' tile-padded sizes (`_leaves`); an output aliased to an operand writes
    nothing (`_unaliased`); a Pallas kernel is charged the ``bytes_accessed`` its cost estimate
    declares (HBM: in the proportion of its operand and result bytes that are in HBM). Both counts
    charge a fusion each operand once; a fusion that re-reads an operand's windows moves more.
    Also ``"by_kind"`` (HBM bytes per opcode) and ``"top"`` (the 20 instructions with the most
    HBM bytes: name, opcode, bytes, ``op_name`` metadata)."""
    computations = _computations(hlo_text)
    parsed = {name: _parse(text) for name, text in computations.items()}
    types = {i[0]: i[1] for instrs in parsed.values() for i in instrs}
    runs = _executions(computations)
    top_level = {"ENTRY"}
    for instrs in parsed.values():
        for _, _, opcode, _, line in instrs:
            if opcode in _RUNS_CALLEES:
                for _, callee, listed in _CALLS.findall(line):
                    top_level.update([callee] if callee else re.findall(r"%?([\w.\-]+)", listed))
    xla = hbm = 0
    by_kind: dict[str, int] = {}
    rows = []
    for comp in top_level & set(parsed):
        for name, type_text, opcode, operands, line in parsed[comp]:
            if opcode in _FREE:
                continue
            operand_types = [types.get(o, "") for o in operands]
            type_text = _unaliased(type_text, line)
            if opcode == "fusion" and (callee := re.search(r"\bcalls=%?([\w.\-]+)", line)) \
                    and callee.group(1) in parsed:
                fused = parsed[callee.group(1)]
                r, w = _fusion_bytes(fused, operand_types, type_text, False)
                hr, hw = _fusion_bytes(fused, operand_types, type_text, True)
                x, h = r + w, hr + hw
            else:
                x, h = _instruction_bytes(opcode, type_text, operand_types)
                declared = re.search(r'"cost_estimate":\{[^}]*"bytes_accessed":"(\d+)"', line)
                if declared:  # a Pallas kernel's own figure; HBM: its share on HBM buffers
                    h, x = int(int(declared.group(1)) * h / x) if x else 0, int(declared.group(1))
            xla += x
            hbm += h * runs.get(comp, 1)
            by_kind[opcode] = by_kind.get(opcode, 0) + h * runs.get(comp, 1)
            meta = re.search(r'op_name="([^"]*)"', line)
            rows.append((h * runs.get(comp, 1), name, opcode, meta.group(1) if meta else ""))
    rows.sort(reverse=True)
    return {"xla_rule": xla, "hbm": hbm,
            "by_kind": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "top": [{"name": n, "opcode": o, "bytes": b, "op_name": m} for b, n, o, m in rows[:20]]}


def _unaliased(type_text: str, line: str) -> str:
    """An instruction's result type without the outputs it aliases to its operands
    (``output_to_operand_aliasing={{2}: (0, {}), …}``: updated in place, or a buffer passed
    through, as TPU's asynchronous-collective fusions pass their gather buffers): no bytes of
    their own are written."""
    aliasing = re.search(r"output_to_operand_aliasing=\{(.*?\))\}", line)
    if not aliasing:
        return type_text
    aliased = {int(i) for i in re.findall(r"\{(\d+)\}:\s*\(", aliasing.group(1))}
    if re.search(r"\{\}:\s*\(", aliasing.group(1)):
        return "()"
    parts = _top_level(type_text)
    return "(" + ", ".join(p for i, p in enumerate(parts) if i not in aliased) + ")"


def _instruction_bytes(opcode: str, type_text: str, operand_types: list[str]) -> tuple[int, int]:
    """(XLA's bytes, HBM bytes) of one unfused instruction (`hbm_bytes`)."""
    def total(text: str, hbm_only: bool) -> int:
        return sum(b for b, space in _leaves(text) if not hbm_only or space == 0)

    result = _leaves(type_text)
    if opcode == "copy-start":  # result (destination, source, context)
        dest = _leaves(_top_level(type_text)[0])
        return (sum(total(t, False) for t in operand_types) + sum(b for b, _ in result[:2]),
                sum(total(t, True) for t in operand_types) + sum(b for b, s in dest if s == 0))
    if opcode == "copy-done":
        return total(type_text, False), 0
    if opcode in ("slice", "dynamic-slice"):
        out = total(type_text, False)
        h = total(type_text, True) + (out if operand_types and total(operand_types[0], True) else 0)
        return 2 * out, h
    if opcode == "dynamic-update-slice":
        update = total(operand_types[1], False) if len(operand_types) > 1 else 0
        return 2 * update, (total(operand_types[1], True) if len(operand_types) > 1 else 0) + (
            update if total(type_text, True) else 0)
    x = total(type_text, False) + sum(total(t, False) for t in operand_types)
    h = total(type_text, True) + sum(total(t, True) for t in operand_types)
    if opcode.endswith("-done"):  # the -start's result already holds its buffers
        return x, 0
    return x, h


_MEGASCALE_KINDS = {"ALL_REDUCE": "all-reduce", "ALL_GATHER": "all-gather",
                    "REDUCE_SCATTER": "reduce-scatter", "ALL_TO_ALL": "all-to-all"}


def roofline(topo: Topology, model_flops_per_device: float, xla: dict, comm_bytes: float,
             devices_per_chip: int = 1, network_bytes: float = 0.0,
             hbm_only_bytes: float | None = None) -> dict:
    """Lower bounds on the step time from each resource of one device (a chip, or one of its
    ``devices_per_chip`` TensorCores), the largest, and the MFU it allows. Where the chip has a
    network figure (GPUs: `topology.Chip.network_bytes_per_s`), the ``network_bytes`` of
    collectives that cross hosts are priced at it, the rest of ``comm_bytes`` at the ICI.

    The HBM term is XLA's "bytes accessed" (``hbm_s``: every memory space, a VMEM prefetch
    charged 5 times its bytes, see `hbm_bytes`). Given ``hbm_only_bytes`` (`hbm_bytes`'s
    ``"hbm"``), ``hbm_only_s``, ``bound_by_hbm_only`` and ``mfu_bound_hbm_only`` are the same
    roofline with that term instead; ``step_s``, ``bound_by`` and ``mfu_bound`` stay XLA's."""
    chip, share = topo.chip, 1.0 / devices_per_chip
    network = chip.network_bytes_per_s
    ici_bytes = comm_bytes - network_bytes if network else comm_bytes
    bounds = {"compute_s": model_flops_per_device / (chip.bf16_flops * share),
              "hbm_s": xla["bytes"] / (chip.hbm_bytes_per_s * share) if "bytes" in xla else None,
              "ici_s": ici_bytes / (chip.ici_bytes_per_s * share),
              "network_s": network_bytes / (network * share) if network and network_bytes else None}
    step = max(v for v in bounds.values() if v is not None)
    bound = max(bounds, key=lambda k: bounds[k] or 0.0)
    out = {**bounds, "step_s": step, "bound_by": bound.removesuffix("_s"),
           "mfu_bound": bounds["compute_s"] / step if step else None}
    if hbm_only_bytes is not None:
        only = {**bounds, "hbm_s": hbm_only_bytes / (chip.hbm_bytes_per_s * share)}
        only_step = max(v for v in only.values() if v is not None)
        out.update(hbm_only_s=only["hbm_s"],
                   bound_by_hbm_only=max(only, key=lambda k: only[k] or 0.0).removesuffix("_s"),
                   mfu_bound_hbm_only=only["compute_s"] / only_step if only_step else None)
    return out


def compile_report(config, topo: Topology) -> dict:
    """The report of the module docstring for ``config`` on ``topo`` (ValueError if it cannot
    be built: a mesh that does not fit the chips, a kernel the platform cannot run, ...)."""
    report = plan(config, compile=False, topology=topo)
    started = time.perf_counter()
    try:
        compiled, seconds, mesh = compile_on_topology(config, topo)
    except jax.errors.JaxRuntimeError as e:
        oom = compiler_oom(str(e))
        if oom is None:
            raise
        return _refused_by_compiler(report, topo, oom, time.perf_counter() - started)
    mem, xla = compiled_memory(compiled), compiled_cost(compiled)
    text = compiled.as_text()
    traffic = hbm_bytes(text) if "bytes" in xla else None  # TPU: layouts name memory spaces
    n_devices = mesh.size
    # The program's device i is the mesh's i-th device (its device assignment). What crosses:
    # TPU slices (the data-center network), or GPU hosts (InfiniBand; NVLink within a host).
    gpu = topo.chip.platform == "cuda"
    comm = collectives(text,
                       [d.process_index if gpu else getattr(d, "slice_index", 0) or 0
                        for d in mesh.devices.flat])
    per_chip = max(1, n_devices // topo.num_chips)  # 1: v4 and v5p in megacore mode
    capacity = topo.chip.hbm_bytes / per_chip
    report.update(
        topology=topo.name, num_slices=topo.num_slices, chip=topo.chip.name,
        platform=topo.chip.platform, hosts=len({d.process_index for d in mesh.devices.flat}),
        chip_source=topo.chip.source, devices_per_chip=per_chip, compile_s=seconds, memory=mem,
        hbm_capacity=capacity, fits=mem["peak_estimate"] <= capacity, xla=xla, collectives=comm,
        hbm_traffic=traffic,
        roofline=roofline(topo, report["model_flops_per_step"] / n_devices, xla,
                          sum(c["bytes"] for c in comm.values()), per_chip,
                          sum(c["dcn_bytes"] for c in comm.values()),
                          traffic["hbm"] if traffic else None))
    return report


_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def compiler_oom(message: str) -> dict | None:
    """The TPU compiler's own refusal of a program that cannot fit (``RESOURCE_EXHAUSTED: …
    CompileTimeHbmOom: Ran out of memory on HBM, the total memory required for HLO temporaries
    (17.35G) exceeds available HBM (15.75G)``): ``{"what", "required", "available"}`` in bytes,
    or None for any other error. libtpu stops there, so no buffer assignment comes back."""
    m = re.search(r"memory required for ([^(]+?) \(([\d.]+)([KMGT])\) exceeds available HBM "
                  r"\(([\d.]+)([KMGT])\)", message)
    if "RESOURCE_EXHAUSTED" not in message or not m:
        return None
    return {"what": m.group(1).strip(), "required": float(m.group(2)) * _UNITS[m.group(3)],
            "available": float(m.group(4)) * _UNITS[m.group(5)]}


def _refused_by_compiler(report: dict, topo: Topology, oom: dict, seconds: float) -> dict:
    """The report of a step the TPU compiler refused for HBM: the memory is the planner's exact
    state (arguments, without the batch) and the compiler's own figure for what did not fit
    (``temp_size``); no collectives or roofline (no program)."""
    per_chip = max(1, report["devices"] // topo.num_chips)
    state = report["params_bytes"]["per_device"] + report["opt_state_bytes"]["per_device"]
    temps = oom["required"] if "temporaries" in oom["what"] else max(0.0, oom["required"] - state)
    report.update(
        topology=topo.name, num_slices=topo.num_slices, chip=topo.chip.name,
        platform=topo.chip.platform, hosts=1, chip_source=topo.chip.source,
        devices_per_chip=per_chip, compile_s=seconds, hbm_capacity=topo.chip.hbm_bytes / per_chip,
        memory={"argument_size": state, "temp_size": temps, "output_size": 0, "alias_size": 0,
                "peak_estimate": state + temps}, fits=False, xla={}, roofline=None,
        collectives={k: {"count": 0, "bytes": 0, "dcn_count": 0, "dcn_bytes": 0}
                     for k in COLLECTIVES},
        refused_by_compiler=f"{oom['what']} need {gib(oom['required'])} of the "
                            f"{gib(oom['available'])} available")
    return report


def refusal(report: dict) -> str | None:
    """One line saying why the plan does not fit the chip, or None when it fits."""
    if report["fits"]:
        return None
    m, cap = report["memory"], report["hbm_capacity"]
    parts = {"state + batch (arguments)": m["argument_size"],
             "activations + temporaries": m["temp_size"]}
    largest = max(parts, key=parts.get)
    fix = ("shard the state further (a larger mesh.fsdp), bfloat16 parameters or fewer of them"
           if largest.startswith("state") else
           "model.remat_policy='full' (or 'dots'), a smaller data.batch_size with "
           "optimizer.grad_accum_steps, or more chips on the batch axes")
    compiler = (f" (the compiler stopped: {report['refused_by_compiler']})"
                if report.get("refused_by_compiler") else "")
    return (f"does not fit {report['chip']}: {gib(m['peak_estimate'])} per chip of "
            f"{gib(cap)} ({largest} {gib(parts[largest])} is the largest part){compiler}; "
            f"try {fix}")


def gib(x: float) -> str:
    """``x`` bytes in GiB, two decimals."""
    return f"{x / 2**30:.2f} GiB"


__all__ = ["COLLECTIVES", "collectives", "compile_report", "compiler_oom", "gib", "hbm_bytes",
           "refusal", "roofline"]
