"""The NVML probe, with a fake ``pynvml`` (this machine has no GPU) behind the real interface,
and the plugin's NVML views, GPU budgets and notes in real pytest runs."""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time
from pathlib import Path

import pynvml
import pytest
from conftest import dump_records, dumped_records
from fake_nvml import FakeGpu, FakeNvml, NVMLError_DriverNotLoaded, NVMLError_GpuIsLost

from pytest_tfmem.core.measure import PeakTracker
from pytest_tfmem.probes.nvml import Nvml, NvmlSampler, process_sources

GiB = 2**30
ME = os.getpid()
OTHER = ME + 1000


def test_the_fake_has_only_names_and_errors_of_the_real_pynvml():
    helpers = {"hold", "take", "release", "fail_next", "gpus", "init_error", "initialised", "calls"}
    names = {name for name, _ in inspect.getmembers(FakeNvml) if not name.startswith("_")} - helpers
    assert names, "the fake exposes nothing"
    missing = sorted(name for name in names if not hasattr(pynvml, name))
    assert missing == []
    for name in names:
        if name.startswith("NVMLError_"):
            assert issubclass(getattr(pynvml, name), pynvml.NVMLError)
            assert getattr(pynvml, name).__name__ == getattr(FakeNvml, name).__name__


def open_fake(gpus: list[FakeGpu], **kwargs) -> tuple[FakeNvml, Nvml]:
    fake = FakeNvml(gpus, **kwargs)
    nvml, reason = Nvml.open(fake)
    assert nvml is not None, reason
    return fake, nvml


