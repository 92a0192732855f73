"""A re-run that cannot see what the first run saw must not overturn it (``core.confirm``).

A test whose memory is in a process it starts, however short-lived, fails its budget on both
runs' figures: the wait for the process reads it (``probes.children``). Where a re-run still
reads less of a part than the first run did (a process that ended unread, a view not open, a
peak it could only sample), that part is the first run's, and the verdict stands, saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_tfmem.core.confirm import comparable_rerun
from pytest_tfmem.core.measure import Measurement, ViewReading
from pytest_tfmem.platforms import EXACT, SAMPLED
from pytest_tfmem.probes.children import UNREAD, ChildFigure, ChildrenReading

MIB = 2**20

# Each test's memory is in processes that live about 50 ms: a program it runs and waits for, a
# pool of forks that ends inside the test, a program a shell runs and waits for (a child of a
# child), and the same program in an isolated test. Each allocates 40 MiB; the budget is 30MB.
SHORT_LIVED = '''
import multiprocessing
import subprocess
import sys

import pytest

TOUCH_40_MIB = "block = bytearray(40 * 2**20); [block.__setitem__(i, 1) for i in range(0, len(block), 4096)]"


def touch(_):
    block = bytearray(40 * 2**20)
    for i in range(0, len(block), 4096):
        block[i] = 1
    return len(block)


def test_runs_a_program():
    subprocess.run([sys.executable, "-c", TOUCH_40_MIB], check=True)


def test_a_pool_that_ends_inside_it():
    with multiprocessing.get_context("fork").Pool(2) as pool:
        assert pool.map(touch, range(2)) == [40 * 2**20] * 2


def test_a_child_of_a_child():
    subprocess.run(["sh", "-c", f"{sys.executable} -c '{TOUCH_40_MIB}'; true"], check=True)


@pytest.mark.tfmem(isolate=True)
def test_isolated_runs_a_program():
    subprocess.run([sys.executable, "-c", TOUCH_40_MIB], check=True)
'''


@pytest.mark.parametrize("seed", [1, 2])
def test_processes_of_about_50_ms_fail_the_budget_on_both_runs_figures_in_any_order(
    pytester: pytest.Pytester, seed: int
) -> None:
    pytester.makepyfile(test_short=SHORT_LIVED)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("-p", "randomly", f"--randomly-seed={seed}", "--tfmem-budget=30MB",
                                           f"--tfmem-report={report}")
    result.assert_outcomes(failed=4)
    tests = {test["nodeid"].split("::")[-1]: test for test in json.loads(report.read_text())["tests"]}
    assert len(tests) == 4
    for name, test in tests.items():
        confirmation = test["confirmation"]
        assert confirmation is not None, name
        # 40 MiB in each process: a pool's two workers may hold theirs at once
        assert confirmation["reproduced"] is True, (name, confirmation)
        assert confirmation["first_peak"] >= 40 * MIB and confirmation["rerun_peak"] >= 40 * MIB, (name, confirmation)
        assert "process" in confirmation["first_parts"] and "process" in confirmation["rerun_parts"], confirmation
    result.stdout.fnmatch_lines(["tfmem: reproduced by a re-run in the same process: first run *.* MiB, re-run *.* MiB"])


# The first run starts a program that lives 0.3 s, which its wait reads; the re-run starts the
# same program through the C library's ``system()``, which reaps it without ``os.waitpid``, while the
# watch's thread looks only once a minute (conftest): the re-run cannot read it.
UNSEEN_IN_THE_RERUN = '''
import os
import subprocess
import sys

RUNS = []
PROGRAM = "import time\\nblock = bytearray(40 * 2**20)\\nfor i in range(0, len(block), 4096): block[i] = 1\\ntime.sleep({})\\n"


def test_its_process_is_unread_in_the_rerun():
    RUNS.append(1)
    if len(RUNS) == 1:
        subprocess.run([sys.executable, "-c", PROGRAM.format(0.3)], check=True)
    else:
        with open("program.py", "w") as program:
            program.write(PROGRAM.format(0.02))
        assert os.system(f"{sys.executable} program.py") == 0
'''

LOOKS_ONCE_A_MINUTE = '''
from pytest_tfmem.probes import children

children.LOOK_S = 60.0
'''


def test_a_re_run_that_cannot_read_the_process_the_first_run_read_does_not_overturn_the_verdict(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_unseen=UNSEEN_IN_THE_RERUN)
    pytester.makeconftest(LOOKS_ONCE_A_MINUTE)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("--tfmem-budget=30MB", f"--tfmem-report={report}")
    result.assert_outcomes(failed=1)
    test = json.loads(report.read_text())["tests"][0]
    confirmation = test["confirmation"]
    assert confirmation["reproduced"] is True
    assert confirmation["taken_from_first_run"] == ["the 1 process the first run read (the re-run read none of them)"]
    assert "process" in confirmation["first_parts"] and "process" not in confirmation["rerun_parts"]
    assert test["measurement"]["children"]["processes"][0]["peak"] >= 40 * MIB  # the first run's figures stand
    result.stdout.fnmatch_lines([
        "tfmem: reproduced by a re-run in the same process: first run 5?.? MiB, re-run 5?.? MiB with the first run's "
        "figures for what it could not read",
        "*",
        "re-run in the same process to confirm (budget): it reproduced (first run 5?.? MiB (host RSS *, 1 process it "
        "started 5?.? MiB), re-run 5?.? MiB (host RSS *)); the re-run could not read the 1 process the first run read "
        "(the re-run read none of them): those parts are the first run's",
    ])


def _measurement(host: int, *, children: ChildrenReading | None = None, method: str = EXACT,
                 tf: int | None = None, mixed: int | None = None) -> Measurement:
    views = [ViewReading("host", 100 * MIB, 100 * MIB + host, 100 * MIB)]
    if tf is not None:
        views.append(ViewReading("tf:CPU:0", 0, tf, 0))
    return Measurement(tuple(views), 0.1, method, mixed=mixed, mixed_interval_s=0.001 if mixed else None,
                       children=children)


def _process(peak: int, read: bool = True) -> ChildFigure:
    return ChildFigure(42, "python train.py" if read else UNREAD, peak if read else 0, False, 0, "exited with 0", False)


def test_a_part_the_re_run_read_as_fully_stays_the_re_runs_and_one_it_read_less_fully_is_the_first_runs() -> None:
    one = ChildrenReading((_process(50 * MIB),), 50 * MIB, "one at a time", 50 * MIB)
    unread = ChildrenReading((_process(0, read=False),), 0, "one at a time", 0)
    # read as fully: the re-run's own figures, a one-time cost still told apart
    same = comparable_rerun(_measurement(60 * MIB, children=one), _measurement(MIB, children=one))
    assert same.taken == () and same.measurement.peak == 51 * MIB
    # the process ended unread in the re-run (or was not seen at all): the first run's processes
    for again in (_measurement(MIB, children=unread), _measurement(MIB)):
        taken = comparable_rerun(_measurement(MIB, children=one), again)
        assert taken.measurement.peak == 51 * MIB and taken.measurement.host == MIB
        assert taken.taken == ("the 1 process the first run read (the re-run read none of them)",)
    # a view the re-run did not open; a host peak it could only sample
    view = comparable_rerun(_measurement(MIB, tf=80 * MIB), _measurement(MIB))
    assert view.measurement.peak == 80 * MIB and view.taken == ("the tf:CPU:0 view (not open in the re-run)",)
    sampled = comparable_rerun(_measurement(70 * MIB), _measurement(2 * MIB, method=SAMPLED))
    assert sampled.measurement.peak == 70 * MIB and sampled.measurement.method == EXACT
    # host and tensors held at once, sampled in the first run only
    mixed = comparable_rerun(_measurement(30 * MIB, tf=30 * MIB, mixed=60 * MIB), _measurement(30 * MIB, tf=30 * MIB))
    assert mixed.measurement.peak == 60 * MIB and len(mixed.taken) == 1


def test_the_section_of_an_overturned_verdict_names_what_each_run_read(pytester: pytest.Pytester,
                                                                      tmp_path: Path) -> None:
    pytester.makepyfile(test_once='''
        import numpy as np
        CACHE = []

        def test_fills_a_cache_once():
            if not CACHE:
                CACHE.append(np.ones(60 * 2**20, dtype=np.uint8))
    ''')
    result = pytester.runpytest("--tfmem-budget=40MB", "-rA")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "re-run in the same process to confirm (budget): it did not reproduce (first run 6?.? MiB (host RSS 6?.? MiB), "
        "re-run * (host RSS *)); the verdict is the re-run's, *",
    ])


DATA_LOADER_WORKERS = '''
import torch
from torch.utils.data import DataLoader, Dataset


class Decoded(Dataset):
    """Each item decodes 40 MiB in the worker that loads it, and hands back a small tensor."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        block = torch.ones(10 * 2**20, dtype=torch.float32)
        return block[:4].clone()


def test_loads_with_two_workers():
    batches = list(DataLoader(Decoded(), batch_size=2, num_workers=2))
    assert len(batches) == 2
'''


def test_pytorch_data_loader_workers_that_end_inside_the_test_fail_it_on_both_runs(pytester: pytest.Pytester) -> None:
    pytest.importorskip("torch")
    pytester.makepyfile(test_loader=DATA_LOADER_WORKERS)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("--tfmem-budget=30MB", f"--tfmem-report={report}")
    result.assert_outcomes(failed=1)
    confirmation = json.loads(report.read_text())["tests"][0]["confirmation"]
    assert confirmation["reproduced"] is True and confirmation["taken_from_first_run"] == []
    assert "processes it started" in confirmation["first_parts"] and "processes it started" in confirmation["rerun_parts"]
    assert confirmation["rerun_peak"] >= 40 * MIB
