"""GPU and device memory: GPU budgets, the frameworks' GPU set-up, NVML views, OOM as a failure.

- ``--tfmem-gpu-budget`` / ``tfmem(gpu_budget=...)``: a test's peak GPU memory need, read
  from the frameworks' GPU views (``tf:GPU:N``, ``jax:gpu:N``, ``torch:cuda:N``) or, without
  them (CuPy), from NVML (``nvml:N``). GPU views never count towards the host ``peak``.
- Once any GPU option is given (on the command line or in the ini file; see
  ``gpu_options_given``), each framework's GPU variables are set when pytest starts, the
  earliest moment (``TF_FORCE_GPU_ALLOW_GROWTH=true``, ``XLA_PYTHON_CLIENT_PREALLOCATE=false``),
  so TensorFlow and JAX take GPU memory as needed instead of most of it, and NVML's numbers mean
  something; the session header says so. ``--tfmem-gpu-memory-growth=false`` leaves them alone,
  and so does a value the user set. Without a GPU option the environment is not touched.
- ``--tfmem-gpu-limit``: each framework's limit on every GPU (TensorFlow's logical device memory
  limit, PyTorch's memory fraction), set (registered with the manager's ``runtime_setups``)
  before the framework starts its runtime. Where that is too late, or the framework cannot take
  one (JAX), a ``TfmemDeviceWarning`` says the setting was not applied.
- A framework's device out-of-memory error escaping a measured test (TensorFlow's
  ``ResourceExhaustedError``, JAX's ``RESOURCE_EXHAUSTED``, PyTorch's ``OutOfMemoryError``)
  becomes a ``DeviceOutOfMemory`` failure naming device, allocator, size, limit and peak (``oom.py``).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pytest_tfmem import frameworks
from pytest_tfmem.core import features, oom, settings
from pytest_tfmem.core.features import CallStep, Step, Summary
from pytest_tfmem.core.handoffs import TraceHandoff
from pytest_tfmem.core.manager import ARGUMENTS, RECORD, manager
from pytest_tfmem.core.measure import Measurement, PeakTracker
from pytest_tfmem.core.record import TestRecord, publish
from pytest_tfmem.core.verdict import Verdict, view_label
from pytest_tfmem.errors import DeviceOutOfMemory
from pytest_tfmem.frameworks import Framework
from pytest_tfmem.probes.nvml import Nvml, NvmlSampler, process_sources
from pytest_tfmem.units import SIZE_FORMS, format_limit, format_size

CHECK = "gpu_budget"
EXTRA = "gpu"  # the record's section: NVML devices and problems
APPLIED_LIMIT = pytest.StashKey[int]()  # the GPU limit TensorFlow accepted


class TfmemDeviceWarning(pytest.PytestWarning):
    """A device setting (GPU memory limit, memory growth) could not be applied."""


def parse_interval(value: object, what: str) -> float:
    try:
        seconds = float(str(value))
    except ValueError:
        seconds = -1.0
    if isinstance(value, bool) or not 0 <= seconds <= 60:
        raise ValueError(f"invalid {what} {value!r}: expected seconds between 0 and 60, e.g. 0.01 (0: no sampling)")
    return seconds


GPU_BUDGET = settings.Option(
    "gpu_budget",
    f"peak GPU memory budget for every test (TF GPU allocators, else NVML); {SIZE_FORMS}",
    settings.parse_optional_size,
)
GPU_LIMIT = settings.Option(
    "gpu_limit",
    "make TensorFlow refuse GPU memory past this size on each GPU (a logical device memory limit, "
    f"set before TF initialises its GPUs); {SIZE_FORMS}",
    settings.parse_optional_size,
)
GPU_MEMORY_GROWTH = settings.Option(
    "gpu_memory_growth",
    "let TensorFlow and JAX take GPU memory as needed rather than most of it at start "
    "(TF_FORCE_GPU_ALLOW_GROWTH=true, XLA_PYTHON_CLIENT_PREALLOCATE=false, each unless already set; "
    "default true once a GPU option is given, else the environment is left alone)",
    settings.parse_bool,
    True,
)
NVML_INTERVAL = settings.Option(
    "nvml_interval",
    "seconds between NVML readings of GPU memory while tests run; 0 reads only at each test's start "
    "and end (default 0.05)",
    parse_interval,
    0.05,
)
OPTIONS = [GPU_BUDGET, GPU_LIMIT, GPU_MEMORY_GROWTH, NVML_INTERVAL]  # each one a "GPU option"


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, OPTIONS)


TFMEM_DECLARATIONS = features.Declarations(marker_keywords={"gpu_budget": settings.parse_optional_size})


def pytest_configure(config: pytest.Config) -> None:
    gpu = TfmemGpu(config)
    config.pluginmanager.register(gpu, "tfmem-gpu")
    tfmem_manager = manager(config)
    tfmem_manager.add_step(CallStep(Step.GPU, gpu.device_oom_failure))
    tfmem_manager.add_summary(Summary.GPU, gpu.write_summary)
    tfmem_manager.tracker_sources.append(gpu.nvml_trackers)
    tfmem_manager.runtime_setups.append(gpu.configure_runtime)
    tfmem_manager.add_reader(GpuFigures, GpuFigures)


# -- checks --------------------------------------------------------------------------------


def device_oom(error: BaseException | None) -> oom.OutOfMemory | None:
    """A framework's device out-of-memory error, read (TensorFlow's ``ResourceExhaustedError``,
    PyTorch's ``OutOfMemoryError``, JAX's ``RESOURCE_EXHAUSTED``); ``None`` for any other error."""
    if error is None:
        return None
    for framework in frameworks.loaded():
        message = framework.device_oom_message(error)
        if message is not None:
            return oom.parse_oom(message, framework.name)
    return None


def pytest_tfmem_check(item: pytest.Item, record: TestRecord, error: BaseException | None) -> Verdict | None:
    """A framework's device out-of-memory error from the test, as a verdict (unless the test expects it)."""
    found = device_oom(error)
    if found is None or error is None or _expects(item, error):
        return None
    limit = item.config.stash.get(APPLIED_LIMIT, None)
    record.extra[oom.CHECK] = oom.record_section(found, limit)
    return _oom_verdict(item.config, found, record, None)


