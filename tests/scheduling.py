"""How `make test` spreads the suite over its 2 xdist workers: file order and simulated devices.

`make test` hands whole files to its workers (``--dist loadfile``), so a module-scoped fixture (the
demo run, the pretrained workdirs) is built once. Two things make that quick on 2 cores:

* **Longest first.** Files go out in `LONGEST_FIRST` order, the next file to whichever worker runs
  out first (the classic LPT rule): only short files are left for the end, so neither worker idles
  for minutes while the other finishes a long file.
* **Devices where they are needed** (``JAXFORMER_TEST_DEVICE_SPLIT=1``, set by `make test`). Worker
  ``gw0`` simulates 8 CPU devices, the others one. A tiny model's step on 8 simulated devices
  costs 8 dispatches of every op and an SPMD-partitioned compile, and 2 cores run them no faster:
  the single-device files run ~20% quicker on one device (tests/test_qa.py: 48–54 s vs 64 s,
  loaded machine). Files in `MULTI_DEVICE_FILES` (meshes, sharding, pmap, multi-device
  equalities), and the tests in `MULTI_DEVICE_TESTS` (a work unit of their own, apart from the rest
  of their file: `work_unit`), only ever go to ``gw0``; ``gw0`` takes them first, so the one-device
  worker is not left waiting for them at the end.
"""

from __future__ import annotations

import os

SPLIT_ENV = "JAXFORMER_TEST_DEVICE_SPLIT"
MANY_DEVICES = 8
MANY_DEVICE_WORKER = "gw0"

# The order comes from the CPU seconds of each file's `make test` tests (setup, call and teardown,
# subprocesses included), measured per test under `make test`'s command on a loaded 2-core machine
# (2026-11-28; the figures below are that run's, after this branch's cuts where a file changed);
# the summary line at the end of a `make test` run ("longest files") gives new wall-clock figures.
# Files whose tests are all slow-tier (test_learning.py, test_llama_sft.py) or cost a few seconds
# (test_demo.py's fast tests: 2.5 s, test_evaluate.py's: 0.1 s) are not listed.
LONGEST_FIRST = (
    "test_train.py",  # three pretraining runs; killed, preempted and resumed runs (106 s of CPU)
    "test_decode.py",  # generation against the uncached forward, 8 devices (116 s)
    "test_compile.py",  # train steps compiled for TPU slices by libtpu (~100 s; the GPU ones skip
    # without the [cuda-aot] extra)
    "test_hf_finetune.py",  # the worked examples: RoBERTa on a TSV, BART seq2seq (96 s)
    "test_vocab_padding.py",  # 77-96 s of make test's busy seconds (2026-11-28 runs, this machine)
    "test_reliability.py",  # 56 s
    "test_ring_attention.py",  # context-parallel attention and train steps (61 s)
    "test_parallel.py",
    "test_model.py",  # the model layer: trees, scan, cache, from_hf, sharded init (was test_nnx.py, 43 s)
    "test_head_bytes.py",  # 49-61 s of busy seconds
    "test_models.py",  # 46 s
    "test_init.py",  # 46-48 s of busy seconds
    "test_attention.py",  # 44-46 s of busy seconds
    "test_convert_llama.py",  # five golden Llama-family models, greedy generation (36 s)
    "test_own_data.py",  # train.py and evaluate subprocesses on a user's TSV and JSONL (35 s)
    "test_multiprocess.py",  # one two-process train.py run (22 s, all in the two processes)
    "test_distill.py",  # 17 s
    "test_scheduled_sampling.py",
    "test_qa.py",
    "test_checkpoint_select.py",
    "test_permutation_lm.py",
    "test_albert.py",
    "test_lora.py",  # 10 s
    "test_cli.py",  # the compile-only commands in subprocesses
    "test_beam.py",
    "test_convert.py",
    "test_nnx_train.py",
)

# Files with a test that needs (or means) more than one device in the pytest process itself:
# meshes with an axis > 1, sharded vs single-device equalities, pmap, context parallelism, TPU
# compiles of multi-chip meshes. A file that passes on one device but whose check would then be
# vacuous (a "sharded equals unsharded" on a 1-device mesh) belongs here too. Whole files go to
# ``gw0`` where most of their tests need the devices, or share a module-scoped fixture with those
# that do (it would be built on both workers otherwise).
MULTI_DEVICE_FILES = frozenset({
    "test_compile.py",  # TPU slices of 4 chips (the CPU devices host the abstract inputs)
    "test_moe_parallel.py",  # expert=4 × data=2 against one device
    "test_parallel.py",  # every mesh, pmap and shard_map against one device
    "test_ring_attention.py",  # context parallelism
    "test_scheduled_sampling.py",  # its shard_map and pmap paths (on its module-scoped fixtures)
})

