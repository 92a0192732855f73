"""Bad sizes and marker arguments: a usage error naming the value and the accepted forms."""

from __future__ import annotations

import pytest

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
        ("budjet='1GB'", "*test_marked: unknown tfmem marker argument 'budjet'; accepted: *budget*"),
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
    result.stderr.fnmatch_lines([f"*unknown tfmem marker argument 'budjet'; accepted: {accepted}"])


def test_positional_marker_arguments_are_refused(pytester: pytest.Pytester):
    pytester.makepyfile("import pytest\n\n@pytest.mark.tfmem('1GB')\ndef test_marked():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*takes keyword arguments only (e.g. budget='512MB')*"])
