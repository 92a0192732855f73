"""GPU budgets on TensorFlow's GPU allocator views, and TF's GPU set-up (limit, memory growth).

This machine has no GPU: TensorFlow's GPU side is a small fake with the shape of
``tf.config`` (physical devices, logical device configuration, allocator statistics) that
raises what TensorFlow raises. The real TensorFlow is used where a CPU machine can show
the behaviour (the settings refused after initialisation, the run without GPUs).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import SimpleNamespace

import pytest

from pytest_tfmem.core.measure import Measurement, PeakTracker, ViewReading
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.frameworks import set_gpu_environment
from pytest_tfmem.frameworks.tensorflow import TensorFlow, allocator_sources
from pytest_tfmem.gpu.plugin import GpuFigures, check_gpu_budget, gpu_views

GiB = 2**30
MiB = 2**20

GROWTH_VARIABLE = "TF_FORCE_GPU_ALLOW_GROWTH"  # TensorFlow's, one of the variables a GPU option sets
PREALLOCATE_VARIABLE = "XLA_PYTHON_CLIENT_PREALLOCATE"  # JAX's


class FakeTensorFlow:
    """``tf.config`` of a machine with GPUs, as far as tfmem uses it."""

    class OpError(Exception):
        pass

    def __init__(self, gpus: int, initialised: bool = False) -> None:
        self.physical = [SimpleNamespace(name=f"/physical_device:GPU:{i}", device_type="GPU") for i in range(gpus)]
        self.initialised = initialised
        self.logical_configuration: dict[str, list] = {}
        self.stats = {"CPU:0": {"current": 0, "peak": 0}, **{f"GPU:{i}": {"current": 0, "peak": 0} for i in range(gpus)}}
        experimental = SimpleNamespace(get_memory_info=self.get_memory_info, reset_memory_stats=self.reset_memory_stats)
        self.config = SimpleNamespace(
            list_physical_devices=self.list_physical_devices,
            list_logical_devices=self.list_logical_devices,
            set_logical_device_configuration=self.set_logical_device_configuration,
            LogicalDeviceConfiguration=lambda memory_limit=None: SimpleNamespace(memory_limit=memory_limit),
            experimental=experimental,
        )
        self.errors = SimpleNamespace(OpError=self.OpError)

    def list_physical_devices(self, device_type: str) -> list:
        return [d for d in self.physical if d.device_type == device_type]

    def list_logical_devices(self) -> list:
        return [SimpleNamespace(name=f"/job:localhost/replica:0/task:0/device:{name}") for name in self.stats]

    def set_logical_device_configuration(self, device, configurations) -> None:
        if self.initialised:  # TensorFlow's own words
            raise RuntimeError("Virtual devices cannot be modified after being initialized")
        self.logical_configuration[device.name] = configurations

    def get_memory_info(self, device: str) -> dict[str, int]:
        return dict(self.stats[device])

    def reset_memory_stats(self, device: str) -> None:
        self.stats[device]["peak"] = self.stats[device]["current"]

    def allocate(self, device: str, nbytes: int) -> None:
        stats = self.stats[device]
        stats["current"] += nbytes
        stats["peak"] = max(stats["peak"], stats["current"])


def test_the_tf_allocator_probe_gives_a_view_per_gpu_and_windows_reset_per_test():
    tf = FakeTensorFlow(gpus=2)
    trackers = [PeakTracker(source) for source in allocator_sources(tf)]
    assert [t.source.name for t in trackers] == ["tf:CPU:0", "tf:GPU:0", "tf:GPU:1"]
    gpu0 = trackers[1]
    tf.allocate("GPU:0", 3 * GiB)  # an earlier test's peak, still 3 GiB held
    first = gpu0.open()
    tf.allocate("GPU:0", 2 * GiB)
    tf.allocate("GPU:0", -2 * GiB)
    reading = gpu0.close(first)
    assert (reading.start, reading.peak, reading.end, reading.increase) == (3 * GiB, 5 * GiB, 3 * GiB, 2 * GiB)
    second = gpu0.open()
    assert gpu0.close(second).increase == 0  # reset per test: the earlier peak is not carried over


def measurement(*views: tuple[str, int]) -> Measurement:
    return Measurement(tuple(ViewReading(name, 0, peak, 0) for name, peak in views), duration_s=0.1)


def test_gpu_budget_reads_tf_gpu_allocators_first():
    m = measurement(("host", 100 * MiB), ("tf:CPU:0", 50 * MiB), ("tf:GPU:0", 3 * GiB), ("tf:GPU:1", GiB), ("nvml:0", 4 * GiB))
    verdict = check_gpu_budget(m, 2 * GiB)
    assert verdict is not None and not verdict.ok
    assert verdict.check == "gpu_budget"
    assert verdict.message == "GPU peak 3.0 GiB > GPU budget 2.0 GiB (TF GPU:0 allocator 3.0 GiB, TF GPU:1 allocator 1.0 GiB)"
    assert check_gpu_budget(m, 3 * GiB).ok


def test_without_tf_gpu_views_the_gpu_budget_reads_nvml():
    m = measurement(("host", 100 * MiB), ("nvml:0", 512 * MiB), ("nvml:1", 0))
    assert gpu_views(m) == [("nvml:0", 512 * MiB), ("nvml:1", 0)]
    assert check_gpu_budget(m, GiB).message == "GPU peak 512.0 MiB <= GPU budget 1.0 GiB (GPU 0 (NVML) 512.0 MiB, GPU 1 (NVML) 0 B)"


def test_no_gpu_view_or_no_budget_means_no_gpu_verdict():
    assert check_gpu_budget(measurement(("host", GiB)), GiB) is None
    assert check_gpu_budget(measurement(("tf:GPU:0", GiB)), None) is None


def test_gpu_views_never_change_the_host_peak():
    host_only = measurement(("host", 100 * MiB), ("tf:CPU:0", 300 * MiB))
    with_gpus = measurement(("host", 100 * MiB), ("tf:CPU:0", 300 * MiB), ("tf:GPU:0", 8 * GiB), ("nvml:0", 9 * GiB))
    assert host_only.peak == with_gpus.peak == 300 * MiB
    assert (host_only.gpu, with_gpus.gpu) == (None, 8 * GiB)
    assert Measurement.from_dict(with_gpus.to_dict()) == with_gpus


def test_summary_notes_say_which_views_are_missing_and_why():
    def reason() -> str:
        return "nvidia-ml-py is not installed"

    host_only = TestRecord("t::a", measurement(("host", MiB)), extra={"gpu": {"unchecked_gpu_budget": GiB}})
    tf_gpu = TestRecord("t::b", measurement(("host", MiB), ("tf:GPU:0", GiB)))
    nvml = TestRecord("t::c", measurement(("nvml:0", GiB)), extra={"gpu": {"problems": ["NVML failed on GPU 0: GPU is lost"]}})
    assert GpuFigures.of([host_only]).notes(reason) == [
        "no GPU views: nvidia-ml-py is not installed",
        "GPU budget not checked in 1 test(s): no GPU memory view",
    ]
    assert GpuFigures.of([tf_gpu]).notes(reason) == ["no NVML views: nvidia-ml-py is not installed"]
    assert GpuFigures.of([tf_gpu, nvml, nvml]).notes(reason) == ["NVML failed on GPU 0: GPU is lost"]
    # Without a GPU option or GPU budget, no view is missing: nothing to explain.
    assert GpuFigures.of([tf_gpu]).notes(reason, views_note=False) == []
    assert GpuFigures.of([host_only]).held and not GpuFigures.of([tf_gpu, nvml]).held


def apply_gpu_limit(monkeypatch: pytest.MonkeyPatch, tf: FakeTensorFlow, runtime_started: bool, limit: int) -> str:
    """The TensorFlow module's limit, on the fake TensorFlow as the loaded one."""
    monkeypatch.setitem(sys.modules, "tensorflow", tf)
    return TensorFlow().limit_gpu_memory(limit, runtime_started)