# Files where only a few tests need the devices (no module-scoped fixture of theirs is shared with
# the others): those tests are a work unit of their own on ``gw0``, and the rest of the file runs
# on either worker, so ``gw0`` is not tied to ~300 s of work that needs no devices. What a test
# saves on one device depends on what it runs (loaded 2-core machine, 2026-11-28, CPU seconds):
# generation on unsharded params nothing (tests/test_decode.py, 32 tests: 137 s on one device,
# 136 s on 8); a Trainer, whose mesh spans every device, ~12% (init + one step of
# gpt_pretrain_tiny: 6.7-7.7 s on one device, 7.4-8.8 s on 8).
MULTI_DEVICE_TESTS = {
    "test_albert.py": ("test_sharded_on_an_fsdp_tensor_mesh_equals_unsharded",),
    "test_decode.py": ("test_generate_on_sharded_params_matches_unsharded",),
    "test_lora.py": ("test_adapters_carry_logical_axes_and_shard_like_their_kernels",),
    "test_model.py": ("test_abstract_axes_and_shardings_follow_the_spec",
                      "test_sharded_init_gives_the_rules_shardings"),
    "test_vocab_padding.py": (
        "test_gpt2_preset_shards_its_padded_vocabulary_over_tensor_and_matches_one_device",),
}
MANY_DEVICES_UNIT = "::many-devices"  # the suffix of a file's multi-device work unit

# Files that name meshes, pmap or shard_map but need no devices of their own process:
# tests/test_scheduling.py checks that every other such file is in `MULTI_DEVICE_FILES`.
ONE_DEVICE_IS_ENOUGH = {
    "test_configs.py": "pmap / shard_map / mesh sizes only as settings the validation refuses",
    "test_distill.py": "parallel='pmap' only as a setting distillation refuses",
    "test_multiprocess.py": "its train.py processes set their own XLA_FLAGS (4 devices each)",
    "test_host.py": "its one jax.devices() is in a subprocess without the suite's XLA_FLAGS",
    "test_flash_attention.py": "its loss curve trains on a one-device mesh (jax.devices()[:1])",
    "test_images.py": "its ViT train steps run on a one-device mesh (jax.devices()[:1])",
}


def devices_for_this_process() -> int:
    """Simulated CPU devices for this pytest process: 8, or 1 on the split's one-device workers."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if os.environ.get(SPLIT_ENV) == "1" and worker is not None and worker != MANY_DEVICE_WORKER:
        return 1
    return MANY_DEVICES


def file_rank(name: str) -> int:
    """A test file's place in the run: its `LONGEST_FIRST` index, or after all of them."""
    try:
        return LONGEST_FIRST.index(name)
    except ValueError:
        return len(LONGEST_FIRST)


def work_unit(nodeid: str) -> str:
    """The loadfile work unit of a test (``tests/test_x.py::test_y[p]``): its file, or, for a test
    listed in `MULTI_DEVICE_TESTS`, its file's multi-device unit (``tests/test_x.py::many-devices``)."""
    path, _, test = nodeid.partition("::")
    if test.split("[")[0] in MULTI_DEVICE_TESTS.get(os.path.basename(path), ()):
        return path + MANY_DEVICES_UNIT
    return path


def needs_many_devices(scope: str) -> bool:
    """Whether a work unit (`work_unit`) must run on the many-device worker."""
    return scope.endswith(MANY_DEVICES_UNIT) or os.path.basename(scope) in MULTI_DEVICE_FILES


def next_scope(scopes, many_devices: bool, one_device_workers: int = 1) -> str | None:
    """The work unit a worker takes next from the queue's ``scopes`` (longest first): the
    many-device worker its first multi-device unit if one is left, else the first unit (only
    while it is the one-device worker's sole helper: beside 2 or more, it takes nothing else); a
    one-device worker the first unit it can run, or None (it waits)."""
    fits = [s for s in scopes if needs_many_devices(s) == many_devices]
    if fits:
        return fits[0]
    return next(iter(scopes), None) if many_devices and one_device_workers < 2 else None


def make_device_split_scheduler(config, log):
    """xdist's file scheduler, with `MULTI_DEVICE_FILES` and `MULTI_DEVICE_TESTS` sent to ``gw0``
    only (and first there)."""
    from xdist.scheduler import LoadFileScheduling

    class DeviceSplitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            # xdist shuts every worker down once the queue is empty and all assigned work is
            # done, so a one-device worker left with nothing it can run just waits until then.
            scope = next_scope(list(self.workqueue), node.gateway.id == MANY_DEVICE_WORKER,
                               one_device_workers=len(self.nodes) - 1)
            if scope is None:
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return DeviceSplitScheduling(config, log)
