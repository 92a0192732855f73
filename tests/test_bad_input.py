"""Bad sizes and marker arguments: a usage error naming the value and the accepted forms."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.any_os  # no TensorFlow, any system (.github/workflows/tests.yml)

ACCEPTED = "*expected a non-negative number of bytes or a number with a unit*MiB*"


@pytest.mark.parametrize("value", ["4XB", "-1GB", "abc"])
def test_bad_budget_on_the_command_line(pytester: pytest.Pytester, value: str):
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest(f"--tfmem-budget={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-tfmem: invalid --tfmem-budget value '{value}'{ACCEPTED}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_bad_budget_in_the_ini_file(pytester: pytest.Pytester):
    pytester.makepyfile("def test_ok():\n    pass\n")
    pytester.makeini("[pytest]\ntfmem_budget = lots\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-tfmem: invalid ini tfmem_budget value 'lots'{ACCEPTED}"])


@pytest.mark.parametrize(
    ("marker", "expected"),
    [
        ("budget='4XB'", f"*test_marked: invalid tfmem marker argument budget '4XB'{ACCEPTED}"),
        ("budget=[512]", f"*test_marked: invalid tfmem marker argument budget [[]512[]] (list){ACCEPTED}"),
        ("budjet='1GB'", "*test_marked: unknown tfmem marker argument 'budjet'; did you mean 'budget'? accepted: *budget*"),
    ],
    ids=["malformed-size", "non-string-size", "unknown-keyword"],
)
def test_bad_marker_arguments(pytester: pytest.Pytester, marker: str, expected: str):
    pytester.makepyfile(f"import pytest\n\n@pytest.mark.tfmem({marker})\ndef test_marked():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-tfmem: {expected}"])
    assert "Traceback" not in result.stderr.str() + result.stdout.str()


def test_an_unknown_marker_keyword_lists_every_feature_s_keywords(pytester: pytest.Pytester):
    """Each feature declares its own keywords (``TFMEM_DECLARATIONS``); the message has them all."""
    pytester.makepyfile("import pytest\n\n@pytest.mark.tfmem(budjet='1GB')\ndef test_marked():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    accepted = "budget, explain, explain_mode, gpu_budget, isolate, kill_at, max_retained, rerun, tolerance, trace"
    result.stderr.fnmatch_lines([f"*unknown tfmem marker argument 'budjet'; did you mean 'budget'? accepted: {accepted}"])


def test_positional_marker_arguments_are_refused(pytester: pytest.Pytester):
    pytester.makepyfile("import pytest\n\n@pytest.mark.tfmem('1GB')\ndef test_marked():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*takes keyword arguments only (e.g. budget='512MB')*"])


MARKED = """
import pytest

@pytest.mark.tfmem(budgt="1GB")
def test_misspelled(): pass

@pytest.mark.tfmem(budget="lots")
def test_bad_size(): pass

@pytest.mark.tfmem_leak(iterations=1)
def test_bad_leak_marker(): pass

@pytest.mark.tfmem(kill_at="x")
def test_deselected(): pass

def test_plain(): pass
"""


def test_every_bad_marker_of_the_selected_tests_is_named_in_one_run(pytester: pytest.Pytester):
    pytester.makepyfile(test_marked=MARKED)
    result = pytester.runpytest("-k", "not deselected")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: pytest-tfmem: test_marked.py::test_misspelled: unknown tfmem marker argument 'budgt'; did you mean 'budget'? *",
        "pytest-tfmem: test_marked.py::test_bad_size: invalid tfmem marker argument budget 'lots'*",
        "pytest-tfmem: test_marked.py::test_bad_leak_marker: @pytest.mark.tfmem_leak: invalid iterations 1: *",
    ])
    assert "test_deselected" not in result.stderr.str()


def test_a_deselected_tests_bad_marker_does_not_stop_the_session(pytester: pytest.Pytester):
    pytester.makepyfile(test_marked=MARKED)
    pytester.runpytest("-k", "plain").assert_outcomes(passed=1, deselected=4)


def test_a_misspelled_option_is_named_with_its_nearest_spelling(pytester: pytest.Pytester):
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = pytester.runpytest("--tfmem-budjet=1GB", "--no-tfmem-isolat", "--tfmem-frobnicate")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([
        "ERROR: pytest-tfmem: unknown option --tfmem-budjet; did you mean --tfmem-budget?",
        "pytest-tfmem: unknown option --no-tfmem-isolat; did you mean --no-tfmem-isolate?",
        "pytest-tfmem: unknown option --tfmem-frobnicate (pytest --help lists tfmem's options, under 'tfmem')",
    ])


def test_a_misspelled_ini_key_is_named_with_its_nearest_spelling(pytester: pytest.Pytester):
    """pytest only warns of an unknown key, and the session would run unmeasured."""
    pytester.makepyfile("def test_ok():\n    pass\n")
    ini = pytester.makeini("[pytest]\ntfmem_budjet = 1GB\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: pytest-tfmem: unknown ini key 'tfmem_budjet' in {ini}; did you mean tfmem_budget?"])
    overridden = pytester.runpytest("-o", "tfmem_budgte=1GB", "-c", str(ini))
    overridden.stderr.fnmatch_lines(["*unknown ini key 'tfmem_budgte'*; did you mean tfmem_budget?"])
