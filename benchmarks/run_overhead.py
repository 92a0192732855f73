"""What ``tfmem run`` costs a script: the same script with and without it, at the same time, on one core.

    python benchmarks/run_overhead.py                 # about 3 minutes on 2 cores
    python benchmarks/run_overhead.py --repeat 1 --epochs 2

Each workload runs as ``python script.py`` and as ``tfmem run script.py`` **at the same time,
pinned to the same core** (TensorFlow's and OpenMP's thread pools set to one thread), as
``suite_overhead.py`` does: whatever slows the core slows both alike. What is compared is the
total CPU time of each side (user + system, ``os.wait4``): ``tfmem run``'s includes its own
process (its start, the watchdog's thread), the script it runs and the agent's thread, so
it is what a user pays, wherever it is spent. Wall time is not: on a shared core the side with
more threads to run gets more of the core. The figures are the medians of the pairs'.

- ``keras``: a small Keras model trained for ``--epochs`` epochs (TensorFlow imported, its
  allocator read by the agent ten times a second, the tree by the watchdog every 50 ms);
- ``keras --kill-at``: the same with a ``--kill-at`` it never reaches (the watchdog reads
  every 20 ms);
- ``numpy``: NumPy arithmetic in a Python loop (the agent's thread competes for the GIL), a
  second or so: ``tfmem run``'s own start is most of its difference.

It also prints what the agent adds to the script's own peak: the high-water mark of a script
that only imports NumPy, without and with ``tfmem run`` (from ``--report``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(REPOSITORY))

from benchmarks import pinned  # noqa: E402

for _variable in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

KERAS = """
import sys
import numpy as np
import tensorflow as tf
import keras

x = np.random.default_rng(0).random((4096, 64), dtype=np.float32)
y = x.sum(axis=1, keepdims=True)
model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(128, activation="relu"), keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(x, y, epochs=int(sys.argv[1]), batch_size=64, verbose=0)
"""

NUMPY = """
import sys
import numpy as np

total = 0.0
for step in range(int(sys.argv[1]) * 20000):
    block = np.full(1000, float(step))
    total += float(block.sum())
print(total > 0)
"""

PEAK = """
import numpy as np
for line in open("/proc/self/status"):
    if line.startswith("VmHWM:"):
        print(int(line.split()[1]) * 1024)
"""


def start(script: Path, args: list[str], with_tfmem: bool, core: int, report: Path | None = None,
          options: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    python_path = os.pathsep.join(filter(None, [str(REPOSITORY), os.environ.get("PYTHONPATH")]))
    environment = {**os.environ, "PYTHONPATH": python_path, "TF_CPP_MIN_LOG_LEVEL": "3"}
    tfmem = [sys.executable, "-m", "pytest_tfmem.cli.main", "run", "--results", str(script.parent / "results.jsonl")]
    if report is not None:
        tfmem += ["--report", str(report)]
    tfmem += options
    command = [*(tfmem if with_tfmem else [sys.executable]), str(script), *args]
    return pinned.popen(command, core, cwd=script.parent, env=environment, stdout=subprocess.PIPE,
                        stderr=subprocess.DEVNULL)


def cpu_pair(script: Path, args: list[str], core: int, options: tuple[str, ...] = ()) -> tuple[float, float]:
    """CPU seconds of the script without and with ``tfmem run OPTIONS``, run together on ``core``."""
    started = {start(script, args, with_tfmem, core, options=options).pid: with_tfmem for with_tfmem in (False, True)}
    seconds: dict[bool, float] = {}
    while started:
        ended = pinned.wait_any()
        with_tfmem = started.pop(ended.pid)
        if ended.exit_code != 0:
            side = "with" if with_tfmem else "without"
            raise RuntimeError(f"{script.name} {side} tfmem run failed ({ended.exit_code})")
        seconds[with_tfmem] = ended.cpu_s
    return seconds[False], seconds[True]


def agent_peak(directory: Path) -> tuple[int, int]:
    """A NumPy-importing script's own high-water mark without and with ``tfmem run``."""
    script = directory / "peak.py"
    script.write_text(PEAK)
    plain = start(script, [], False, 0)
    without = int((plain.communicate()[0] or b"0").split()[-1])
    report = directory / "peak.json"
    start(script, [], True, 0, report).communicate()
    data = json.loads(report.read_text())
    return without, data["high_water_marks"][str(data["script_pid"])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="pairs per workload (default 3)")
    parser.add_argument("--epochs", type=int, default=6, help="size of each workload (default 6)")
    parser.add_argument("--core", type=int, default=0, help="the core both sides run on (default 0)")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tfmem-run-bench-") as folder:
        directory = Path(folder)
        print(f"{'workload':<16} {'without s':>10} {'with s':>10} {'ratio':>7}   (CPU seconds of each side, median "
              f"of {options.repeat} pairs on core {options.core})")
        workloads = (("keras", KERAS, ()), ("keras --kill-at", KERAS, ("--kill-at", "64GiB")), ("numpy", NUMPY, ()))
        for name, code, tfmem_options in workloads:
            script = directory / f"workload_{name.split()[0]}.py"  # not keras.py: it would shadow the package
            script.write_text(code)
            arguments = [str(options.epochs)]
            pairs = [cpu_pair(script, arguments, options.core, tfmem_options) for _ in range(options.repeat)]
            ratio = statistics.median(with_ / without for without, with_ in pairs)
            without_s = statistics.median(without for without, _ in pairs)
            with_s = statistics.median(with_ for _, with_ in pairs)
            print(f"{name:<16} {without_s:>10.2f} {with_s:>10.2f} {ratio:>7.3f}", flush=True)
        without, with_agent = agent_peak(directory)
        print(f"a script importing NumPy: high-water mark {without / 2**20:.1f} MiB without, "
              f"{with_agent / 2**20:.1f} MiB with tfmem run's agent (+{(with_agent - without) / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
