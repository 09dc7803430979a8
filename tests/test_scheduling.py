"""`make test`'s device split (tests/scheduling.py): which files need 8 simulated devices, which
worker takes which file, and how many devices each pytest process gets."""

from __future__ import annotations

import pathlib
import re

import pytest
import scheduling
from scheduling import (
    LONGEST_FIRST,
    MULTI_DEVICE_FILES,
    ONE_DEVICE_IS_ENOUGH,
    SPLIT_ENV,
    devices_for_this_process,
    next_scope,
)

TESTS = pathlib.Path(__file__).parent
# What a test needs more than one device in its own process for: meshes, pmap, shard_map,
# shardings, the device list.
USES_DEVICES = re.compile(r"make_mesh\(|jax\.devices\(\)|device_count\(\)|shard_map|pmap|"
                          r"NamedSharding|local_devices")


def test_every_file_that_uses_devices_runs_on_the_many_device_worker():
    using = {p.name for p in TESTS.glob("test_*.py")
             if p.name != "test_scheduling.py" and USES_DEVICES.search(p.read_text())}
    unlisted = using - MULTI_DEVICE_FILES - set(ONE_DEVICE_IS_ENOUGH)
    assert not unlisted, (f"{sorted(unlisted)} use meshes or devices: add them to "
                          "tests/scheduling.py's MULTI_DEVICE_FILES (or ONE_DEVICE_IS_ENOUGH, "
                          "saying why)")


def test_listed_files_exist():
    names = {p.name for p in TESTS.glob("test_*.py")}
    for listed in (MULTI_DEVICE_FILES, set(ONE_DEVICE_IS_ENOUGH), set(LONGEST_FIRST)):
        assert listed <= names, sorted(listed - names)
    assert not MULTI_DEVICE_FILES & set(ONE_DEVICE_IS_ENOUGH)


@pytest.mark.parametrize(("split", "worker", "devices"), [
    (None, None, 8), (None, "gw1", 8), ("1", None, 8), ("1", "gw0", 8), ("1", "gw1", 1),
    ("1", "gw3", 1), ("0", "gw1", 8)])
def test_devices_per_process(monkeypatch, split, worker, devices):
    for name, value in ((SPLIT_ENV, split), ("PYTEST_XDIST_WORKER", worker)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert devices_for_this_process() == devices


def test_next_scope_sends_multi_device_files_to_the_many_device_worker_first():
    many, one = sorted(MULTI_DEVICE_FILES)[:2], "tests/test_losses.py"
    assert not scheduling.needs_many_devices(one)
    queue = [one, f"tests/{many[0]}", "tests/test_masks.py", f"tests/{many[1]}"]
    assert next_scope(queue, many_devices=True) == f"tests/{many[0]}"
    assert next_scope(queue, many_devices=False) == one
    assert next_scope([f"tests/{m}" for m in many], many_devices=False) is None  # it waits
    assert next_scope([one], many_devices=True) == one  # then takes anything
    assert next_scope([], many_devices=True) is None
