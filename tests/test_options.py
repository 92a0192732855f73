"""On/off options: ``--tfmem-NAME`` (or ``--tfmem-NAME=VALUE``) turns on, ``--no-tfmem-NAME``
turns off, the command line beats the ini file, and of two switches the last one wins."""

from __future__ import annotations

import importlib
import os
import pkgutil

import pytest
from conftest import PLAIN_RUN_OPTIONS

import pytest_tfmem
from pytest_tfmem.core import settings

GROWTH_VARIABLE = "TF_FORCE_GPU_ALLOW_GROWTH"  # TensorFlow's, one of the variables a GPU option sets


def declared_options() -> dict[str, settings.Option]:
    """Every ``Option`` a module of the package declares, by name."""
    options = {}
    for module_info in pkgutil.walk_packages(pytest_tfmem.__path__, "pytest_tfmem."):
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if isinstance(value, settings.Option):
                options[value.name] = value
    return options


ON_OFF = sorted(name for name, option in declared_options().items() if option.parse is settings.parse_bool)


def test_the_on_off_options_are_found():
    assert {"isolate", "explain", "baseline_prune", "tf_warmup", "gpu_memory_growth"} <= set(ON_OFF)


def test_every_on_off_option_has_its_no_form_in_help(pytester: pytest.Pytester):
    result = pytester.runpytest("--help")
    assert result.ret == pytest.ExitCode.OK
    text = result.stdout.str()
    unwrapped = "".join(text.split())  # help lines are wrapped to the terminal's width
    for name in ON_OFF:
        cli = "--tfmem-" + name.replace("_", "-")
        assert f"--no-{cli[2:]}" in text.split(), name
        assert "".join(f"--no-{cli[2:]} turn {cli} off, whatever ini tfmem_{name} says".split()) in unwrapped, name
    # and only they have one: a size or a path cannot be "off"
    no_forms = {word.rstrip(",") for word in text.split() if word.startswith("--no-tfmem-")}
    assert no_forms == {"--no-tfmem-" + name.replace("_", "-") for name in ON_OFF}


def _switch_on(name: str) -> str:
    option = declared_options()[name]
    return option.cli if option.flag else f"{option.cli}=true"


@pytest.mark.parametrize("name", ON_OFF)
@pytest.mark.parametrize(
    ("ini", "arguments", "expected"),
    [
        ("true", ["off"], False),  # the command line beats the ini file
        ("false", ["on"], True),
        ("true", [], True),
        ("false", [], False),
        (None, ["on", "off"], False),  # the last switch wins
        (None, ["off", "on"], True),
        ("true", ["off", "on", "off"], False),
    ],
)
def test_the_command_line_beats_the_ini_file_and_the_last_switch_wins(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    ini: str | None,
    arguments: list[str],
    expected: bool,
):
    monkeypatch.setenv("PYTEST_ADDOPTS", PLAIN_RUN_OPTIONS)  # no -o of the suite's inner runs beats the ini file
    option = declared_options()[name]
    if ini is not None:
        pytester.makeini(f"[pytest]\n{option.ini} = {ini}\n")
    command_line = [_switch_on(name) if word == "on" else option.no_cli for word in arguments]
    config = pytester.parseconfig(*command_line)
    value, given = settings.read_option(config, option)
    assert value is expected
    assert given is (ini is not None or bool(arguments))


# -- the switches at work, in real pytest runs ---------------------------------------------------

ISOLATE_INI = "[pytest]\ntfmem_isolate = true\n"
ONE_TEST = """
import pytest

@pytest.mark.tfmem
def test_one():
    pass
"""


