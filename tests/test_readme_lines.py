"""The ``FAILED ...`` lines README.md and docs/*.md show are what pytest prints.

Every ``FAILED`` line in a code block of README.md or a page in docs/ is reproduced by a small
real pytest run of the failure it shows (picked by its wording), and the printed summary line
must match it word for word; only the sizes and the signed change, which depend on the machine,
may differ. A line that no run here reproduces fails too. A line shown on several pages is
checked once.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from pytest_tfmem.units import parse_size

REPOSITORY = Path(__file__).resolve().parent.parent
PAGES = [REPOSITORY / "README.md", *sorted((REPOSITORY / "docs").glob("*.md"))]

SIZE = r"\d+(?:\.\d+)? (?:B|KiB|MiB|GiB|TiB)"  # what units.format_size writes
CHANGE = r"[+-]\d+(?:\.\d+)?%"  # a signed percentage: the change, not the tolerance


def failed_lines(page: Path) -> list[str]:
    """Every line starting with ``FAILED `` inside a fenced code block of the page."""
    lines, in_block = [], False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            in_block = not in_block
        elif in_block and line.lstrip().startswith("FAILED "):
            lines.append(line.strip())
    return lines


def readme_failed_lines() -> list[str]:
    """The ``FAILED`` lines of README.md and docs/*.md, each once, in order of appearance."""
    return list(dict.fromkeys(line for page in PAGES for line in failed_lines(page)))


def pattern_of(line: str) -> re.Pattern[str]:
    """The line, word for word, with each size and signed percentage free to vary."""
    parts = re.split(f"({SIZE}|{CHANGE})", line)
    regex = "".join(
        SIZE if re.fullmatch(SIZE, part) else CHANGE if re.fullmatch(CHANGE, part) else re.escape(part)
        for part in parts
    )
    return re.compile(regex)


# -- reproductions ---------------------------------------------------------------------------

Run = Callable[..., pytest.RunResult]

NO_NVML = "import sys\n\nsys.modules['pynvml'] = None  # as without nvidia-ml-py: no GPU views on any machine\n"

OVER_BUDGET = """
import pytest
import tensorflow as tf

@pytest.mark.tfmem(budget="512MB")  # as the README's example marks its test
def test_fit():
    try:
        tf.config.experimental.get_memory_info("CPU:0")
    except Exception:  # this build's CPU allocator keeps no statistics: no TF CPU view
        open("no-cpu-allocator-stats", "w").close()
    weights = tf.ones((560 * 2**20 // 4,))  # 560 MiB through TensorFlow's CPU allocator
    assert float(tf.reduce_sum(weights + 1.0)) > 0
"""


def over_budget(pytester: pytest.Pytester, run: Run) -> pytest.RunResult:
    pytester.makepyfile(test_train=OVER_BUDGET)
    # oneDNN's CPU allocator keeps the statistics of the TF CPU view; TensorFlow turns oneDNN on
    # by default only on some x86 CPUs
    result = run("--tfmem-trace=off", TF_ENABLE_ONEDNN_OPTS="1")
    if (pytester.path / "no-cpu-allocator-stats").exists():
        pytest.skip("TensorFlow's CPU allocator keeps no statistics here: the README line's TF view is absent")
    return result


GROWN = """
import os
import numpy as np

def test_fit():
    block = np.ones(int(os.environ["TFMEM_README_MB"]) * 10**6 // 8)
"""


def grown_beyond_tolerance(pytester: pytest.Pytester, run: Run) -> pytest.RunResult:
    pytester.makepyfile(test_train=GROWN)
    saved = run("--tfmem-save-baseline=tfmem-baseline.json", TFMEM_README_MB="40")
    saved.assert_outcomes(passed=1)
    return run("--tfmem-baseline=tfmem-baseline.json", TFMEM_README_MB="120")  # the README's: the default tolerance


# wording in the README line -> the run that reproduces it (and marks: slow for TensorFlow)
REPRODUCTIONS: list[tuple[str, Callable[[pytest.Pytester, Run], pytest.RunResult], list]] = [
    (" > budget ", over_budget, [pytest.mark.slow]),
    (" vs baseline ", grown_beyond_tolerance, []),
]


def _cases() -> list:
    cases = []
    for number, line in enumerate(readme_failed_lines(), 1):
        found = [(how, marks) for wording, how, marks in REPRODUCTIONS if wording in line]
        how, marks = found[0] if found else (None, [])
        cases.append(pytest.param(line, how, marks=marks, id=f"line{number}-{how.__name__ if how else 'unknown'}"))
    return cases


def test_the_readme_shows_failed_lines():
    assert len(failed_lines(REPOSITORY / "README.md")) >= 2


@pytest.mark.parametrize(("line", "how"), _cases())
def test_the_readme_line_is_what_pytest_prints(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, line, how):
    assert how is not None, f"no run here reproduces this README line; add one to REPRODUCTIONS: {line}"
    monkeypatch.setenv("CI", "true")  # pytest prints the summary line whole, not cut to the terminal
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # TensorFlow on the CPU, as the README's lines
    pytester.makeconftest(NO_NVML)

    def run(*arguments: str, **environment: str) -> pytest.RunResult:
        for name, value in environment.items():
            monkeypatch.setenv(name, value)
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *arguments)

    result = how(pytester, run)
    printed = [text for text in result.outlines if text.startswith("FAILED ")]
    assert len(printed) == 1, result.stdout.str()
    assert pattern_of(line).fullmatch(printed[0]), f"README shows:\n{line}\npytest printed:\n{printed[0]}"


# -- the README's own numbers agree with each other ------------------------------------------


def _bytes(text: str) -> int:
    return parse_size(text.replace(" ", ""))


@pytest.mark.parametrize("line", readme_failed_lines())
def test_the_numbers_in_the_readme_line_agree(line: str):
    budget = re.search(rf"peak ({SIZE}) > budget [\d.]+ ?[kKMGT]?B \(({SIZE})\) \((.*)\)$", line)
    if budget:  # the peak is the larger of the host RSS and TF CPU allocator views, above the budget
        views = [_bytes(size) for size in re.findall(rf"(?:host RSS|TF CPU:\d+ allocator) ({SIZE})", budget[3])]
        assert _bytes(budget[1]) == max(views) and _bytes(budget[1]) > _bytes(budget[2])
    regression = re.search(
        rf"peak ({SIZE}) vs baseline ({SIZE}) \(({CHANGE})(?:, \+({SIZE}))? > (\d+)%(?:\+(\d+)MB)?\)$", line)
    if regression:  # the change is the growth over the baseline, beyond the tolerance
        current, baseline = _bytes(regression[1]), _bytes(regression[2])
        assert regression[3] == f"{(current - baseline) / baseline * 100:+.1f}%"
        if regression[4]:  # the growth in bytes, beside the share
            assert abs(_bytes(regression[4]) - (current - baseline)) < 2**20 / 10
        allowed = int(regression[5]) / 100 * baseline + int(regression[6] or 0) * 10**6
        assert current - baseline > allowed
    assert budget or regression, f"no check of the numbers for this README line: {line}"


def test_the_pattern_lets_numbers_vary_but_not_words():
    shown = "FAILED t.py::test - tfmem: peak 598.0 MiB > budget 512.0 MiB (host RSS 598.0 MiB) (+26.9% > 10%)"
    assert pattern_of(shown).fullmatch(shown.replace("598.0 MiB", "95.4 MiB").replace("+26.9%", "+200.0%"))
    assert not pattern_of(shown).fullmatch(shown.replace("host RSS", "RSS"))
    assert not pattern_of(shown).fullmatch(shown.replace("> 10%", "> 20%"))
    assert not pattern_of(shown.replace("tfmem:", "pytest_tfmem.errors.BudgetExceeded: tfmem:")).fullmatch(shown)
