"""The reference peak of one workload test, measured alone in a fresh interpreter.

``python -m benchmarks.reference WORKLOAD.py TEST_NAME`` imports the workload module (and
so TensorFlow, if it uses it, whose runtime is then started with one tiny op), returns freed
heap to the OS, resets the kernel's high-water mark of resident memory, calls the test
function once and prints ``{"peak": bytes}``: the high-water mark minus the RSS before the
call. Nothing ran before in this process, so no earlier test's memory can hide any of it.
It uses no pytest and no pytest-tfmem code: it is the yardstick, not a contender.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import importlib.util
import json
import sys
from pathlib import Path


def _status_bytes(key: str) -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} missing from /proc/self/status")


def reference_peak(workload: Path, test_name: str) -> int:
    spec = importlib.util.spec_from_file_location(workload.stem, workload)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if "tensorflow" in sys.modules:  # start TF's runtime, as any earlier TF code would have
        tf = sys.modules["tensorflow"]
        tf.reduce_sum(tf.ones((8, 8))).numpy()
    gc.collect()
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
        clear_refs.write("5")
    start = _status_bytes("VmRSS")
    getattr(module, test_name)()
    return _status_bytes("VmHWM") - start


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m benchmarks.reference WORKLOAD.py TEST_NAME", file=sys.stderr)
        return 2
    print(json.dumps({"peak": reference_peak(Path(argv[0]), argv[1])}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