@pytest.mark.parametrize(
    ("arguments", "isolated"),
    [
        ([], True),
        (["--no-tfmem-isolate"], False),
        (["--no-tfmem-isolate", "--tfmem-isolate"], True),  # the last switch wins
    ],
)
def test_no_tfmem_isolate_runs_the_test_in_process_despite_the_ini_file(
    pytester: pytest.Pytester, run_subprocess_records, arguments: list[str], isolated: bool
):
    pytester.makeini(ISOLATE_INI)
    pytester.makepyfile(ONE_TEST)
    result, records = run_subprocess_records(*arguments)
    result.assert_outcomes(passed=1)
    assert ("isolated" in records["test_one"].extra) is isolated
    assert ("tfmem: isolated tests" in result.stdout.str()) is isolated


OVER_BUDGET = """
import numpy as np
import pytest

@pytest.mark.tfmem(budget="20MB")
def test_over_budget():
    block = np.ones(100 * 10**6 // 8)  # 100 MB
"""


@pytest.mark.parametrize(("arguments", "explained"), [([], True), (["--no-tfmem-explain"], False)])
def test_no_tfmem_explain_turns_the_ini_file_explain_off(
    pytester: pytest.Pytester, run_subprocess_records, arguments: list[str], explained: bool
):
    pytester.makeini("[pytest]\ntfmem_explain = true\n")
    pytester.makepyfile(OVER_BUDGET)
    result, records = run_subprocess_records(*arguments)
    result.assert_outcomes(failed=1)
    assert ("explain" in records["test_over_budget"].extra) is explained
    assert ("memory by line" in result.stdout.str()) is explained


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ([], "true"),
        (["--no-tfmem-gpu-memory-growth"], None),
        (["--tfmem-gpu-memory-growth=false"], None),  # the value form still works
        (["--no-tfmem-gpu-memory-growth", "--tfmem-gpu-memory-growth=true"], "true"),
    ],
)
def test_no_tfmem_gpu_memory_growth_leaves_the_variable_alone_despite_the_ini_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, arguments: list[str], expected: str | None
):
    monkeypatch.delenv(GROWTH_VARIABLE, raising=False)
    pytester.makeini("[pytest]\ntfmem_gpu_memory_growth = true\n")
    pytester.makepyfile(
        f"""
        import os

        def test_growth():
            assert os.environ.get("{GROWTH_VARIABLE}") == {expected!r}
        """
    )
    pytester.runpytest(*arguments).assert_outcomes(passed=1)
    assert GROWTH_VARIABLE not in os.environ  # the run put back what it changed


