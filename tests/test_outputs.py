"""No file is lost to an output: every option and command that writes a file refuses one that is
not already a tfmem file of that kind, above all the test file a space put in place of ``=``
(``pytest --tfmem-report tests/test_typo.py`` takes the test for the report's path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_tfmem.core.measure import Measurement, ViewReading
from pytest_tfmem.core.record import TestRecord
from pytest_tfmem.core.retained import Level, Retained, SessionAccount
from pytest_tfmem.core.summary import result_word, summary_rows
from pytest_tfmem.core.verdict import Verdict
from pytest_tfmem.session.summary import native_lines

MIB = 2**20

pytestmark = pytest.mark.any_os  # no TensorFlow, any system (.github/workflows/tests.yml)

TESTS = """
def test_one():
    assert sum(range(10)) == 45
"""

# Each pytest option that writes a file, and what the file is called in its message.
WRITERS = {
    "report": "report",
    "markdown": "Markdown summary",
    "save-baseline": "baseline",
    "results": "results journal",
    "history": "memory history",
}


@pytest.mark.parametrize("option", sorted(WRITERS))
def test_a_space_instead_of_equals_leaves_the_test_file_alone(pytester: pytest.Pytester, option: str):
    pytester.makepyfile(test_typo=TESTS)
    kept = (pytester.path / "test_typo.py").read_bytes()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tfmem-{option}", "test_typo.py")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        f"ERROR: pytest-tfmem: --tfmem-{option} would write the {WRITERS[option]} over {pytester.path / 'test_typo.py'}: "
        f"it is Python source, not a pytest-tfmem {WRITERS[option]}; it was left unchanged. Give it a path of its own: "
        f"--tfmem-{option}=PATH (after a space, the next argument is taken for the path)"
    ])
    assert (pytester.path / "test_typo.py").read_bytes() == kept
    assert not (pytester.path / ".tfmem").exists()  # no test ran


@pytest.mark.parametrize("option", ["report", "markdown", "results"])
def test_a_file_of_another_kind_is_refused_and_one_of_its_own_kind_replaced(pytester: pytest.Pytester, option: str):
    pytester.makepyfile(test_one=TESTS)
    notes = pytester.path / "notes.txt"
    notes.write_text("my notes\n")
    refused = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tfmem-{option}=notes.txt")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines([f"*over {notes}: it exists and is not a pytest-tfmem {WRITERS[option]}; it was left unchanged.*"])
    assert notes.read_text() == "my notes\n"
    output = pytester.path / "output"
    for _ in range(2):  # the second run replaces what the first wrote
        pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tfmem-{option}=output").assert_outcomes(passed=1)
    assert output.stat().st_size > 0


def test_the_baseline_to_save_into_is_refused_in_detail_by_its_reader(pytester: pytest.Pytester):
    """A baseline is merged into: an existing file is read first, and a bad one named with its problem."""
    pytester.makepyfile(test_one=TESTS)
    (pytester.path / "notes.json").write_text('{"mine": 1}\n')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-save-baseline=notes.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*notes.json*not a pytest-tfmem baseline*left unchanged*"])
    assert (pytester.path / "notes.json").read_text() == '{"mine": 1}\n'


def test_a_path_the_session_was_given_to_collect_is_refused(pytester: pytest.Pytester):
    pytester.makepyfile(test_one=TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-report=report.json").assert_outcomes(passed=1)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-report=report.json", "report.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tfmem-report would write the report over *report.json: the session was given it to collect*"])


def tfmem(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", *args], cwd=folder, capture_output=True,
                          text=True, timeout=120)


def test_the_commands_refuse_to_write_over_a_file_of_another_kind(pytester: pytest.Pytester):
    pytester.makepyfile(test_one=TESTS)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-report=report.json").assert_outcomes(passed=1)
    kept = (pytester.path / "test_one.py").read_bytes()
    (pytester.path / "script.py").write_text("open('ran', 'w').close()\n")
    for command, flag in (
        (["plot", "report.json", "-o", "test_one.py"], "--output"),
        (["merge", "-o", "test_one.py", "report.json"], "--output"),
        (["run", "--report", "test_one.py", "script.py"], "--report"),
        (["run", "--plot", "test_one.py", "script.py"], "--plot"),
        (["history", "history.jsonl", "--html", "test_one.py"], "--html"),
    ):
        done = tfmem(pytester.path, *command)
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert f"tfmem: error: {flag} would write the" in done.stderr and "test_one.py: it is Python source" in done.stderr
        assert (pytester.path / "test_one.py").read_bytes() == kept
    assert not (pytester.path / "ran").exists()  # refused before the script ran


GIT = ("git", "-c", "user.email=t@example.com", "-c", "user.name=t")


def checkout(pytester: pytest.Pytester) -> None:
    """The test module committed in a git checkout: ``--tfmem-history`` keys a session by its commit."""
    pytester.makepyfile(test_one=TESTS)
    for args in (("init", "-q"), ("add", "test_one.py"), ("commit", "-qm", "one")):
        subprocess.run([*GIT, *args], cwd=pytester.path, check=True, capture_output=True)


# Every pytest option that writes a file at a path of the user's, and the file it names.
OUTPUTS = {"report": "out.json", "markdown": "out.md", "save-baseline": "baseline.json", "history": "history.jsonl"}


@pytest.mark.parametrize("option", sorted(OUTPUTS))
def test_missing_directories_of_an_output_are_made_as_junitxml_makes_them(pytester: pytest.Pytester, option: str):
    checkout(pytester)
    path = pytester.path / "no" / "such" / OUTPUTS[option]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tfmem-{option}={path}")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK and path.stat().st_size > 0


@pytest.mark.parametrize("option", sorted(OUTPUTS))
def test_a_path_that_cannot_be_written_is_a_usage_error_before_any_test_runs(pytester: pytest.Pytester, option: str):
    checkout(pytester)
    (pytester.path / "taken").write_text("a file where a directory would be\n")
    path = pytester.path / "taken" / "sub" / OUTPUTS[option]
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tfmem-{option}={path}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-tfmem: --tfmem-{option} cannot write the * to {path}: "
                                 f"{pytester.path / 'taken'} is a file, not a directory"])
    assert "test_one.py" not in result.stdout.str()  # not a test ran
    assert (pytester.path / "taken").read_text() == "a file where a directory would be\n"


# Takes the output's directory away while the tests run, and leaves a file where it was: nothing
# can be written under it, not even by a writer that makes missing directories.
REMOVES_GONE = """

