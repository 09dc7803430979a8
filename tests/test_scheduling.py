"""`make test`'s device split (tests/scheduling.py): which files (or which of their tests) need 8
simulated devices, which worker takes which work unit, and how many devices each pytest process gets."""

from __future__ import annotations

import ast
import pathlib
import re

import pytest
import scheduling
from scheduling import (
    LONGEST_FIRST,
    MULTI_DEVICE_FILES,
    MULTI_DEVICE_TESTS,
    ONE_DEVICE_IS_ENOUGH,
    SPLIT_ENV,
    devices_for_this_process,
    next_scope,
    work_unit,
)

TESTS = pathlib.Path(__file__).parent
# What a test needs more than one device in its own process for: meshes, pmap, shard_map,
# shardings, the device list.
USES_DEVICES = re.compile(r"make_mesh\(|jax\.devices\(\)|device_count\(\)|shard_map|pmap|"
                          r"NamedSharding|local_devices")


def test_every_file_that_uses_devices_runs_on_the_many_device_worker():
    using = {p.name for p in TESTS.glob("test_*.py")
             if p.name != "test_scheduling.py" and USES_DEVICES.search(p.read_text())}
    unlisted = using - MULTI_DEVICE_FILES - set(MULTI_DEVICE_TESTS) - set(ONE_DEVICE_IS_ENOUGH)
    assert not unlisted, (f"{sorted(unlisted)} use meshes or devices: add them to "
                          "tests/scheduling.py's MULTI_DEVICE_FILES or MULTI_DEVICE_TESTS (or "
                          "ONE_DEVICE_IS_ENOUGH, saying why)")


def device_tests(path: pathlib.Path) -> set[str]:
    """The test functions of a file whose source, or that of a module-level function they call
    (at any depth), uses devices (`USES_DEVICES`)."""
    source = path.read_text()
    functions = {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}
    calls = {name: {c.id for c in ast.walk(f) if isinstance(c, ast.Name) and c.id in functions}
             for name, f in functions.items()}
    using = {n for n, f in functions.items() if USES_DEVICES.search(ast.get_source_segment(source, f))}
    while grown := {n for n in functions if n not in using and calls[n] & using}:
        using |= grown
    return {n for n in using if n.startswith("test_")}


@pytest.mark.parametrize("name", sorted(MULTI_DEVICE_TESTS))
def test_the_multi_device_tests_of_a_split_file_are_all_listed(name):
    """A file split between the workers lists exactly its tests that use devices: one left out
    would run on one device (failing, or passing vacuously), one listed in vain costs the 8-device
    worker time."""
    assert device_tests(TESTS / name) == set(MULTI_DEVICE_TESTS[name])


def test_a_split_file_has_no_module_fixture_the_two_units_would_both_build():
    for name, tests in MULTI_DEVICE_TESTS.items():
        tree = ast.parse((TESTS / name).read_text())
        shared = {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and any(
            "scope=" in ast.unparse(d) for d in n.decorator_list)}
        for f in tree.body:
            if isinstance(f, ast.FunctionDef) and f.name in tests:
                assert not {a.arg for a in f.args.args} & shared, (name, f.name)


def test_listed_files_exist():
    names = {p.name for p in TESTS.glob("test_*.py")}
    for listed in (MULTI_DEVICE_FILES, set(MULTI_DEVICE_TESTS), set(ONE_DEVICE_IS_ENOUGH),
                   set(LONGEST_FIRST)):
        assert listed <= names, sorted(listed - names)
    assert not MULTI_DEVICE_FILES & set(ONE_DEVICE_IS_ENOUGH)
    assert not set(MULTI_DEVICE_TESTS) & (MULTI_DEVICE_FILES | set(ONE_DEVICE_IS_ENOUGH))


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
    # beside two one-device workers (`pytest -n 3`), it runs only what needs its devices
    assert next_scope(queue, many_devices=True, one_device_workers=2) == f"tests/{many[0]}"
    assert next_scope([one], many_devices=True, one_device_workers=2) is None
    assert next_scope([], many_devices=True) is None


def test_work_units_are_files_but_a_split_files_multi_device_tests():
    file, test = next(iter(MULTI_DEVICE_TESTS.items()))
    assert work_unit("tests/test_losses.py::test_x[a-b]") == "tests/test_losses.py"
    assert work_unit(f"tests/{file}::{test[0]}[p::q]") == f"tests/{file}::many-devices"
    assert work_unit(f"tests/{file}::test_not_listed") == f"tests/{file}"
    assert scheduling.needs_many_devices(work_unit(f"tests/{file}::{test[0]}"))
    assert not scheduling.needs_many_devices(work_unit(f"tests/{file}::test_not_listed"))