def _oom_verdict(config: pytest.Config, found: oom.OutOfMemory, record: TestRecord, trace: str | None) -> Verdict:
    """The failed device-OOM verdict for the error ``found`` (``trace``: the test's trace
    directory, which the message points to)."""
    limit = config.stash.get(APPLIED_LIMIT, None)
    return Verdict(oom.CHECK, False, oom.describe_oom(found, record.measurement, limit, trace))


def gpu_views(measurement: Measurement) -> list[tuple[str, int]]:
    """``(view, increase)`` a GPU budget reads: TF's GPU allocators, else NVML's per-GPU views."""
    return [(v.view, v.increase) for v in measurement.gpu_views()]


def sampling_note(measurement: Measurement) -> str:
    """How often NVML was read, where the GPU figure rests on it (NVML keeps no peak)."""
    interval = measurement.nvml_interval_s
    if interval is None or measurement.gpu is not None:  # no NVML, or TensorFlow's allocators carry the figure
        return ""
    if interval == 0:
        return "NVML read at the test's start and end only: a peak in between is not seen"
    return f"NVML sampled every {interval * 1000:g} ms: a shorter peak can be missed"


def check_gpu_budget(measurement: Measurement, budget: int | None) -> Verdict | None:
    """``GPU peak 2.3 GiB > GPU budget 2.0 GiB (TF GPU:0 allocator 2.3 GiB)``; ``None``
    without a budget or without any GPU view (no GPU: nothing to check)."""
    if budget is None:
        return None
    views = gpu_views(measurement)
    if not views:
        return None
    peak = max(increase for _, increase in views)
    relation = ">" if peak > budget else "<="
    labels = ", ".join(f"{view_label(name)} {format_size(increase)}" for name, increase in views)
    message = f"GPU peak {format_size(peak)} {relation} GPU budget {format_limit(budget)} ({labels})"
    note = sampling_note(measurement)
    return Verdict(CHECK, peak <= budget, f"{message}; {note}" if note else message)


# -- the options given, and the summary's notes ---------------------------------------------