def test_several_devices_read_this_process_and_each_device_separately():
    fake, nvml = open_fake(
        [
            FakeGpu("Fake A100", 40 * GiB, other_used=GiB, processes={ME: 3 * GiB, OTHER: 5 * GiB}),
            FakeGpu("Fake A100", 40 * GiB, processes={OTHER: 7 * GiB}),
            FakeGpu("Fake H100", 80 * GiB, processes={ME: GiB // 2}, graphics_supported=False),
        ]
    )
    assert nvml.device_count == 3
    assert [nvml.process_memory(i) for i in range(3)] == [3 * GiB, 0, GiB // 2]
    devices = nvml.devices()
    assert [(d.index, d.name, d.total, d.used) for d in devices] == [
        (0, "Fake A100", 40 * GiB, 9 * GiB),
        (1, "Fake A100", 40 * GiB, 7 * GiB),
        (2, "Fake H100", 80 * GiB, GiB // 2),
    ]
    nvml.close()
    assert fake.initialised == 0


def test_a_process_not_listed_on_a_gpu_reads_zero_there():
    _, nvml = open_fake([FakeGpu("Fake T4", 16 * GiB, processes={OTHER: 2 * GiB})])
    (source,) = process_sources(nvml)
    tracker = PeakTracker(source)
    window = tracker.open()
    reading = tracker.close(window)
    assert (reading.view, reading.start, reading.peak, reading.end) == ("nvml:0", 0, 0, 0)
    assert source.problem == ""


def test_a_window_sees_what_this_process_took_and_gave_back():
    fake, nvml = open_fake([FakeGpu("Fake T4", 16 * GiB)])
    (source,) = process_sources(nvml)
    tracker = PeakTracker(source)
    fake.hold(0, ME, GiB)
    window = tracker.open()
    fake.hold(0, ME, 3 * GiB)
    assert tracker.peek(window).peak == 3 * GiB
    fake.hold(0, ME, 2 * GiB)
    reading = tracker.close(window)
    assert (reading.start, reading.peak, reading.end, reading.increase) == (GiB, 3 * GiB, 2 * GiB, 2 * GiB)


def wait_for_calls(fake: FakeNvml, more: int) -> None:
    target = fake.calls + more
    deadline = time.monotonic() + 10
    while fake.calls < target:
        assert time.monotonic() < deadline, "the sampler made no readings"
        time.sleep(0.001)


@pytest.mark.parametrize("sampled", [False, True], ids=["edges only", "with sampler"])
def test_a_peak_between_the_window_edges_is_seen_only_with_the_sampler(sampled: bool):
    fake, nvml = open_fake([FakeGpu("Fake T4", 16 * GiB)])
    sources = process_sources(nvml)
    sampler = NvmlSampler(sources, interval_s=0.001).start() if sampled else None
    try:
        tracker = PeakTracker(sources[0])
        window = tracker.open()
        fake.hold(0, ME, 4 * GiB)
        if sampler:
            wait_for_calls(fake, 2)
        else:
            time.sleep(0.01)
        fake.release(0, ME)
        reading = tracker.close(window)
    finally:
        if sampler:
            sampler.stop()
    assert reading.peak == (4 * GiB if sampled else 0)
    assert reading.end == 0


def test_usedGpuMemory_not_reported_keeps_the_last_reading_and_says_why():
    fake, nvml = open_fake([FakeGpu("Fake T4", 16 * GiB, processes={ME: GiB})])
    (source,) = process_sources(nvml)
    assert source.current() == GiB
    fake.hold(0, ME, None)
    assert nvml.process_memory(0) is None
    assert source.current() == GiB
    assert "without its memory (usedGpuMemory unavailable" in source.problem


def test_an_nvml_error_while_reading_keeps_the_last_reading_and_says_why():
    fake, nvml = open_fake([FakeGpu("Fake T4", 16 * GiB, processes={ME: GiB})])
    (source,) = process_sources(nvml)
    source.reset_peak()
    fake.fail_next(NVMLError_GpuIsLost)
    assert source.current() == GiB
    assert source.problem == "NVML failed on GPU 0: GPU is lost (NVMLError_GpuIsLost)"


def test_nvml_init_failure_gives_a_one_line_reason_not_an_exception():
    nvml, reason = Nvml.open(FakeNvml([FakeGpu("Fake T4", 16 * GiB)], init_error=NVMLError_DriverNotLoaded))
    assert nvml is None
    assert reason == "NVML could not start: Driver Not Loaded (NVMLError_DriverNotLoaded)"


def test_no_gpu_at_all():
    fake = FakeNvml([])
    assert Nvml.open(fake) == (None, "NVML sees no GPU")
    assert fake.initialised == 0  # shut down again


def test_nvidia_ml_py_not_installed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    assert Nvml.open() == (None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)")


def test_the_real_nvml_on_this_machine_opens_or_explains():
    nvml, reason = Nvml.open()
    if nvml is None:  # this project's machines: no driver library
        assert reason.startswith(("NVML could not start: ", "NVML could not list", "NVML sees no GPU")), reason
        assert "\n" not in reason
    else:
        assert nvml.device_count >= 1 and reason == ""
        assert all(d.total > 0 for d in nvml.devices())
        nvml.close()


def test_readings_from_two_threads_do_not_lose_the_peak():
    fake, nvml = open_fake([FakeGpu("Fake T4", 16 * GiB)])
    (source,) = process_sources(nvml)
    fake.hold(0, ME, 5 * GiB)
    threads = [threading.Thread(target=lambda: [source.read() for _ in range(200)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    fake.release(0, ME)
    assert source.peak() == 5 * GiB and source.current() == 0


def test_a_reading_taken_before_a_reset_does_not_count_in_the_next_window(monkeypatch: pytest.MonkeyPatch):
    """A sampler thread that read the previous window's level and lost the CPU before folding it
    in must not hand that level to the window opened meanwhile."""
    fake, nvml = open_fake([FakeGpu("Fake T4", 16 * GiB)])
    (source,) = process_sources(nvml)
    fake.hold(0, ME, 5 * GiB)
    taken, reset = threading.Event(), threading.Event()
    list_processes = fake.nvmlDeviceGetComputeRunningProcesses

    def held_after_reading(handle: FakeGpu) -> list:
        processes = list_processes(handle)
        if threading.current_thread().name == "held reader":
            taken.set()
            reset.wait(5)
        return processes

    monkeypatch.setattr(fake, "nvmlDeviceGetComputeRunningProcesses", held_after_reading)
    reader = threading.Thread(target=source.read, name="held reader")
    reader.start()
    assert taken.wait(5)
    fake.release(0, ME)
    source.reset_peak()
    reset.set()
    reader.join()
    assert source.peak() == 0


# -- the plugin, in a subprocess whose ``pynvml`` is the fake ---------------------------------

FAKE_PYNVML = """
from fake_nvml import FakeGpu, FakeNvml, {error}
_fake = FakeNvml(
    [FakeGpu("Fake A100", 40 * 2**30, other_used=2**30), FakeGpu("Fake A100", 40 * 2**30, graphics_supported=False)],
    init_error={init_error},
)

def __getattr__(name):
    return getattr(_fake, name)
"""

GPU_TESTS = """
import os
import time
import pynvml
import pytest

from pytest_tfmem import GpuBudgetExceeded

GiB = 2**30

def test_takes_3GiB_on_gpu_1_for_a_moment():
    pynvml.hold(1, os.getpid(), 3 * GiB)
    time.sleep(0.3)
    pynvml.release(1, os.getpid())

@pytest.mark.xfail(raises=GpuBudgetExceeded, strict=True)
@pytest.mark.tfmem(gpu_budget="1GiB")
def test_keeps_2GiB_on_gpu_0():
    pynvml.take(0, os.getpid(), 2 * GiB)

def test_uses_no_gpu():
    pass

@pytest.mark.tfmem(gpu_budget=None)
def test_exempt():
    pynvml.hold(1, os.getpid(), 6 * GiB)
    time.sleep(0.3)
    pynvml.release(1, os.getpid())
"""


def use_fake_pynvml(pytester: pytest.Pytester, init_error: str = "None") -> None:
    pytester.makepyfile(fake_nvml=(Path(__file__).parent / "fake_nvml.py").read_text())
    pytester.makepyfile(pynvml=FAKE_PYNVML.format(init_error=init_error, error=init_error if init_error != "None" else "NVMLError"))


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_gpu_budget_on_nvml_views_fails_as_its_own_test(pytester: pytest.Pytester, workers: list[str]):
    use_fake_pynvml(pytester)
    pytester.makepyfile(test_gpu=GPU_TESTS)
    junit = pytester.path / "junit.xml"
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--junitxml={junit}", *dump_records(pytester.path), "--tfmem-gpu-budget=2GiB", "--tfmem-nvml-interval=0.005",
        *workers,
    )
    result.assert_outcomes(passed=2, failed=1, xfailed=1)
    result.stdout.fnmatch_lines(
        [
            "tfmem: GPU peak 3.0 GiB > GPU budget 2.0 GiB (GPU 0 (NVML) 0 B, GPU 1 (NVML) 3.0 GiB); "
            "NVML sampled every 5 ms: a shorter peak can be missed",
            # no framework's view: no framework's column
            "test * peak * host RSS  NVML GPU (every 5 ms)  budget  use  GPU budget  GPU use * result",
            "test_gpu.py::test_takes_3GiB_on_gpu_1_for_a_moment * 3.0 GiB * - * 2.0 GiB * 150%  over GPU budget",
        ]
    )
    assert "no GPU views" not in result.stdout.str()
    records = dumped_records(pytester.path)
    moment = records["test_takes_3GiB_on_gpu_1_for_a_moment"].measurement
    # Seen by the sampler: the 3 GiB were given back before the test ended.
    assert (moment.view("nvml:1").peak, moment.view("nvml:1").end) == (3 * GiB, 0)
    # GPU views never enter the host peak.
    assert moment.peak == max(moment.host, moment.tf_host) < 100 * 2**20
    exempt = records["test_exempt"]
    assert exempt.measurement.view("nvml:1").increase == 6 * GiB
    assert [v for v in exempt.verdicts if v.check == "gpu_budget"] == []  # gpu_budget=None: not checked
    kept = records["test_keeps_2GiB_on_gpu_0"]
    assert [(v.check, v.ok, v.message) for v in kept.verdicts if v.check == "gpu_budget"] == [
        (
            "gpu_budget",
            False,
            "GPU peak 2.0 GiB > GPU budget 1.0 GiB (GPU 0 (NVML) 2.0 GiB, GPU 1 (NVML) 0 B); "
            "NVML sampled every 5 ms: a shorter peak can be missed",
        )
    ]
    assert (kept.gpu_budget, moment_record_budget(records)) == (GiB, 2 * GiB)  # the marker's, the option's
    assert exempt.gpu_budget is None
    devices = records["test_uses_no_gpu"].extra["gpu"]["devices"]
    assert [(d["index"], d["name"], d["total"]) for d in devices] == [(0, "Fake A100", 40 * GiB), (1, "Fake A100", 40 * GiB)]


def moment_record_budget(records: dict) -> int | None:
    return records["test_takes_3GiB_on_gpu_1_for_a_moment"].gpu_budget


def test_nvml_read_only_at_the_edges_says_so(pytester: pytest.Pytester):
    use_fake_pynvml(pytester)
    pytester.makepyfile(test_gpu=GPU_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfmem-gpu-budget=2GiB", "--tfmem-nvml-interval=0", "-k", "moment or keeps"
    )
    # Read only at the edges, the 3 GiB held in between are not seen: the column says how NVML was read.
    result.assert_outcomes(passed=1, xfailed=1)
    result.stdout.fnmatch_lines(["test * NVML GPU (start/end)  budget  use  GPU budget  GPU use * result"])


def test_nvml_init_failure_leaves_one_note_and_passes(pytester: pytest.Pytester):
    use_fake_pynvml(pytester, init_error="NVMLError_DriverNotLoaded")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.tfmem(gpu_budget="1GB")
        def test_one():
            pass

        @pytest.mark.tfmem
        def test_two():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    lines = [line for line in result.outlines if line.startswith("tfmem: ")]
    assert lines == [
        "tfmem: no GPU views: NVML could not start: Driver Not Loaded (NVMLError_DriverNotLoaded)",
        "tfmem: GPU budget not checked in 1 test(s): no GPU memory view",
    ]
    assert "NVML GPU" not in result.stdout.str()


def test_a_machine_without_nvml_says_so_in_one_line(pytester: pytest.Pytester):
    """The real ``pynvml`` on this machine (no driver library): a note once a GPU option is
    given (here the NVML interval), no NVML column; without a GPU option, no note."""
    nvml, reason = Nvml.open()
    if nvml is not None:
        nvml.close()
        pytest.skip("this machine has a GPU")
    pytester.makepyfile("import pytest\n\n@pytest.mark.tfmem\ndef test_one():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-nvml-interval=0.05")
    result.assert_outcomes(passed=1)
    assert [line for line in result.outlines if "no GPU views" in line] == [f"tfmem: no GPU views: {reason}"]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert not [line for line in result.outlines if "no GPU views" in line or "NVML" in line]


ISOLATED_GPU_TESTS = """
import os
import time
import unittest

import pynvml

GiB = 2**30


def test_function_takes_3GiB_on_gpu_1():
    pynvml.hold(1, os.getpid(), 3 * GiB)
    time.sleep(0.2)
    pynvml.release(1, os.getpid())


class GpuTest(unittest.TestCase):
    def test_method_keeps_3GiB_on_gpu_0(self):
        pynvml.take(0, os.getpid(), 3 * GiB)
"""


def test_gpu_views_are_opened_in_each_isolated_fork(pytester: pytest.Pytester):
    """The session opens no NVML handle before it forks its template; each isolated test's fork
    opens its own and is matched by its own pid (a function and a TestCase method)."""
    use_fake_pynvml(pytester)
    pytester.makepyfile(test_gpu=ISOLATED_GPU_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--tfmem-isolate", "--tfmem-gpu-budget=2GiB", "--tfmem-nvml-interval=0.005"
    )
    result.assert_outcomes(failed=2)
    result.stdout.no_fnmatch_line("*IsolationStartWarning*")  # forks, not spawned interpreters
    result.stdout.fnmatch_lines(["*GPU peak 3.0 GiB > GPU budget 2.0 GiB (GPU 0 (NVML) 0 B, GPU 1 (NVML) 3.0 GiB)*"])
    result.stdout.fnmatch_lines(["*GPU peak 3.0 GiB > GPU budget 2.0 GiB (GPU 0 (NVML) 3.0 GiB, GPU 1 (NVML) 0 B)*"])
    result.stdout.fnmatch_lines(["*tfmem: isolated tests*"])