@pytest.mark.slow  # imports TensorFlow in each inner session
@pytest.mark.parametrize(
    ("arguments", "started"),
    [([], True), (["--no-tfmem-tf-warmup"], False), (["--tfmem-tf-warmup=false"], False)],
)
@pytest.mark.forked_sessions  # its inner session imports TensorFlow
def test_no_tfmem_tf_warmup_leaves_the_runtime_to_the_test_despite_the_ini_file(
    pytester: pytest.Pytester, arguments: list[str], started: bool
):
    pytester.makeini("[pytest]\ntfmem_tf_warmup = true\n")
    pytester.makeconftest("import tensorflow")  # imported while pytest configures, before the session starts
    pytester.makepyfile(
        f"""
        import sys

        import pytest

        from pytest_tfmem.frameworks.tensorflow import runtime_started

        @pytest.mark.tfmem
        def test_first():
            assert runtime_started() is {started}
            # left to the test, tfmem created not even TensorFlow's eager context: devices stay the test's to set
            assert (sys.modules["tensorflow.python.eager.context"]._context is not None) is {started}
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *arguments)
    result.assert_outcomes(passed=1)


# -- path options: one rule for relative paths ---------------------------------------------------

PATH_OPTIONS = sorted(name for name, option in declared_options().items() if option.parse is settings.parse_path)
EMPTY_BASELINE = '{"format": "pytest-tfmem-baseline", "version": 1, "tests": {}}\n'


def test_the_path_options_are_found():
    assert set(PATH_OPTIONS) == {"results", "trace_dir", "baseline", "save_baseline", "report", "markdown", "history"}


def test_every_path_option_says_how_a_relative_path_is_read(pytester: pytest.Pytester):
    unwrapped = "".join(pytester.runpytest("--help").stdout.str().split())
    rule = "".join(settings.PATH_HELP.split())
    for name in PATH_OPTIONS:
        option = declared_options()[name]
        assert "".join(f"{option.help}{settings.PATH_HELP} [ini: {option.ini}]".split()) in unwrapped, name
    assert unwrapped.count(rule) >= 2 * len(PATH_OPTIONS)  # the options' help and the ini values'


def _path_layout(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """An ini file in ``ci/`` (not the rootdir), pytest started in ``work/``: three directories."""
    ci, work = pytester.mkdir("ci"), pytester.mkdir("work")
    (ci / "in.json").write_text(EMPTY_BASELINE)
    (work / "in.json").write_text(EMPTY_BASELINE)
    values = {"baseline": "in.json", "results": "out/results.jsonl", "trace_dir": "out/traces",
              "save_baseline": "out/saved.json", "report": "out/report.json", "markdown": "out/summary.md",
              "history": "out/history.jsonl"}
    assert set(values) == set(PATH_OPTIONS)
    monkeypatch.chdir(work)
    return ci, work, values


def test_a_relative_ini_path_is_read_from_the_ini_files_directory(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    ci, work, values = _path_layout(pytester, monkeypatch)
    lines = "".join(f"tfmem_{name} = {value}\n" for name, value in values.items())
    (ci / "tfmem.ini").write_text(f"[pytest]\n{lines}tfmem_trace = off\n")
    config = pytester.parseconfig("-c", str(ci / "tfmem.ini"), f"--rootdir={pytester.path}")
    assert config.rootpath == pytester.path and config.invocation_params.dir == work
    for name, value in values.items():
        assert settings.read_option(config, declared_options()[name]) == (ci / value, True), name


def test_a_relative_command_line_path_is_read_from_where_pytest_was_started(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    ci, work, values = _path_layout(pytester, monkeypatch)
    (ci / "tfmem.ini").write_text("[pytest]\ntfmem_report = elsewhere.json\n")
    arguments = [f"{declared_options()[name].cli}={value}" for name, value in values.items()]
    config = pytester.parseconfig("-c", str(ci / "tfmem.ini"), f"--rootdir={pytester.path}", *arguments)
    for name, value in values.items():
        assert settings.read_option(config, declared_options()[name]) == (work / value, True), name


def test_override_ini_without_an_ini_file_reads_from_where_pytest_was_started(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    _, work, _ = _path_layout(pytester, monkeypatch)
    config = pytester.parseconfig("-o", "tfmem_report=out/report.json", f"--rootdir={work}")
    assert config.inipath is None
    assert settings.read_option(config, declared_options()["report"]) == (work / "out/report.json", True)


def test_the_files_of_a_run_go_where_the_rule_says(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    ci, work, values = _path_layout(pytester, monkeypatch)
    (ci / "tfmem.ini").write_text("[pytest]\ntfmem_report = out/report.json\ntfmem_results = out/results.jsonl\n")
    (work / "out").mkdir()  # reports and baselines go into existing directories
    pytester.makepyfile(test_paths="def test_one():\n    pass\n")
    result = pytester.runpytest(
        "-p", "no:cacheprovider", "-c", str(ci / "tfmem.ini"), f"--rootdir={pytester.path}",
        "--tfmem-markdown=out/summary.md", "--tfmem-save-baseline=out/saved.json", str(pytester.path / "test_paths.py"),
    )
    result.assert_outcomes(passed=1)
    assert (ci / "out/report.json").is_file() and (ci / "out/results.jsonl").is_file()  # from the ini file
    assert (work / "out/summary.md").is_file() and (work / "out/saved.json").is_file()  # from the command line
    assert not (pytester.path / "out").exists()  # never from the rootdir
