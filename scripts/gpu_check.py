"""Check pytest-tfmem's NVML probe against a real GPU allocation.

    python scripts/gpu_check.py [--size 1GiB] [--tolerance 0.05]

Where a GPU and PyTorch or CuPy are present: allocates ``--size`` on the GPU, and checks
that the NVML probe (``pytest_tfmem/probes/nvml.py``) sees this process's memory grow by
that much, within the tolerance, both as a reading and as the peak of a measurement window
with the sampler running. Exit status 0 when it does, 1 when it does not. Elsewhere (no
PyTorch/CuPy, or no GPU) it prints ``SKIPPED: <why>`` and exits 0.

The probe's folder is loaded on its own, so neither pytest nor this package needs installing.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

PROBES = Path(__file__).resolve().parent.parent / "pytest_tfmem" / "probes"
GiB = 2**30
SIZES = {"mib": 2**20, "gib": 2**30, "mb": 10**6, "gb": 10**9}


def load_probe() -> ModuleType:
    """``probes/nvml.py`` (and the ``sampler`` it imports) as a package of their own, without
    ``pytest_tfmem`` and its dependencies."""
    spec = importlib.util.spec_from_file_location(
        "tfmem_probes", PROBES / "__init__.py", submodule_search_locations=[str(PROBES)]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package  # its modules are found through it
    spec.loader.exec_module(package)
    return importlib.import_module("tfmem_probes.nvml")


def parse_size(text: str) -> int:
    lowered = text.strip().lower()
    for unit, factor in SIZES.items():
        if lowered.endswith(unit):
            return int(float(lowered[: -len(unit)]) * factor)
    return int(lowered)


class Framework:
    """A GPU framework that takes device memory and gives it all back to the driver."""

    def __init__(self, name: str, new_block: Callable[[int], Any], empty_cache: Callable[[], None]) -> None:
        self.name = name
        self._new_block = new_block
        self._empty_cache = empty_cache
        self._blocks: list[Any] = []

    def allocate(self, nbytes: int) -> None:
        self._blocks.append(self._new_block(nbytes))

    def release(self) -> None:
        self._blocks.clear()
        self._empty_cache()


def find_framework() -> tuple[Framework | None, str]:
    """PyTorch, else CuPy, with a usable GPU; or the reason there is none."""
    reasons = []
    try:
        import torch
    except ImportError:
        reasons.append("PyTorch is not installed")
    else:
        if torch.cuda.is_available():
            def torch_block(nbytes: int) -> Any:
                block = torch.ones(nbytes, dtype=torch.uint8, device="cuda:0")  # written, so really backed
                torch.cuda.synchronize()
                return block

            # empty_cache: from PyTorch's caching allocator back to the driver
            return Framework(f"PyTorch {torch.__version__}", torch_block, torch.cuda.empty_cache), ""
        reasons.append("PyTorch sees no GPU")
    try:
        import cupy
    except ImportError:
        reasons.append("CuPy is not installed")
    else:
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except cupy.cuda.runtime.CUDARuntimeError:
            count = 0
        if count:
            def cupy_block(nbytes: int) -> Any:
                block = cupy.ones(nbytes, dtype=cupy.uint8)
                cupy.cuda.Device(0).synchronize()
                return block

            pool = cupy.get_default_memory_pool()
            return Framework(f"CuPy {cupy.__version__}", cupy_block, pool.free_all_blocks), ""
        reasons.append("CuPy sees no GPU")
    return None, "; ".join(reasons)


def check(
    framework: Framework, probe: ModuleType, size: int, tolerance: float, pynvml: Any = None
) -> tuple[bool, list[str]]:
    """Allocate ``size`` with ``framework``; compare with what the NVML probe reads."""
    nvml, reason = probe.Nvml.open(pynvml)
    if nvml is None:
        return False, [f"FAILED: a GPU is present but the NVML probe cannot read it: {reason}"]
    try:
        framework.allocate(1)  # the framework's context first: its memory is not what is checked
        framework.release()
        sources = probe.process_sources(nvml)
        before = [source.current() for source in sources]
        for source in sources:
            source.reset_peak()
        sampler = probe.NvmlSampler(sources, interval_s=0.005).start()
        framework.allocate(size)
        time.sleep(0.05)
        during = [source.current() for source in sources]
        framework.release()
        time.sleep(0.05)
        sampler.stop()
        peaks = [source.peak() for source in sources]
        devices = nvml.devices()
    finally:
        nvml.close()
    grown = [now - then for now, then in zip(during, before)]
    index = max(range(len(grown)), key=grown.__getitem__)
    seen, window = grown[index], peaks[index] - before[index]
    lines = [
        f"{framework.name}: allocated {size / GiB:.3f} GiB on its GPU 0",
        f"NVML GPU {index} ({devices[index].name}): "
        f"this process {before[index] / GiB:.3f} -> {during[index] / GiB:.3f} GiB (+{seen / GiB:.3f} GiB); "
        f"window peak +{window / GiB:.3f} GiB; "
        f"device used {devices[index].used / GiB:.3f} of {devices[index].total / GiB:.3f} GiB",
    ]
    problems = [source.problem for source in sources if source.problem]
    lines += [f"NVML: {problem}" for problem in problems]
    ok = all(abs(value - size) <= tolerance * size for value in (seen, window))
    if max(during) == 0:
        lines.append("NVML does not list this process on any GPU (another pid namespace, e.g. a container?)")
    within = f"within {tolerance:.0%} of the allocation"
    lines.append(f"OK: {within}" if ok else f"FAILED: not {within}")
    return ok, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1GiB", help="how much to allocate (default 1GiB)")
    parser.add_argument("--tolerance", type=float, default=0.05, help="allowed relative error (default 0.05)")
    arguments = parser.parse_args(argv)
    framework, reason = find_framework()
    if framework is None:
        print(f"SKIPPED: no GPU to check against ({reason})")
        return 0
    ok, lines = check(framework, load_probe(), parse_size(arguments.size), arguments.tolerance)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