def test_the_gpu_limit_goes_to_every_gpu_in_MiB(monkeypatch: pytest.MonkeyPatch):
    tf = FakeTensorFlow(gpus=2)
    assert apply_gpu_limit(monkeypatch, tf, runtime_started=False, limit=int(10e9)) == ""
    assert {name: [c.memory_limit for c in configs] for name, configs in tf.logical_configuration.items()} == {
        "/physical_device:GPU:0": [9536],  # 10 GB = 9536.7 MiB, rounded down
        "/physical_device:GPU:1": [9536],
    }


def test_the_gpu_limit_after_tf_initialised_its_gpus_is_not_applied_and_says_why(monkeypatch: pytest.MonkeyPatch):
    tf = FakeTensorFlow(gpus=1, initialised=True)
    problem = apply_gpu_limit(monkeypatch, tf, runtime_started=True, limit=2 * GiB)
    assert problem == (
        "TensorFlow had already initialised its GPUs (something ran a "
        "TF op before the first test, e.g. at import of a test module or conftest.py)"
    )
    assert tf.logical_configuration == {}


def test_a_gpu_limit_tensorflow_refuses_is_reported_with_its_words(monkeypatch: pytest.MonkeyPatch):
    tf = FakeTensorFlow(gpus=1, initialised=True)  # initialised, though tfmem was told otherwise
    assert apply_gpu_limit(monkeypatch, tf, runtime_started=False, limit=GiB) == (
        "TensorFlow refused it: Virtual devices cannot be modified after being initialized"
    )


