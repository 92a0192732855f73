"""What ``tfmem run`` says at the end: the peaks, a death explained, advice; the same as JSON.

Pure functions of what was seen: the watchdog's ``WatchResult`` (the outside view: the process
tree's readings, each process's high-water mark, the exit status, the OOM-kill count) and the
agent's readings (``AgentView``: where the script was, the frameworks' device views). No process
is started or read here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pytest_tfmem import frameworks, platforms
from pytest_tfmem.files import FileFormatError, VersionedJson
from pytest_tfmem.probes.system import MemoryLimit
from pytest_tfmem.probes.watchdog import WatchResult, describe_signal, downsample, killed_by_oom_killer
from pytest_tfmem.units import format_limit, format_size

SCENARIOS = "docs/scenarios.md"
# Advice is given only where the figures say it clearly.
DOMINANT_SHARE = 0.6  # a share of the peak this large dominates it
ADVICE_MINIMUM = 256 * 2**20  # a share smaller than this is not worth advice
TRAINING_CALLS = {"fit", "train_on_batch", "train_step", "fit_generator"}


class RunReportError(FileFormatError):
    what = "run report"


RUN_REPORT = VersionedJson("pytest-tfmem-run", 1, "write one with tfmem run --report=PATH", RunReportError)


@dataclass(frozen=True)
class Place:
    """Where the script's main thread was: its own innermost frames, and the library call they made."""

    stack: tuple[tuple[str, str, int], ...]  # (function, file, line), innermost last
    calling: str | None  # the library function the innermost own frame was in, e.g. ``fit``
    time: float  # when the agent saw it (time.time())

    def __str__(self) -> str:
        if not self.stack:
            return f"in {self.calling}" if self.calling else "before the script's first line"
        function, path, line = self.stack[-1]
        text = f"in {function} ({Path(path).name}:{line})"
        return f"{text}, calling {self.calling}" if self.calling else text

    @classmethod
    def from_reading(cls, reading: dict[str, Any]) -> Place:
        """The place in one of the agent's ``reading`` lines."""
        stack = tuple((str(function), str(path), int(line)) for function, path, line in reading.get("stack", []))
        return cls(stack, reading.get("calling"), float(reading["time"]))

    @property
    def training(self) -> bool:
        return self.calling in TRAINING_CALLS or any(function in TRAINING_CALLS for function, _, _ in self.stack)


@dataclass(frozen=True)
class AgentView:
    """What the agent in the script's process saw (nothing for a ``-- COMMAND``)."""

    pid: int | None = None
    readings: tuple[dict[str, Any], ...] = ()
    high_water_mark: int | None = None  # the script's own, read as it exited (exact); None if killed
    exited: bool = False  # its last line was written (the interpreter ran its exit handlers)
    # (time.time() at its end, module, bytes it kept) of each first import in the script's process
    imports: tuple[tuple[float, str, int], ...] = ()
    start_rss: int = 0  # the script's process before its first line (the interpreter)

    @classmethod
    def read(cls, path: Path) -> AgentView:
        """The agent's lines; a line cut short by a kill is skipped."""
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            return cls()
        pid, readings, mark, exited, imports, start_rss = None, [], None, False, [], 0
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict) or not _well_formed(entry):
                continue  # a line cut short or garbled: the summary makes do without it
            if entry.get("event") == "agent":
                pid = entry.get("pid")
                start_rss = entry["rss"] if isinstance(entry.get("rss"), int) else 0
            elif entry.get("event") == "reading":
                readings.append(entry)
            elif entry.get("event") == "exit":
                mark, exited = entry.get("high_water_mark"), True
                readings.append({**entry, "event": "reading", "stack": [], "calling": None, "final": True})
            elif entry.get("event") == "import" and isinstance(entry.get("host_bytes"), int):
                imports.append((float(entry["time"]), str(entry.get("module")), int(entry["host_bytes"])))
        return cls(pid, tuple(readings), mark, exited, tuple(imports), start_rss)

    def imports_by(self, moment: float) -> list[tuple[str, int]]:
        """The first imports ended at or before ``moment`` (time.time()), and what each kept."""
        return [(module, kept) for ended, module, kept in self.imports if ended <= moment]

    def last_place(self) -> Place | None:
        """Where the main thread was at the agent's last reading before the end."""
        seen = [reading for reading in self.readings if not reading.get("final")]
        return Place.from_reading(seen[-1]) if seen else None

    def place_at(self, moment: float) -> Place | None:
        """Where the main thread was at the agent's last reading at or before ``moment`` (time.time())."""
        seen = [reading for reading in self.readings if not reading.get("final") and reading["time"] <= moment]
        return Place.from_reading(seen[-1]) if seen else None

    def device_peaks(self) -> dict[str, int]:
        """Each device view's peak over the run (``{"tf:CPU:0": bytes}``), as last read."""
        peaks: dict[str, int] = {}
        for reading in self.readings:
            for view, (_, peak) in reading.get("views", {}).items():
                peaks[view] = max(peaks.get(view, 0), int(peak))
        return peaks

    def place_at_device_peak(self) -> Place | None:
        """Where the script was when the device views' peaks last rose."""
        best, place = 0, None
        for reading in self.readings:
            total = sum(int(peak) for _, peak in reading.get("views", {}).values())
            if total > best and not reading.get("final"):
                best, place = total, Place.from_reading(reading)
        return place

    def runtimes(self) -> list[str]:
        """The frameworks whose runtime the script started (``TensorFlow``, ``JAX``), in order."""
        names = (name for reading in self.readings for name in reading.get("runtimes", ()))
        return list(dict.fromkeys(names))

    def rss_when_started(self) -> int | None:
        """The script's RSS when a framework's runtime started: what the imports and anything
        before them took (``None`` if no reading saw a runtime started: the exit line has none).

        The reading that first saw the runtime may come late (a loaded machine, or a NumPy call
        holding the interpreter), after the script has loaded its data, so its RSS is not taken.
        The figure is the larger of the last reading before it (made before the runtime started)
        and the script's start plus what its first imports kept by then (each booked as it ends).
        """
        readings = [reading for reading in self.readings if isinstance(reading.get("rss"), int)]
        first = next((reading for reading in readings if reading.get("views") or reading.get("runtimes")), None)
        if first is None:
            return None
        before = [reading["rss"] for reading in readings if reading["time"] < first["time"]]
        imported = sum(kept for _, kept in self.imports_by(first["time"]))
        return max(before[-1] if before else self.start_rss, self.start_rss + imported)

    def device_timeline(self, start: float) -> list[tuple[float, dict[str, int]]]:
        """``(seconds since start, {view: bytes in use})`` at each reading."""
        return [(reading["time"] - start, {view: int(c) for view, (c, _) in reading["views"].items()})
                for reading in self.readings if reading.get("views")]


