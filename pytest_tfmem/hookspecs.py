"""The hooks pytest-tfmem calls: only those several features implement, or users may.

Everything else a feature tells the core is a declaration or a registration, not a hook (see
``docs/development.md``, "How a feature plugs in"): its marker keywords and measuring markers
are a module constant ``TFMEM_DECLARATIONS`` (``core.features``); what one feature provides
for another (a test's known peak, more peak trackers, TensorFlow's device set-up) it registers
with the manager (``manager(config).known_peak``, ``.tracker_sources``, ``.runtime_setups``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_tfmem.core.record import TestRecord
    from pytest_tfmem.core.rerun import RerunUse
    from pytest_tfmem.core.verdict import Verdict


@pytest.hookspec
def pytest_tfmem_measure_all(config: pytest.Config) -> bool | None:
    """Return ``True`` when your feature's settings need every test measured (a baseline to
    compare with, a GPU budget, isolation...).

    When: once, when the first test is looked at. Implemented by: gates (a baseline or report
    option), gpu (a GPU budget or limit), isolate (isolation or ``kill_at``).
    """


@pytest.hookspec
def pytest_tfmem_check(item: pytest.Item, record: TestRecord, error: BaseException | None) -> Verdict | None:
    """Return a verdict on a measured test (budget, baseline regression, ...), or ``None``.

    ``error`` is what the test body raised (also for ``unittest.TestCase`` methods, whose
    errors unittest catches), or ``None``.

    When: right after the test's call phase, once its measurement window closed, beside the
    core's own budget check; a failed verdict fails the test. Implemented by: gates (the
    baseline), gpu (the GPU budget, a device out of memory), leaks (the ``tfmem_leak`` marker);
    a ``conftest.py`` may add its own.
    """


@pytest.hookspec
def pytest_tfmem_check_retained(item: pytest.Item, record: TestRecord) -> Verdict | None:
    """Return a verdict on what a measured test left behind (``record.retained``), or ``None``.

    When: after the test's teardown, once its retained figure is read. A failed verdict fails the
    test as an error at its teardown. Implemented by: the session feature (``--tfmem-max-retained``)
    and the gates (a baseline's retained figure).
    """



@pytest.hookspec
def pytest_tfmem_departure(item: pytest.Item, record: TestRecord) -> str | None:
    """Return why the test's figure should be measured again before it is kept (it lies above the
    test's recorded level by more than the floor: ``above its level in the memory history``; it
    would be the test's first record, above the floor: ``its first figure in the memory
    history``), or ``None``.

    When: right after the checks, for a test that passed them, and again on the re-run's figure:
    where that departs too and reads within a step of the first run, the figure stands; otherwise
    the re-run's is kept (``core.confirm``). Implemented by: gates (the memory history, the
    baseline a session compares with or merges into), the session feature (a call that kept more
    than the test's retained ceiling).
    """


@pytest.hookspec
def pytest_tfmem_retained_ceiling(item: pytest.Item) -> int | None:
    """Return the most the test may leave behind before a check on its retained figure fails
    (``--tfmem-max-retained``, a baseline's retained figure), or ``None``.

    When: as its call phase begins, so that a call that keeps more can be run again while its
    fixtures still stand, and what only the first run kept is booked as a one-time cost before
    the check at its teardown (``core.confirm``). Implemented by: the session feature and the gates.
    """


@pytest.hookspec
def pytest_tfmem_rerun_wanted(item: pytest.Item, record: TestRecord) -> RerunUse | None:
    """The test failed a tfmem check: return a ``RerunUse`` to take part in one re-run of its
    body (what it gives, the context it sets up around the body), or ``None``.

    When: right after the failed checks, before teardown. The body runs again once, however many
    features ask, inside every use's ``around`` (see ``core.rerun.RerunUse``); the same re-run
    confirms the failure or overturns it (``core.confirm``). Where that re-run still settles
    (``core.confirm.still_settling``), one more run follows, outside the uses, and is judged.
    Implemented by: trace (the TensorBoard trace), explain (the memory-by-line table).
    """


@pytest.hookspec
def pytest_tfmem_report_sections(item: pytest.Item, record: TestRecord) -> list[tuple[str, str]] | None:
    """Sections ``(title, text)`` your feature adds to a measured test's call report, below the
    core's ``tfmem`` section.

    When: just before the call report is made, once every feature has finished with the test's
    own run (and its one re-run): a record published now reaches it. For ``conftest.py`` files
    and other plugins: tfmem's own features add theirs with ``CallStep.sections`` (trace, explain),
    in ``Step`` order, above these.
    """