def test_the_gpu_limit_without_gpus(monkeypatch: pytest.MonkeyPatch):
    assert apply_gpu_limit(monkeypatch, FakeTensorFlow(gpus=0), runtime_started=False, limit=GiB) == (
        "TensorFlow sees no GPU"
    )


def test_the_gpu_variables_are_set_unless_the_user_chose():
    environ: dict[str, str] = {}
    assert set_gpu_environment(environ) == [f"{GROWTH_VARIABLE}=true", f"{PREALLOCATE_VARIABLE}=false"]
    assert environ == {GROWTH_VARIABLE: "true", PREALLOCATE_VARIABLE: "false"}
    chosen = {GROWTH_VARIABLE: "false"}
    assert set_gpu_environment(chosen) == [f"{PREALLOCATE_VARIABLE}=false"]
    assert chosen == {GROWTH_VARIABLE: "false", PREALLOCATE_VARIABLE: "false"}


# -- options and markers in pytest runs (no TensorFlow: fast) ----------------------------------


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--tfmem-gpu-budget=4XB"], "*invalid --tfmem-gpu-budget value '4XB'*"),
        (["--tfmem-gpu-limit=-1GB"], "*invalid --tfmem-gpu-limit value '-1GB'*"),
        (["--tfmem-gpu-memory-growth=maybe"], "*invalid --tfmem-gpu-memory-growth value 'maybe': expected true/false*"),
        (["--tfmem-nvml-interval=-1"], "*invalid --tfmem-nvml-interval value '-1': expected seconds between 0 and 60*"),
    ],
)
def test_bad_option_values_are_usage_errors(pytester: pytest.Pytester, args: list[str], expected: str):
    pytester.makepyfile("def test_one():\n    pass\n")
    result = pytester.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([expected])