def host_view_total(levels: dict[str, int]) -> int:
    """Of ``{view: bytes}``, the bytes of views of host memory (in RSS: TensorFlow's CPU
    allocator), not of a GPU."""
    return sum(value for view, value in levels.items() if frameworks.is_host_view(view))


def _well_formed(entry: dict[str, Any]) -> bool:
    """An agent line whose fields the summary reads have the types it reads them as (each may be
    missing, except a reading's time)."""
    views = entry.get("views", {})
    devices_ok = isinstance(views, dict) and all(
        isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(n, int) for n in value)
        for value in views.values()
    )
    timed = isinstance(entry.get("time"), (int, float)) or entry.get("event") not in ("reading", "exit", "import")
    runtimes = entry.get("runtimes", [])
    runtimes_ok = isinstance(runtimes, list) and all(isinstance(name, str) for name in runtimes)
    return devices_ok and timed and runtimes_ok and isinstance(entry.get("stack", []), list)


@dataclass(frozen=True)
class Death:
    """How the script's process died: the signal, who sent it, the memory then, where it was."""

    pid: int
    signal: str  # "SIGKILL"
    sender: str  # "oom killer", "kill_at", "tfmem run (passed on)", "someone else"
    cause: str  # one phrase: "killed by the OOM killer"
    last_rss: int  # the process tree's RSS at the last reading
    limit: int
    limit_source: str
    place: Place | None

    def headline(self) -> str:
        where = f" {self.place}" if self.place is not None else ""
        return f"{self.cause} at {format_size(self.last_rss)}{where}, limit {format_size(self.limit)}"