def gpu_options_given(config: pytest.Config) -> list[str]:
    """The GPU options given, as written (``--tfmem-gpu-budget`` or ini ``tfmem_gpu_budget``)."""
    given = []
    for option in OPTIONS:
        if settings.read_option(config, option)[1]:
            on_command_line = config.getoption(option.ini, default=None) is not None
            given.append(option.cli if on_command_line else f"ini {option.ini}")
    return given


class GpuFigures:
    """What the GPU lines under the summary table need to know of every record, gathered one
    record at a time (``TfmemManager.reader``)."""

    def __init__(self) -> None:
        self.views: set[str] = set()
        self.problems: set[str] = set()  # NVML's
        self.unchecked = 0  # tests with a GPU budget and no GPU view to check it against
        self.held = False  # a test was held to a GPU budget (its marker's, or an option's), checked or not

    @classmethod
    def of(cls, records: Iterable[TestRecord]) -> GpuFigures:
        figures = cls()
        for record in records:
            figures.add(record)
        return figures

    def add(self, record: TestRecord) -> None:
        if record.measurement is not None:
            self.views.update(v.view for v in record.measurement.views)
        extra = record.extra.get(EXTRA, {})
        self.problems.update(extra.get("problems", ()))
        self.unchecked += "unchecked_gpu_budget" in extra
        self.held |= "unchecked_gpu_budget" in extra or any(v.check == CHECK for v in record.verdicts)

    def notes(self, nvml_reason: Callable[[], str], *, views_note: bool = True) -> list[str]:
        """Lines under the summary table: why there are no NVML (or no GPU) views (with
        ``views_note``), NVML's problems, GPU budgets that had nothing to check."""
        notes = []
        if views_note and not any(view.startswith("nvml:") for view in self.views):
            what = "NVML views" if any(frameworks.is_gpu_view(view) for view in self.views) else "GPU views"
            notes.append(f"no {what}: {nvml_reason()}")
        notes += sorted(self.problems)
        if self.unchecked:
            notes.append(f"GPU budget not checked in {self.unchecked} test(s): no GPU memory view")
        return notes


def _expects(item: pytest.Item, error: BaseException) -> bool:
    """The test is marked ``xfail(raises=...)`` with this error's type: leave it as it is."""
    for mark in item.iter_markers("xfail"):
        raises = mark.kwargs.get("raises")
        if raises is not None and isinstance(error, raises):
            return True
    return False


