"""What each test leaves behind, on real pytest runs: retained figures, fixtures booked by name,
the session's account (terminal, JSON report, ``tfmem show``, ``tfmem plot --session``),
``--tfmem-max-retained`` and ``--tfmem-clear-session``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import forked_sessions
import pytest
from report_helpers import Run

from pytest_tfmem.session.plugin import HOW_TO_READ

MIB = 2**20
# What a test that keeps nothing may still read: pytest's own reports, a page here and there.
NOISE = 2 * MIB

SUITE = """
    import numpy as np
    import pytest

    _CACHE = []
    KEPT = []

    @pytest.fixture(scope="module")
    def big_table():
        table = np.ones(40 * 2**20 // 8)
        yield table
        del table

    def test_warms_up():
        pass

    @pytest.mark.tfmem(max_retained=None)  # exempt from --tfmem-max-retained=50MB
    def test_keeps_a_cache():
        _CACHE.append(np.ones(60 * 2**20 // 8))

    def test_uses_the_table(big_table):
        assert big_table.sum() > 0

    def test_frees_what_it_made():
        block = np.ones(30 * 2**20 // 8)
        del block

    @pytest.mark.tfmem(max_retained="10MB")
    def test_keeps_too_much():
        KEPT.append(np.ones(20 * 2**20 // 8))

    def test_imports_a_module():
        import heavy_module  # keeps 30 MiB: the import's, not the test's

    def test_uses_the_table_last(big_table):
        pass
"""
HEAVY_MODULE = """
import numpy as np

DATA = np.ones(30 * 2**20 // 8)
"""


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return forked_sessions.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=folder, framework=False
    )


@pytest.fixture(scope="module")
def numpy_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    folder = tmp_path_factory.mktemp("session")
    (folder / "test_suite.py").write_text(textwrap.dedent(SUITE))
    (folder / "heavy_module.py").write_text(HEAVY_MODULE)
    done = _run(
        folder, "test_suite.py", "--tfmem-report=report.json", "--tfmem-max-retained=50MB", "--tfmem-clear-session"
    )
    return Run(folder, done.returncode, done.stdout + done.stderr, json.loads((folder / "report.json").read_text()))


def test_a_test_that_fills_a_module_cache_is_named_with_what_stayed(numpy_run: Run):
    cache = numpy_run.entry("test_keeps_a_cache")
    assert abs(cache["retained_bytes"] - 60 * MIB) < NOISE, cache["retained_bytes"]
    assert abs(cache["retained_host_bytes"] - 60 * MIB) < NOISE and cache["retained_tf_bytes"] == 0
    stayed = "; ".join(cache["retained"]["stayed"])
    assert "list '_CACHE' (global of test_suite) +1 item: ndarray 60.0 MiB" in stayed
    for name in ("test_frees_what_it_made", "test_uses_the_table", "test_uses_the_table_last", "test_imports_a_module"):
        assert abs(numpy_run.entry(name)["retained_bytes"]) < NOISE, name
        assert numpy_run.entry(name)["retained"]["stayed"] == []  # under the threshold: nothing to say


def test_a_module_fixture_is_booked_to_the_fixture_by_name_not_to_tests(numpy_run: Run):
    (worker,) = numpy_run.report["session"]["workers"]
    bookings = {(b["name"], b["detail"]): b for b in worker["fixtures"]}
    setup = bookings["big_table (module scope)", "setup"]
    teardown = bookings["big_table (module scope)", "teardown"]
    assert setup["test"].endswith("::test_uses_the_table") and teardown["test"].endswith("::test_uses_the_table_last")
    assert abs(setup["bytes"] - 40 * MIB) < NOISE and abs(teardown["bytes"] + 40 * MIB) < NOISE


def test_a_first_import_in_a_test_is_booked_to_the_import(numpy_run: Run):
    (worker,) = numpy_run.report["session"]["workers"]
    (heavy,) = [b for b in worker["imports"] if b["name"] == "heavy_module"]
    assert heavy["test"].endswith("::test_imports_a_module") and abs(heavy["bytes"] - 30 * MIB) < NOISE


def test_retained_figures_and_bookings_add_up_to_the_sessions_growth(numpy_run: Run):
    session = numpy_run.report["session"]
    (worker,) = session["workers"]
    assert worker["worker"] is None and worker["tests"] == 7
    parts = ("tests_retained_bytes", "fixtures_bytes", "imports_bytes", "runtime_bytes", "first_use_bytes",
             "reruns_bytes", "tf_pool_free_growth_bytes", "between_tests_bytes")  # fmt: skip
    assert session["end_bytes"] - session["start_bytes"] == session["growth_bytes"] == sum(session[p] for p in parts)
    assert session["tests_retained_bytes"] == sum(t["retained_bytes"] for t in numpy_run.report["tests"])
    # What the suite keeps for good: the cache (60 MiB), the list (20 MiB, and 20 MiB more in the re-run
    # that confirmed it: booked apart), the module (30 MiB), within 4 MiB
    assert abs(session["growth_bytes"] - 130 * MIB) < 4 * MIB, session["growth_bytes"]
    assert abs(session["reruns_bytes"] - 20 * MIB) < NOISE
    assert abs(session["imports_bytes"] - 30 * MIB) < NOISE
    assert session["explained_share"] == 1.0  # every test measured: nothing grew between them


def test_the_terminal_gives_the_account_and_the_clear_session_line(numpy_run: Run):
    lines = numpy_run.output.splitlines()
    start = lines.index(next(line for line in lines if "tfmem: what the tests left behind" in line))
    assert lines[start + 1] == HOW_TO_READ  # what the account's figures are, before them
    section = lines[start + 2 :]
    assert section[0].startswith("process ") and "over 7 measured tests: tests +" in section[0], section[0]
    assert "fixtures +" in section[0] and "first imports +30." in section[0] and "100% explained" in section[0]
    assert section[1] == "who left the most:"
    assert section[2].startswith("  test test_suite.py::test_keeps_a_cache +6")
    assert "list '_CACHE' (global of test_suite) +1 item: ndarray 60.0 MiB" in section[2]
    assert any(line.startswith("  fixture big_table (module scope) ") and "held +40.0 MiB" in line for line in section)
    clearing = next(line for line in section if line.startswith("--tfmem-clear-session freed "))
    growth = section[0].split(" (", 1)[1].split(")", 1)[0]  # the process line's net growth: (+140.7 MiB)
    assert f" in 7 clearings (their sum); the process grew {growth}" in clearing, (clearing, section[0])
    assert numpy_run.report["session"]["cleared_bytes"] is not None


def test_max_retained_fails_the_test_as_an_error_at_its_teardown(numpy_run: Run):
    assert numpy_run.returncode == pytest.ExitCode.TESTS_FAILED
    assert "ERROR at teardown of test_keeps_too_much" in numpy_run.output
    assert "7 passed, 1 error" in numpy_run.output  # the test passed; its teardown is the error
    message = next(line for line in numpy_run.output.splitlines() if "tfmem: retained " in line)
    assert "> max_retained 10MB (9.5 MiB) after the teardown" in message and "list 'KEPT' (global of test_suite)" in message
    assert ("tfmem: reproduced by a re-run in the same process: its call kept +20.0 MiB in the first run, +20.0 MiB "
            "in the re-run") in numpy_run.output
    verdicts = {v["check"]: v["ok"] for v in numpy_run.entry("test_keeps_too_much")["verdicts"]}
    assert verdicts["max_retained"] is False
    assert numpy_run.entry("test_keeps_a_cache")["outcome"] == "passed"  # exempt by its marker


def test_tfmem_show_lists_the_retained_column_and_plot_session_writes_a_png(numpy_run: Run):
    shown = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "show", "report.json"],
                           cwd=numpy_run.folder, capture_output=True, text=True, check=True).stdout.splitlines()
    header = next(line for line in shown if line.startswith("test "))
    assert header.split()[-2:] == ["retained", "result"]
    cache = next(line for line in shown if line.startswith("test_suite.py::test_keeps_a_cache"))
    assert cache.split()[-3:-1] == ["+60.0", "MiB"] or cache.split()[-3].startswith("+6")
    plotted = subprocess.run(
        [sys.executable, "-m", "pytest_tfmem.cli.main", "plot", "report.json", "--session", "-o", "session.png"],
        cwd=numpy_run.folder, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert plotted.returncode == 0, plotted.stderr
    assert plotted.stdout.strip() == "session.png: the process after each of 7 test(s)"
    assert (numpy_run.folder / "session.png").read_bytes().startswith(b"\x89PNG")


def test_a_baseline_records_retained_figures_and_a_test_that_starts_leaking_regresses(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    pytester.makepyfile(test_leaky="""
        import os
        import numpy as np
        KEPT = []
        def test_leaky():
            if os.environ.get("LEAK"):
                KEPT.append(np.ones(40 * 2**20 // 8))
    """)
    saved = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-save-baseline=base.json")
    assert saved.ret == 0
    entry = json.loads((pytester.path / "base.json").read_text())["tests"]["test_leaky.py::test_leaky"]
    assert 0 <= entry["retained"] < NOISE
    monkeypatch.setenv("LEAK", "1")
    leaked = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-baseline=base.json")
    assert leaked.ret == pytest.ExitCode.TESTS_FAILED
    leaked.assert_outcomes(failed=1)  # one outcome: the call failed, naming both figures
    leaked.stdout.fnmatch_lines(["tfmem: peak 40.* MiB vs baseline *", "tfmem: retained 40.* MiB vs baseline *"])


def test_under_xdist_each_worker_has_its_account_merged_at_the_controller(pytester: pytest.Pytester):
    pytester.makepyfile(test_two="""
        import numpy as np
        KEPT = []
        def test_one():
            KEPT.append(np.ones(40 * 2**20 // 8))
        def test_two():
            KEPT.append(np.ones(40 * 2**20 // 8))
    """)
    done = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--tfmem-report=report.json")
    assert done.ret == 0
    session = json.loads((pytester.path / "report.json").read_text())["session"]
    workers = {worker["worker"]: worker for worker in session["workers"]}
    assert sorted(workers) == ["gw0", "gw1"] and all(w["tests"] == 1 for w in workers.values())
    assert session["start_bytes"] == sum(w["start_bytes"] for w in workers.values())
    assert all(abs(w["tests_retained_bytes"] - 40 * MIB) < NOISE for w in workers.values())
    lines = done.stdout.lines
    assert any(line.startswith("gw0: ") and "over 1 measured test: tests +" in line for line in lines)
    assert any(line.startswith("gw1: ") for line in lines)


TF_SUITE = """
    import keras
    import tensorflow as tf

    ALIVE = []

    def test_names_a_layer():
        assert keras.layers.Dense(2).name == "dense"

    def test_names_a_layer_again():  # "dense_1" unless Keras's session was cleared in between
        assert keras.layers.Dense(2).name == "dense"

    def test_makes_tensors_and_drops_them():
        block = tf.ones((20 * 2**20 // 4,))
        del block

    def test_keeps_a_tensor_alive():
        ALIVE.append(tf.ones((10 * 2**20 // 4,)))

    def test_drops_the_tensor():
        ALIVE.clear()
"""


def test_tensors_back_in_tensorflows_pool_do_not_count_and_live_ones_do_and_keras_is_cleared(tmp_path: Path):
    (tmp_path / "test_tf.py").write_text(textwrap.dedent(TF_SUITE))
    environment = {"TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_tf.py", "--tfmem-report=report.json",
         "--tfmem-clear-session"],
        cwd=tmp_path, capture_output=True, text=True, check=False, env={**__import__("os").environ, **environment},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads((tmp_path / "report.json").read_text())["tests"]}
    dropped, alive, cleared = (tests[name] for name in
                               ("test_makes_tensors_and_drops_them", "test_keeps_a_tensor_alive", "test_drops_the_tensor"))
    # 20 MiB went back to TensorFlow's pool: RSS kept it, but it is the pool's, free for reuse
    assert abs(dropped["retained_bytes"]) < NOISE, dropped["retained"]
    assert dropped["retained"]["after"]["tf_pool"] - dropped["retained"]["before"]["tf_pool"] >= 20 * MIB
    assert abs(alive["retained_tf_bytes"] - 10 * MIB) < NOISE and abs(alive["retained_host_bytes"]) < NOISE
    assert abs(cleared["retained_tf_bytes"] + 10 * MIB) < NOISE
    assert "--tfmem-clear-session freed " in done.stdout and " in 5 clearings (their sum); the process grew " in done.stdout


def test_the_resident_pool_grows_by_no_more_than_rss_did_and_never_shrinks():
    from pytest_tfmem.core.retained import Level, ResidentPool

    pool = ResidentPool()
    assert pool.level(Level(rss=600 * MIB, tf_in_use=0, tf_pool=2 * MIB)).tf_pool == 2 * MIB  # the first reading
    # a 20 MiB tensor raised the allocator's highest level by 32 MiB, RSS by 20 MiB
    assert pool.level(Level(620 * MIB, 0, 34 * MIB), keep=False).tf_pool == 22 * MIB
    grown = pool.level(Level(620 * MIB, 0, 34 * MIB))
    assert grown.tf_pool == 22 * MIB and grown.held == 598 * MIB
    assert pool.level(Level(610 * MIB, 10 * MIB, 34 * MIB)).tf_pool == 22 * MIB  # host freed, tensor alive


def test_reports_written_before_retained_figures_still_load_and_show(tmp_path: Path):
    from pytest_tfmem.core.record import session_account
    from pytest_tfmem.core.summary import summary_rows
    from pytest_tfmem.gates.reports import load_report

    old = {
        "format": "pytest-tfmem-report", "version": 1, "created": "2026-11-01T00:00:00+00:00", "exitstatus": 0,
        "environment": {}, "baseline": None, "summary": {},
        "tests": [{"nodeid": "t.py::test_a", "outcome": "passed", "budget": None, "verdicts": [], "extra": {},
                   "measurement": {"views": [{"view": "host", "start": 0, "peak": 5, "end": 0}], "duration_s": 0.1}}],
    }  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps(old))
    report = load_report(tmp_path / "old.json")
    assert report.tests[0].retained is None and session_account(report.tests).to_dict() is None
    assert "retained" not in summary_rows(report.tests, 10)[0]
    plotted = subprocess.run(
        [sys.executable, "-m", "pytest_tfmem.cli.main", "plot", "old.json", "--session", "-o", "s.png"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert plotted.returncode == 2 and "holds no retained figures" in plotted.stderr


LEAK_CHECK_THEN_PLAIN = """
import numpy as np

KEPT = []


def build():
    return [dict(a=i) for i in range(100)]


def test_a_leak_check(tfmem):
    tfmem.assert_no_leak(build, iterations=5, warmup=1, max_growth="1MB")


def test_appends_arrays():
    for _ in range(4):
        KEPT.append(np.ones(5 * 2**20 // 8))
"""


def test_a_leak_check_leaves_the_sessions_frozen_objects_out_of_the_books(pytester: pytest.Pytester):
    """The check thaws what the session's collector froze, to find what holds its growth; it
    freezes it again, so the objects of the session are not booked to the test, and what each test
    is said to have left adds up to no more than it retained."""
    pytester.makepyfile(test_books=LEAK_CHECK_THEN_PLAIN)
    report = pytester.path / "report.json"
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-budget=1GB",
                                           "--tfmem-stayed-threshold=100KB", f"--tfmem-report={report}")
    result.assert_outcomes(passed=2)
    tests = {test["nodeid"].split("::")[1]: test["retained"] for test in json.loads(report.read_text())["tests"]}
    check, plain = tests["test_a_leak_check"], tests["test_appends_arrays"]
    assert check["bytes"] < MIB and not any("new objects alive" in line for line in check["stayed"])
    assert plain["stayed"][0] == "list 'KEPT' (global of test_books) +4 items: ndarray 20.0 MiB"
    for retained in tests.values():
        assert retained["named_bytes"] <= retained["bytes"]
    assert sum(r["named_bytes"] for r in tests.values()) <= sum(r["bytes"] for r in tests.values())


def test_a_test_is_never_said_to_have_left_more_than_it_retained():
    from pytest_tfmem.session.stayed import Stayed

    stayed = Stayed(sized=("list 'KEPT' (global of test_x) +1 item: ndarray 60.0 MiB",), named_bytes=60 * MIB)
    assert stayed.lines(34 * MIB)[-1] == (
        "named 34.0 of 34.0 MiB; the holders above gained 60.0 MiB, more than the process grew: part of it "
        "reused memory freed before the test"
    )
    assert stayed.named_within(34 * MIB) == 34 * MIB and stayed.named_within(80 * MIB) == 60 * MIB


def _retained_series(count: int, worker: str | None = None):
    """``count`` tests' figures as a process would record them: each test starts where the last
    ended plus a little grown between them, and some leave a few MiB."""
    from pytest_tfmem.core.retained import Booking, Level, Retained

    entries, rss = [], 500 * MIB
    for seq in range(count):
        before = Level(rss + (seq % 3) * 4096, tf_in_use=seq % 5, tf_pool=8 * MIB)
        left = (seq % 11) * MIB // 4 - MIB  # some give back, some keep up to 1.5 MiB
        after = Level(before.rss + left, tf_in_use=before.tf_in_use, tf_pool=8 * MIB)
        bookings = (Booking("fixture", "table (module scope)", "setup", 2 * MIB),) if seq % 500 == 0 else ()
        retained = Retained(before, after, bookings, seq=seq, worker=worker, stayed=(f"list +{seq}",))
        entries.append((f"t.py::test[{seq}]", retained))
        rss = after.rss
    return entries


def test_the_books_fed_in_any_order_give_the_pairwise_figures_and_the_heaviest_tests():
    import random

    from pytest_tfmem.core.retained import SessionAccount

    entries = _retained_series(300, "gw0") + _retained_series(200, "gw1")
    shuffled = random.Random(7).sample(entries, len(entries))
    books = SessionAccount()
    for nodeid, retained in shuffled:
        books.add(nodeid, retained)
    for process in books.processes:
        ran = sorted((r for _, r in entries if r.worker == process.worker), key=lambda r: r.seq)
        assert process.tests == len(ran) and process.start == ran[0].before and process.end == ran[-1].after
        assert process.between_tests == sum(b.before.held - a.after.held for a, b in zip(ran, ran[1:]))
        assert process.between_tests != 0  # the series grows between tests: the sum is not trivially 0
        parts = (process.tests_bytes, process.booked_bytes("fixture"), process.pool_free_growth, process.between_tests)
        assert process.growth == sum(parts)  # the books balance
    every = sorted(((r.bytes, nodeid) for nodeid, r in entries), key=lambda e: (-e[0], e[1]))
    heaviest = [(r.bytes, r.name) for r in books.top_retainers(10, at_least=0) if r.kind == "test"]
    assert heaviest == every[: len(heaviest)] and len(heaviest) >= 8  # two fixtures may rank among them


def test_the_books_are_the_same_size_after_a_thousand_tests_and_after_twenty_thousand():
    import tracemalloc

    from pytest_tfmem.core.retained import SessionAccount

    entries = [(nodeid, retained) for nodeid, retained in _retained_series(20_000) if not retained.bookings]
    books = SessionAccount()
    tracemalloc.start()
    try:
        for nodeid, retained in entries[:1_000]:
            books.add(nodeid, retained)
        after_a_thousand = tracemalloc.get_traced_memory()[0]
        for nodeid, retained in entries[1_000:]:
            books.add(nodeid, retained)
        after_all = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert books.processes[0].tests == len(entries)
    assert after_all - after_a_thousand < 16 * 2**10, after_all - after_a_thousand  # a list of them: ~1 MiB more