@dataclass(frozen=True)
class RunSummary:
    """The figures of one ``tfmem run``, what was said about them, and the exit code."""

    command: tuple[str, ...]
    kind: str  # "script", "module", "command"
    returncode: int  # the child's (negative: the signal that ended it)
    exit_code: int  # what ``tfmem run`` exits with
    duration_s: float
    peak: int  # the sum of each process's own high-water mark
    high_water_marks: dict[int, int]  # pid -> that process's peak (its mark: the kernel's VmHWM on Linux)
    script_pid: int
    sampled_peak: int  # the process tree's RSS, sampled
    interval_s: float
    device_peaks: dict[str, int]  # device view ("tf:CPU:0", "jax:gpu:0") -> its peak
    host_share: int | None  # the script's peak outside the frameworks' host views
    gpu_peaks: dict[str, int]
    budget: int | None
    kill_at: int | None
    gpu_budget: int | None
    verdicts: tuple[str, ...]  # a budget passed, in words
    death: Death | None
    place_at_peak: Place | None
    advice: tuple[str, ...]
    timeline: list[tuple[float, int]] = field(default_factory=list)
    device_timeline: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    runtimes: tuple[str, ...] = ()  # the frameworks whose runtime the script started
    gpu_environment: tuple[str, ...] = ()  # "XLA_PYTHON_CLIENT_PREALLOCATE=false": set for the script
    # the script's own figure: its process's peak above its size before the script's first line,
    # less what first imports kept before the peak (``None`` for a command without the agent), and
    # those imports
    own_peak: int | None = None
    first_imports: tuple[tuple[str, int], ...] = ()

    def lines(self) -> list[str]:
        """The few lines printed at the end."""
        others = {pid: mark for pid, mark in self.high_water_marks.items() if pid != self.script_pid}
        own = self.high_water_marks.get(self.script_pid, 0)
        ending = platforms.current().ending(self.returncode)
        ended = f"exit code {self.returncode}"
        if ending.signal is not None:
            ended = f"killed by {ending.signal}, exit code {self.exit_code}"
        lines = [f"tfmem run: {' '.join(self.command)}: {ended} after {self.duration_s:.1f} s"]
        where = f", reached {self.place_at_peak}" if self.place_at_peak is not None else ""
        split = f": main process {format_size(own)}"
        if others:
            split += f" + {len(others)} other process(es) {format_size(sum(others.values()))}"
        every = f"{self.interval_s * 1000:.0f} ms"
        lines.append(f"  peak {format_size(self.peak)} ({platforms.current().marks_named}{split}){where}")
        if self.own_peak is not None and self.first_imports:
            lines.append(f"  the script's own: {format_size(self.own_peak)} above the interpreter's start, its first "
                         f"imports apart ({first_imports_text(self.first_imports)}), as pytest-tfmem gives a test's")
        lines.append(f"  process tree RSS sampled every {every}: peak {format_size(self.sampled_peak)}, "
                     f"last {format_size(self.timeline[-1][1] if self.timeline else 0)}")
        if self.device_peaks:
            views = ", ".join(f"{frameworks.view_label(view) or view} {format_size(peak)}"
                              for view, peak in sorted(self.device_peaks.items()))
            host = f"; host share (NumPy, Python, libraries) {format_size(self.host_share)}" if self.host_share else ""
            lines.append(f"  device peaks: {views}{host}")
        viewed = {owner.name for owner in map(frameworks.owner, self.device_peaks) if owner is not None}
        started = [name for name in self.runtimes if name not in viewed]
        if started:
            host = f"; host share (NumPy, Python, libraries, their arrays) {format_size(self.host_share)}"
            lines.append(f"  {' and '.join(started)} started{host if self.host_share and not viewed else ''}")
        if self.gpu_environment:
            lines.append(f"  {', '.join(self.gpu_environment)} set for the program (--gpu-budget given)")
        if self.gpu_peaks:
            lines.append("  GPU (NVML, sampled): " + ", ".join(
                f"{device} {format_size(peak)}" for device, peak in sorted(self.gpu_peaks.items())))
        if self.death is not None:
            lines.append(f"  {self.death.headline()}")
            lines.append(f"  (process {self.death.pid}, {self.death.signal}, sent by {self.death.sender}; "
                         f"limit from {self.death.limit_source})")
        lines += [f"  {verdict}" for verdict in self.verdicts]
        lines += [f"  advice: {advice}" for advice in self.advice]
        return lines

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["high_water_marks"] = {str(pid): mark for pid, mark in self.high_water_marks.items()}
        data["timeline"] = [[round(t, 3), rss] for t, rss in downsample(self.timeline, 500)]
        data["device_timeline"] = [[round(t, 3), levels] for t, levels in self.device_timeline[-2000:]]
        # version 1's TensorFlow-only fields, kept for the readers of reports: its views, by device
        data["tf_peaks"] = _tensorflow_devices(self.device_peaks)
        data["tf_timeline"] = [[t, tf] for t, levels in data["device_timeline"] if (tf := _tensorflow_devices(levels))]
        return data


# The first imports a summary names; the rest are summed.
NAMED_IMPORTS = 3