def test_a_bad_gpu_budget_marker_is_a_usage_error(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.tfmem(gpu_budget="lots")
        def test_one():
            pass
        """
    )
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_one: invalid tfmem marker argument gpu_budget 'lots'*"])


@pytest.mark.parametrize(
    ("args", "ini", "expected", "header"),
    [
        ([], "", "unset", None),  # no GPU option: the environment is left alone
        (["--tfmem-budget=1GB"], "", "unset", None),  # a host option is not a GPU option
        (["--tfmem-gpu-budget=1GB"], "", "true", "GPU option given: --tfmem-gpu-budget"),
        (["--tfmem-gpu-limit=1GB"], "", "true", "GPU option given: --tfmem-gpu-limit"),
        (["--tfmem-gpu-memory-growth=true"], "", "true", "GPU option given: --tfmem-gpu-memory-growth"),
        (["--tfmem-nvml-interval=0"], "", "true", "GPU option given: --tfmem-nvml-interval"),
        ([], "tfmem_gpu_budget = 1GB", "true", "GPU option given: ini tfmem_gpu_budget"),
        (["--tfmem-gpu-budget=1GB", "--tfmem-gpu-memory-growth=false"], "", "unset", None),
        ([], "tfmem_gpu_limit = 1GB\ntfmem_gpu_memory_growth = false", "unset", None),
    ],
)
def test_memory_growth_is_set_only_when_a_gpu_option_is_given(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, args: list[str], ini: str, expected: str, header: str | None
):
    monkeypatch.delenv(GROWTH_VARIABLE, raising=False)
    monkeypatch.delenv(PREALLOCATE_VARIABLE, raising=False)
    pytester.makepyfile(
        f"""
        import os

        def test_growth(request):
            expected = request.config.getoption("--expect")
            assert os.environ.get("{GROWTH_VARIABLE}") == (None if expected == "unset" else expected)
            assert os.environ.get("{PREALLOCATE_VARIABLE}") == (None if expected == "unset" else "false")
        """
    )
    pytester.makeconftest('def pytest_addoption(parser):\n    parser.addoption("--expect")\n')
    pytester.makeini(f"[pytest]\n{ini}\n")
    result = pytester.runpytest(f"--expect={expected}", *args)
    result.assert_outcomes(passed=1)
    headers = [line for line in result.outlines if line.startswith(f"tfmem: {GROWTH_VARIABLE}")]
    set_both = f"{GROWTH_VARIABLE}=true, {PREALLOCATE_VARIABLE}=false"
    assert headers == ([f"tfmem: {set_both} set ({header})"] if header else [])
    assert GROWTH_VARIABLE not in os.environ  # taken back at the end of the session
    assert PREALLOCATE_VARIABLE not in os.environ


def test_memory_growth_the_user_chose_is_kept(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(GROWTH_VARIABLE, "false")
    pytester.makepyfile(f"import os\n\ndef test_growth():\n    assert os.environ['{GROWTH_VARIABLE}'] == 'false'\n")
    result = pytester.runpytest("--tfmem-gpu-budget=1GB")
    result.assert_outcomes(passed=1)
    assert GROWTH_VARIABLE not in result.stdout.str()
    assert os.environ[GROWTH_VARIABLE] == "false"


# -- the real TensorFlow on a CPU machine -------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed")
# looked up, not imported: pytester removes at teardown the modules its test imported, and importing
# TensorFlow again in the same process aborts it
@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_with_real_tensorflow_and_no_gpu_the_limit_warns_and_tests_still_run(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import pytest
        import tensorflow as tf

        def test_tensor():
            assert float(tf.reduce_sum(tf.ones((4, 4)))) == 16.0

        def test_devices_are_initialised_once_tests_run():
            # What the fake above mimics: after initialisation TensorFlow refuses device settings.
            cpu = tf.config.list_physical_devices("CPU")[0]
            with pytest.raises(RuntimeError, match="Virtual devices cannot be modified after being initialized"):
                tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-gpu-limit=1GB", "--tfmem-trace=off")
    result.assert_outcomes(passed=2, warnings=1)
    result.stdout.fnmatch_lines(["*TfmemDeviceWarning: pytest-tfmem: --tfmem-gpu-limit=953.7 MiB not applied: TensorFlow sees no GPU"])
