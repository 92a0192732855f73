"""pytest-xdist workers and memory, the pytest side.

``--tfmem-workers=fit`` (ini ``tfmem_workers = fit``): ``-n auto`` / ``-n logical`` start as
many workers as the memory holds, at most xdist's own count (one per CPU); the session header
shows the count and the arithmetic. With an explicit ``-n N`` that does not fit, one warning
says so with the same arithmetic. Without the option, xdist's count is left alone and
nothing is measured. In the controller, a worker that dies mid-test gets tfmem's account on
its test's report (``crash.py``) when tfmem watched that test (its journal has it) or the
option is on.
"""

from __future__ import annotations

import psutil
import pytest

from pytest_tfmem.core import processes, settings
from pytest_tfmem.errors import MemoryLimitWarning
from pytest_tfmem.journal.format import results_path
from pytest_tfmem.probes import host, system
from pytest_tfmem.workers.crash import CrashAccount, OomKillCounter, journal_readings, worker_returncode
from pytest_tfmem.workers.fit import WorkerFit
from pytest_tfmem.workers.probe import ProbeFailed, measure_worker, probing

FIT = "fit"
OFF = "off"
_PLAN = pytest.StashKey["WorkerFit | None"]()  # the fit, once measured (None: it could not be)
_AUTO = pytest.StashKey[str]()  # "auto" or "logical": xdist asked tfmem for the count
_WARNINGS = pytest.StashKey[list[str]]()


def parse_workers(value: object, what: str) -> str:
    text = str(value).strip().lower()
    if text not in (FIT, OFF):
        raise ValueError(
            f"invalid {what} {value!r}: expected 'fit' (-n auto starts as many pytest-xdist workers as "
            f"the memory holds) or 'off' (xdist's own count)"
        )
    return text


WORKERS = settings.Option(
    "workers",
    "'fit': with pytest-xdist's -n auto, start as many workers as the memory limit holds (at most one "
    "per CPU), and warn when an explicit -n N does not fit; 'off' (default): leave the count to xdist",
    parse_workers,
    OFF,
)


def pytest_addoption(parser: pytest.Parser) -> None:
    settings.add_options(parser, [WORKERS])


def _opted_in(config: pytest.Config) -> bool:
    return bool(settings.read_option(config, WORKERS)[0] == FIT)


def plan(config: pytest.Config, cpus: int) -> WorkerFit | None:
    """Measure a worker and fit the workers into memory, once per session; ``None`` (with a
    warning kept for ``pytest_configure``) when it cannot be done."""
    if _PLAN in config.stash:
        return config.stash[_PLAN]
    fit = None
    warnings = config.stash.setdefault(_WARNINGS, [])
    try:
        probe = measure_worker(config)
    except ProbeFailed as error:
        warnings.append(f"pytest-tfmem: --tfmem-workers=fit could not measure a worker: {error}")
    else:
        need = probe.largest_need()
        if need is None:
            warnings.append(
                "pytest-tfmem: --tfmem-workers=fit: no collected test has a budget (--tfmem-budget or "
                "@pytest.mark.tfmem(budget=...)) or a baseline peak (--tfmem-baseline), so what a worker "
                "needs is unknown: the worker count is xdist's own"
            )
        else:
            fit = WorkerFit(
                limit=system.applicable_memory_limit(),
                available=psutil.virtual_memory().available,
                controller_rss=host.current_rss(),
                worker_baseline=probe.rss,
                need=need,
                cpus=cpus,
                baseline_source=probe.describe(),
            )
    config.stash[_PLAN] = fit
    return fit


@pytest.hookimpl(tryfirst=True, optionalhook=True)  # before pytest-xdist's own answer (first result wins)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """pytest-xdist asks how many workers ``-n auto`` starts: as many as fit, with the option."""
    if probing(config) or not _opted_in(config):
        return None  # the probe measures a worker: it starts no probe of its own
    config.stash[_AUTO] = str(config.option.numprocesses)
    fit = plan(config, _xdist_count(config))
    return fit.count if fit is not None else None


def _xdist_count(config: pytest.Config) -> int:
    """What pytest-xdist itself starts for ``-n auto`` / ``-n logical``: one worker per CPU."""
    from xdist.plugin import pytest_xdist_auto_num_workers as xdist_count

    return int(xdist_count(config))


def pytest_configure(config: pytest.Config) -> None:
    if processes.role(config).writes_session_outputs:  # the session's own process (xdist's controller)
        config.pluginmanager.register(TfmemWorkers(config), "tfmem-workers")


class TfmemWorkers:
    """The controller's side: the header, the warnings, and crashed workers' accounts."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.opted_in = _opted_in(config)
        self.auto = config.stash.get(_AUTO, None)
        requested = getattr(config.option, "numprocesses", None)
        if self.opted_in and not self.auto and isinstance(requested, int) and requested > 0:
            fit = plan(config, _xdist_count(config))
            message = fit.explicit_warning(requested) if fit is not None else None
            if message:
                config.issue_config_time_warning(MemoryLimitWarning(message), stacklevel=2)
        for message in config.stash.get(_WARNINGS, []):
            config.issue_config_time_warning(pytest.PytestWarning(message), stacklevel=2)
        self.oom_kills: OomKillCounter | None = None

    def pytest_report_header(self) -> list[str]:
        fit = self.config.stash.get(_PLAN, None)
        if not self.auto or fit is None:
            return []
        return [fit.auto_line(self.auto), fit.detail_line()]

    def pytest_sessionstart(self) -> None:
        if self.config.pluginmanager.hasplugin("dsession"):  # a pytest-xdist controller: workers may crash
            self.oom_kills = OomKillCounter()

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport) -> None:
        """pytest-xdist: a worker died running ``crashitem``; add tfmem's account to its report
        (the hook's ``sched`` argument, for rescheduling the test, is not needed)."""
        node = getattr(report, "node", None)
        worker = str(getattr(getattr(node, "gateway", None), "id", "?"))
        journal, _ = results_path(self.config)
        readings = journal_readings(journal, processes.session(self.config).id, worker, crashitem)
        if readings is None and not self.opted_in:
            return  # tfmem did not watch this test
        returncode = worker_returncode(node)
        oom_kills = self.oom_kills.kills_for_crash() if self.oom_kills is not None else None
        account = CrashAccount(worker, returncode, oom_kills, readings, system.applicable_memory_limit())
        if self.oom_kills is not None and account.signal is not None and oom_kills:
            self.oom_kills.attribute()
        report.longrepr = "\n".join([str(report.longrepr), *account.lines()])