def first_imports_text(imports: tuple[tuple[str, int], ...]) -> str:
    """``tensorflow 571.0 MiB, numpy 20.1 MiB, 12 more 30.2 MiB``: the largest first."""
    largest = sorted(imports, key=lambda found: -found[1])
    text = ", ".join(f"{module} {format_size(kept)}" for module, kept in largest[:NAMED_IMPORTS])
    rest = largest[NAMED_IMPORTS:]
    if rest:
        text += f", {len(rest)} more {format_size(sum(kept for _, kept in rest))}"
    return text


def _tensorflow_devices(levels: dict[str, int]) -> dict[str, int]:
    """``{"tf:CPU:0": n, "jax:gpu:0": m}`` -> ``{"CPU:0": n}``."""
    return {view.removeprefix("tf:"): value for view, value in levels.items() if view.startswith("tf:")}


def explain_death(result: WatchResult, pid: int, passed_on: str | None, limit: MemoryLimit,
                  agent: AgentView) -> Death | None:
    """Why the script's process died by a signal, or ``None`` if it exited."""
    sig = result.signal
    if sig is None:
        return None
    if result.killed_at_limit and result.kill_at is not None:
        sender, cause = "tfmem run's watchdog (--kill-at)", "killed by --kill-at"
        limit = MemoryLimit(result.kill_at, "--kill-at")
    elif killed_by_oom_killer(sig, result.oom_kills):
        sender = "the kernel's OOM killer"
        cause = f"killed by the OOM killer ({result.oom_scope}'s oom_kill count rose by {result.oom_kills})"
    elif passed_on == sig:
        sender, cause = "tfmem run, which passed on the signal it received", f"stopped by {sig} from outside"
    else:
        sender = "someone else"
        cause = describe_signal(sig, result.oom_kills, result.oom_scope).replace(" (not sent by pytest-tfmem)", "")
    place = agent.last_place()
    return Death(pid, sig, sender, cause, result.last_rss, limit.bytes, limit.source, place)


def advise(peak: int, host_data: int | None, device_peaks: dict[str, int], at_device_peak: Place | None,
           runtimes: list[str]) -> list[str]:
    """Advice where the figures are clear, for a script that uses a framework (``runtimes``: those
    whose runtime it started); nothing otherwise.

    ``host_data``: the host share beyond what the script held when the first framework's runtime
    started (its imports, TensorFlow's ~600 MiB included, are not data). When that dominates the
    peak and is more than twice the device views' peaks: stream the data. When the device views
    dominate and their peak was reached in ``fit``: the batch size.
    """
    advice = []
    viewed = sum(device_peaks.values())
    dominant = max(DOMINANT_SHARE * peak, ADVICE_MINIMUM)
    by_name = {framework.name: framework for framework in frameworks.KNOWN}
    first = by_name.get(runtimes[0]) if runtimes else None  # the framework started first
    if first is not None and host_data is not None and host_data >= max(0.4 * peak, ADVICE_MINIMUM) \
            and host_data > 2 * viewed:
        host_views = [frameworks.view_label(view) or view for view in device_peaks if frameworks.is_host_view(view)]
        outside = f"outside the {' and the '.join(host_views)} " if host_views else ""
        advice.append(
            f"{format_size(host_data)} of the peak is data {outside}(NumPy arrays, Python objects) taken after "
            f"{first.name} started; stream it in batches with {first.data_pipeline} instead of loading it whole "
            f"(see {SCENARIOS}, \"Large dataset\")"
        )
    if viewed >= dominant and at_device_peak is not None and at_device_peak.training:
        holding = [frameworks.view_label(view) or view for view, value in device_peaks.items() if value]
        verb = "hold" if len(holding) > 1 else "holds"
        advice.append(
            f"The {' and the '.join(holding)} {verb} most of the peak ({format_size(viewed)}) during fit: a smaller "
            f"batch size lowers it; pytest_tfmem.find_max_batch_size finds the largest that fits a budget "
            f"(see {SCENARIOS}, \"Big batch\")"
        )
    return advice


def budget_verdicts(peak: int, budget: int | None, gpu_peaks: dict[str, int], gpu_budget: int | None) -> list[str]:
    verdicts = []
    if budget is not None and peak > budget:
        verdicts.append(f"over budget: peak {format_size(peak)} > --budget={format_limit(budget)}")
    for device, gpu_peak in sorted(gpu_peaks.items()):
        if gpu_budget is not None and gpu_peak > gpu_budget:
            verdicts.append(
                f"over GPU budget on {device}: {format_size(gpu_peak)} > --gpu-budget={format_limit(gpu_budget)}"
            )
    return verdicts


def shell_exit_code(returncode: int) -> int:
    """The shell's exit code for a process that exited with ``returncode`` (128 + N for signal N)."""
    return 128 - returncode if returncode < 0 else returncode