def test_two():
    import shutil
    shutil.rmtree("gone")
    open("gone", "w").close()
"""


def run_losing_the_directory(pytester: pytest.Pytester, option: str, name: str) -> tuple[pytest.RunResult, Path]:
    """Run ``--tfmem-OPTION=gone/NAME`` while a test takes ``gone`` away: the tests pass, the
    session fails on the output it could not write; the result, and where the output was set aside."""
    pytester.makepyfile(test_one=TESTS + REMOVES_GONE)
    (pytester.path / "gone").mkdir()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", f"--tfmem-{option}=gone/{name}")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    return result, pytester.path / ".tfmem" / "unwritten" / name


def test_an_output_that_fails_at_the_end_goes_to_the_tfmem_directory_and_the_exit_code_says_so(
    pytester: pytest.Pytester,
):
    """The directory is taken away while the tests run: the report is not lost."""
    result, kept = run_losing_the_directory(pytester, "report", "report.json")
    result.stdout.fnmatch_lines([f"tfmem: could not write the JSON report to *gone/report.json: *; written to {kept} instead"])
    assert '"test_one.py::test_two"' in kept.read_text()


def test_a_history_line_that_cannot_be_added_at_the_end_is_kept_for_tfmem_merge(pytester: pytest.Pytester):
    """The history's directory is taken away while the tests run: the session's line is not lost."""
    checkout(pytester)
    result, kept = run_losing_the_directory(pytester, "history", "history.jsonl")
    result.stdout.fnmatch_lines([f"tfmem: could not add to the memory history *gone/history.jsonl: *; written to "
                                 f"{kept} instead (tfmem merge folds it into the history)"])
    merged = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "merge", "-o", "history.jsonl", str(kept)],
                            cwd=pytester.path, capture_output=True, text=True)
    assert merged.returncode == 0, merged.stderr
    assert '"test_one.py::test_two"' in (pytester.path / "history.jsonl").read_text()


def test_the_commands_make_missing_directories_and_refuse_a_path_they_cannot_write(pytester: pytest.Pytester):
    checkout(pytester)
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "--tfmem-report=report.json",
                                  "--tfmem-history=history.jsonl").assert_outcomes(passed=1)
    (pytester.path / "taken").write_text("mine\n")
    for command, made in (
        (["history", "history.jsonl", "--html", "{}/page.html"], "page.html"),
        (["merge", "-o", "{}/baseline.json", "report.json"], "baseline.json"),
        (["plot", "report.json", "-o", "{}/memory.png"], "memory.png"),
    ):
        done = tfmem(pytester.path, *(part.format("new/dir") for part in command))
        assert done.returncode == 0, (command, done.stderr)
        assert (pytester.path / "new" / "dir" / made).stat().st_size > 0
        refused = tfmem(pytester.path, *(part.format("taken/dir") for part in command))
        assert refused.returncode == 2 and "taken is a file, not a directory" in refused.stderr, refused.stderr
    assert (pytester.path / "taken").read_text() == "mine\n"


@pytest.mark.parametrize(("check", "said"), [("history", "over its history"), ("baseline", "over its baseline"),
                                             ("budget", "over budget"), ("my_own", "failed")])
def test_a_failed_checks_row_says_which_check_before_the_report_says_failed(check: str, said: str) -> None:
    """The table in a failed test's section is made before its report has an outcome."""
    record = TestRecord("t.py::test_x", Measurement((ViewReading("host", 0, 16 * MIB, 16 * MIB),), 0.1))
    record.verdicts = [Verdict(check, False, "over")]
    (header, row) = summary_rows([record], 1)
    assert row[header.index("result")] == said


def test_an_expected_failure_says_what_failed_in_every_table() -> None:
    """The heaviest tests' table and the isolated tests' both read ``result_word``."""
    record = TestRecord("t.py::test_x", Measurement((ViewReading("host", 0, 16 * MIB, 16 * MIB),), 0.1))
    record.verdicts, record.outcome = [Verdict("budget", False, "over")], "xfailed"
    assert result_word(record) == "xfailed (over budget)"
    assert result_word(record, death="killed at kill_at") == "xfailed (killed at kill_at)"
    record.outcome = "failed"
    assert result_word(record) == "over budget"


def test_the_native_memory_line_says_whose_memory_was_weighed() -> None:
    """Not ``... of the 415.4 MiB that 9 tests weighed kept``."""
    account = SessionAccount()
    account.add("t.py::test_a", Retained(Level(100 * MIB), Level(150 * MIB), seq=1, named_bytes=2 * MIB))
    (line,) = native_lines(account)
    assert line.startswith("most of it is native memory: of the 50.0 MiB kept by the 1 test whose objects were "
                           "weighed, the objects named account for 2.0 MiB; ")
