"""``scripts/gpu_check.py``: skips cleanly without a GPU; its check logic, on a fake GPU."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from fake_nvml import FakeGpu, FakeNvml

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"
GiB = 2**30


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The script's own search for a GPU framework, in a process of its own: it imports PyTorch, which
# must not come into this test's worker (TensorFlow's tests run there, traced in-process).
FIND_FRAMEWORK = """
import runpy, sys
framework, reason = runpy.run_path(sys.argv[1])["find_framework"]()
print(framework.name if framework is not None else "")
print(reason)
"""


def test_without_a_gpu_framework_the_script_skips_cleanly():
    found = subprocess.run([sys.executable, "-c", FIND_FRAMEWORK, str(SCRIPT)], capture_output=True, text=True,
                           timeout=120, check=True)  # fmt: skip
    framework, reason = found.stdout.splitlines()
    if framework:
        pytest.skip(f"this machine has a GPU ({framework}): run the script itself")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"SKIPPED: no GPU to check against ({reason})\n"


def fake_framework(gpu_check, fake: FakeNvml, seen_fraction: float):
    """A framework whose allocations the fake driver reports, at ``seen_fraction`` of their size."""
    held = {"bytes": 300 * 2**20}  # the framework's context, taken at its first allocation

    def new_block(nbytes: int) -> int:
        held["bytes"] += int(nbytes * seen_fraction)
        fake.hold(1, os.getpid(), held["bytes"])
        return nbytes

    def empty_cache() -> None:
        held["bytes"] = 300 * 2**20
        fake.hold(1, os.getpid(), held["bytes"])

    return gpu_check.Framework("FakeTorch", new_block, empty_cache)


@pytest.mark.parametrize(("seen_fraction", "ok"), [(1.0, True), (1.04, True), (0.9, False)])
def test_the_check_compares_the_probe_with_the_allocation(seen_fraction: float, ok: bool):
    gpu_check = load_script()
    fake = FakeNvml([FakeGpu("Fake H200", 140 * GiB), FakeGpu("Fake H200", 140 * GiB, other_used=GiB)])
    framework = fake_framework(gpu_check, fake, seen_fraction)
    passed, lines = gpu_check.check(framework, gpu_check.load_probe(), GiB, 0.05, pynvml=fake)
    assert passed is ok
    assert lines[0] == "FakeTorch: allocated 1.000 GiB on its GPU 0"
    assert lines[1].startswith(f"NVML GPU 1 (Fake H200): this process 0.293 -> {0.293 + seen_fraction:.3f} GiB")
    assert lines[-1] == ("OK: within 5% of the allocation" if ok else "FAILED: not within 5% of the allocation")
    assert fake.initialised == 0


def test_a_gpu_the_probe_cannot_read_fails_the_check():
    gpu_check = load_script()
    fake = FakeNvml([FakeGpu("Fake H200", 140 * GiB)], init_error=FakeNvml.NVMLError_NoPermission)
    passed, lines = gpu_check.check(fake_framework(gpu_check, fake, 1.0), gpu_check.load_probe(), GiB, 0.05, pynvml=fake)
    assert not passed
    assert lines == ["FAILED: a GPU is present but the NVML probe cannot read it: "
                     "NVML could not start: Insufficient Permissions (NVMLError_NoPermission)"]