class TfmemGpu:
    """Per-session state: GPU settings, the NVML session and sampler, notes for the summary."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        values = {option.name: settings.read_option(config, option)[0] for option in OPTIONS}
        self.budget: int | None = values["gpu_budget"]
        self.limit: int | None = values["gpu_limit"]
        self.interval: float = values["nvml_interval"]
        # GPU settings only when a GPU option asks for them: otherwise the environment is left alone.
        self.options_given = gpu_options_given(config)
        wants_growth = bool(self.options_given) and values["gpu_memory_growth"]
        self.variables_set = frameworks.set_gpu_environment(os.environ) if wants_growth else []
        # The variables are read when a framework starts its runtime: too late for one that did.
        self.started_before = {framework.module for framework in frameworks.started()} if self.variables_set else set()
        self.nvml: Nvml | None = None
        self.nvml_note = ""
        self._nvml_trackers: list[PeakTracker] | None = None
        self._sampler: NvmlSampler | None = None

    # -- NVML ----------------------------------------------------------------------------
    def nvml_trackers(self) -> list[PeakTracker]:
        """The NVML trackers of every window (opened at the first one, then the same ones)."""
        if self._nvml_trackers is None:
            self.nvml, self.nvml_note = Nvml.open()
            sources = process_sources(self.nvml) if self.nvml is not None else []
            for source in sources:
                source.sampled_every_s = self.interval
            self._nvml_trackers = [PeakTracker(source) for source in sources]
            if sources and self.interval > 0:
                self._sampler = NvmlSampler(sources, self.interval).start()
        return self._nvml_trackers

    def _nvml_section(self) -> dict[str, Any]:
        if self.nvml is None:
            return {}
        section: dict[str, Any] = {}
        try:
            section["devices"] = [dataclasses.asdict(device) for device in self.nvml.devices()]
        except self.nvml.error as error:
            section["problems"] = [f"NVML could not read the GPUs: {error}"]
        problems = [problem for t in self._nvml_trackers or () if (problem := getattr(t.source, "problem", ""))]
        if problems:
            section.setdefault("problems", []).extend(problems)
        return section

    # -- hooks ---------------------------------------------------------------------------
    def pytest_tfmem_measure_all(self) -> bool:
        return self.budget is not None or self.limit is not None

    def pytest_report_header(self) -> list[str]:
        if not self.variables_set:
            return []
        return [f"tfmem: {', '.join(self.variables_set)} set (GPU option given: {', '.join(self.options_given)})"]

    @pytest.hookimpl(tryfirst=True)  # before pytest's own set-up, which runs the fixtures
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """With a GPU limit, configure the GPUs before fixtures run (they may start a runtime)."""
        if self.limit is not None:
            manager(self.config).prepare_frameworks(item)

    def configure_runtime(self, framework: Framework, runtime_started: bool) -> None:
        """Apply the GPU limit and say what could not be set (the manager calls it once a
        framework is loaded, before its runtime starts)."""
        config = self.config
        problems = []
        if self.limit is not None:
            problem = framework.limit_gpu_memory(self.limit, runtime_started)
            if problem:
                problems.append(f"--tfmem-gpu-limit={format_size(self.limit)} not applied: {problem}")
            else:
                config.stash[APPLIED_LIMIT] = self.limit
        variables = [f"{name}={value}" for name, value in framework.gpu_environment.items()]
        if framework.module in self.started_before and set(variables) & set(self.variables_set):
            problems.append(
                f"GPU memory growth not turned on: {framework.name} had started before pytest-tfmem "
                f"(set {', '.join(variables)} in the environment, or --tfmem-gpu-memory-growth=false)"
            )
        for problem in problems:
            warnings.warn(TfmemDeviceWarning(f"pytest-tfmem: {problem}"), stacklevel=2)

    def pytest_tfmem_check(self, item: pytest.Item, record: TestRecord, error: BaseException | None) -> Verdict | None:
        arguments = item.stash.get(ARGUMENTS, {})
        budget = arguments.get("gpu_budget", self.budget)  # the marker's None exempts
        assert record.measurement is not None
        section = self._nvml_section()
        if budget is not None and not gpu_views(record.measurement):
            section["unchecked_gpu_budget"] = budget
        elif budget is not None:
            record.gpu_budget = budget
        if section:
            record.extra[EXTRA] = section
        return check_gpu_budget(record.measurement, budget)

    @contextmanager
    def device_oom_failure(self, item: pytest.Item) -> Iterator[None]:
        """A ``ResourceExhaustedError`` from a measured test function becomes a ``DeviceOutOfMemory``
        (a ``unittest.TestCase`` method keeps TF's error; its tfmem section has the verdict)."""
        try:
            yield
        except Exception as error:
            record = item.stash.get(RECORD, None)
            verdict = next((v for v in record.verdicts if v.check == oom.CHECK), None) if record else None
            if record is None or verdict is None:
                raise
            traced = TraceHandoff.of(record)
            trace = traced.shown_directory if traced is not None else None
            refined = _oom_verdict(self.config, device_oom(error) or oom.parse_oom(str(error)), record, trace)
            record.verdicts[record.verdicts.index(verdict)] = refined
            publish(item, record)
            failure = DeviceOutOfMemory(refined.message)
            failure.tf_error = error  # the message already quotes it: no chained traceback
            raise failure from None

    def write_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        tfmem = manager(self.config)
        if not tfmem.records:
            return
        figures = tfmem.reader(GpuFigures)
        for line in figures.notes(self._nvml_reason, views_note=bool(self.options_given) or figures.held):
            terminalreporter.write_line(f"tfmem: {line}")

    def _nvml_reason(self) -> str:
        """Why NVML gave no view; a controller under xdist measured nothing, so it asks now."""
        if self._nvml_trackers is None:
            nvml, self.nvml_note = Nvml.open()
            if nvml is not None:
                nvml.close()
                self.nvml_note = f"NVML sees {nvml.device_count} GPU(s) but no test was measured on them"
        return self.nvml_note or "NVML sees no GPU"

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self._sampler is not None:
            self._sampler.stop()
        if self.nvml is not None:
            self.nvml.close()
        for variable in self.variables_set:
            os.environ.pop(variable.split("=", 1)[0], None)
