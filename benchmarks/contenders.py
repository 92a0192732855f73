"""The contenders: how each memory tool is switched on for a workload's pytest run.

Every workload runs as a real ``pytest`` process with plugin auto-loading off
(``PYTEST_DISABLE_PLUGIN_AUTOLOAD``), so each process holds exactly one contender's plugin,
loaded with ``-p``, and no other installed plugin adds to its start-up. A contender is those
arguments and its environment; ``bench_plugin`` reads ``TFMEM_BENCH_CONTENDER`` in that
process to know which figure to record.
"""

from __future__ import annotations

from dataclasses import dataclass

# A budget no workload comes near: the tfmem contender measures every test, never fails one.
UNREACHED_BUDGET = "64GB"
# pytest-memray's per-location leak limit, the value its documentation shows.
MEMRAY_LEAK_LIMIT = "1 MB"
TFMEM_PLUGIN = ("-p", "pytest_tfmem.plugin")
MEMRAY_PLUGIN = ("-p", "pytest_memray.plugin")


@dataclass(frozen=True)
class Contender:
    key: str  # TFMEM_BENCH_CONTENDER in the workload process
    label: str  # column or row heading in the tables
    pytest_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


NO_PLUGIN = Contender("none", "no plugin", ())
TFMEM = Contender("tfmem", "pytest-tfmem", (*TFMEM_PLUGIN, f"--tfmem-budget={UNREACHED_BUDGET}"))
MEMRAY = Contender("memray", "pytest-memray `limit_memory`", MEMRAY_PLUGIN)
MPROF_SLOW = Contender("mprof-0.1", "memory_profiler 0.1 s", (), (("TFMEM_BENCH_INTERVAL", "0.1"),))
MPROF_FAST = Contender("mprof-0.01", "memory_profiler 0.01 s", (), (("TFMEM_BENCH_INTERVAL", "0.01"),))

# Peak-memory contenders, in table column order.
PEAK_CONTENDERS = (NO_PLUGIN, TFMEM, MEMRAY, MPROF_SLOW, MPROF_FAST)
MEASURING_CONTENDERS = PEAK_CONTENDERS[1:]

# Leak-check contenders: pytest-tfmem's leak check at its default threshold and at a tight
# one, pytest-memray's ``limit_leaks``, and TensorFlow's object-count approach written by hand.
LEAK_TFMEM_DEFAULT = Contender(
    "tfmem-leak", "pytest-tfmem leak check, max_growth 1MB (default)", TFMEM_PLUGIN,
    (("TFMEM_BENCH_MAX_GROWTH", "1MB"),),
)
LEAK_TFMEM_TIGHT = Contender(
    "tfmem-leak", "pytest-tfmem leak check, max_growth 100KB", TFMEM_PLUGIN,
    (("TFMEM_BENCH_MAX_GROWTH", "100KB"),),
)
LEAK_MEMRAY = Contender("memray-leaks", f"pytest-memray `limit_leaks(\"{MEMRAY_LEAK_LIMIT}\")`", MEMRAY_PLUGIN)
LEAK_OBJECTS = Contender("object-count", "object count by type (TF's approach, by hand)", ())
LEAK_CONTENDERS = (LEAK_TFMEM_DEFAULT, LEAK_TFMEM_TIGHT, LEAK_MEMRAY, LEAK_OBJECTS)

# Isolation: the same tests in-process and each in a fresh interpreter.
IN_PROCESS = Contender("tfmem", "pytest-tfmem in-process", TFMEM.pytest_args)
ISOLATED = Contender("tfmem", "pytest-tfmem `--tfmem-isolate`", (*TFMEM.pytest_args, "--tfmem-isolate"))
ISOLATION_CONTENDERS = (IN_PROCESS, ISOLATED)
