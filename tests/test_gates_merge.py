"""Sharded CI: ``tfmem merge`` on the reports of a real two-shard run (pytest-split), and one
shard compared with the merged baseline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import forked_sessions
import pytest
from gates_helpers import MB, suite_source

from pytest_tfmem.cli.main import EXIT_BAD_INPUT, EXIT_OK
from pytest_tfmem.units import format_size

pytest.importorskip("pytest_split")

SIZES = {"a": 40, "b": 20, "c": 60, "d": 10}
FAILING = "\n\ndef test_fails():\n    block = np.ones(30 * 10**6 // 8)\n    assert block.sum() < 0\n"


def run_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "GITHUB_STEP_SUMMARY"}
    # A rewritten test file can keep its size and second: no cached bytecode, always the source.
    environment["PYTHONDONTWRITEBYTECODE"] = "1"
    return forked_sessions.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_suite.py", *args],
        cwd=folder, env=environment, timeout=300, framework=False,
    )  # fmt: skip


def tfmem(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest_tfmem.cli.main", *args], cwd=folder, capture_output=True, text=True, check=False
    )


def peaks(path: Path) -> dict[str, int]:
    data = json.loads(path.read_text())
    if data["format"] == "pytest-tfmem-baseline":
        return {nodeid: entry["peak"] for nodeid, entry in data["tests"].items()}
    return {test["nodeid"]: test["measurement"]["peak"] for test in data["tests"] if test["outcome"] == "passed"}


def figures(path: Path) -> dict[str, tuple[int, dict[str, int], int | None]]:
    """Each passed test's figures that a baseline keeps (peak, views, retained), from the raw JSON."""
    data = json.loads(path.read_text())
    if data["format"] == "pytest-tfmem-baseline":
        return {nodeid: (e["peak"], e["views"], e.get("retained")) for nodeid, e in data["tests"].items()}
    return {
        test["nodeid"]: (
            test["measurement"]["peak"],
            {view["view"]: max(0, view["peak"] - view["start"]) for view in test["measurement"]["views"]},
            None if test.get("retained_bytes") is None else max(0, test["retained_bytes"]),
        )
        for test in data["tests"]
        if test["outcome"] == "passed"
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``shard1.json`` and ``shard2.json`` from ``--splits 2 --group N``; ``merged.json`` from them;
    ``shard1-compared.txt``: shard 1 run again against the merged baseline, with its Markdown summary."""
    folder = tmp_path_factory.mktemp("shards")
    (folder / "test_suite.py").write_text(suite_source(SIZES) + FAILING)
    for group in (1, 2):
        run_pytest(folder, "--splits", "2", "--group", str(group), f"--tfmem-report=shard{group}.json")
    merged = tfmem(folder, "merge", "-o", "merged.json", "shard1.json", "shard2.json")
    (folder / "merge.txt").write_text(merged.stdout + merged.stderr + f"\nexit {merged.returncode}")
    compared = run_pytest(
        folder, "--splits", "2", "--group", "1", "--tfmem-baseline=merged.json", "--tfmem-markdown=summary.md"
    )
    (folder / "shard1-compared.txt").write_text(compared.stdout)
    return folder


def test_merge_combines_the_shards_passed_tests(shards: Path):
    one, two = peaks(shards / "shard1.json"), peaks(shards / "shard2.json")
    assert one and two and not one.keys() & two.keys()  # each shard ran its share
    merged = peaks(shards / "merged.json")
    assert merged == {**one, **two}
    assert set(merged) == {f"test_suite.py::test_{name}" for name in SIZES}  # test_fails is left out
    for name, size in SIZES.items():  # the figures are the shards' real measurements
        assert abs(merged[f"test_suite.py::test_{name}"] - size * MB) < 4 * 2**20
    text = (shards / "merge.txt").read_text()
    assert text.splitlines()[0] == "merged.json: 4 test(s) from 2 report(s) and 0 baseline(s)"
    assert "1 measured test(s) of the reports did not pass: not taken" in text
    assert text.endswith("exit 0")


def test_one_shard_compares_only_what_it_ran_and_counts_the_rest(shards: Path):
    ran = peaks(shards / "shard1.json")
    others = sorted(set(peaks(shards / "merged.json")) - set(ran))
    expected = f"{len(others)} baseline test(s) not run in this session, not compared: {', '.join(others)}"
    output = (shards / "shard1-compared.txt").read_text()
    assert f"tfmem: {expected}" in output.splitlines()
    assert f"{len(ran)} tests measured:" in output and "0 not in the baseline" in output
    assert f"> {expected}" in (shards / "summary.md").read_text().splitlines()
    done = tfmem(shards, "compare", "merged.json", "shard1.json")
    assert done.returncode == EXIT_OK
    assert f"{len(others)} baseline test(s) not run in the report's session, not compared" in done.stderr
    # Each test is counted once, its peak and what it retained compared on its one row.
    assert done.stdout.splitlines()[-1].endswith(f"{len(ran)} within tolerance, 0 not in the baseline")


def test_merge_refuses_different_figures_unless_told_which_wins(shards: Path):
    suite = shards / "test_suite.py"
    original = suite.read_text()
    suite.write_text(suite_source({**SIZES, "a": 100}))  # every test again, test_a grown by 60 MB
    try:
        run_pytest(shards, "--tfmem-report=full.json")
    finally:
        suite.write_text(original)
    merged, full = peaks(shards / "merged.json"), peaks(shards / "full.json")
    # A test differs where any figure a baseline keeps differs (its peak, a view, what it retained).
    merged_figures, full_figures = figures(shards / "merged.json"), figures(shards / "full.json")
    differing = sorted(nodeid for nodeid in merged if merged_figures[nodeid] != full_figures[nodeid])
    assert "test_suite.py::test_a" in differing and full["test_suite.py::test_a"] > merged["test_suite.py::test_a"]
    before = (shards / "merged.json").read_bytes()
    done = tfmem(shards, "merge", "-o", "merged.json", "merged.json", "full.json")
    assert done.returncode == EXIT_BAD_INPUT and done.stdout == ""
    assert done.stderr.startswith("tfmem: error: ") and "say which wins with --prefer=first|last|max|min" in done.stderr
    before_a, after_a = format_size(merged["test_suite.py::test_a"]), format_size(full["test_suite.py::test_a"])
    assert f"  test_suite.py::test_a: merged.json (peak {before_a}), full.json (peak {after_a})" in done.stderr.splitlines()
    assert f"{len(differing)} test(s) have different figures in several inputs" in done.stderr
    assert done.stderr.rstrip().endswith("merged.json was not written")
    assert (shards / "merged.json").read_bytes() == before
    for rule, pick in [("first", lambda a, b: a), ("last", lambda a, b: b), ("max", max), ("min", min)]:
        done = tfmem(shards, "merge", "-o", f"{rule}.json", "merged.json", "full.json", f"--prefer={rule}")
        assert done.returncode == EXIT_OK, done.stderr
        assert peaks(shards / f"{rule}.json") == {n: pick(merged[n], full[n]) for n in merged}
        assert f"{len(differing)} test(s) measured differently by several inputs: --prefer={rule} chose" in done.stdout
    same = tfmem(shards, "merge", "-o", "again.json", "shard1.json", "shard1.json", "merged.json")
    assert same.returncode == EXIT_OK and peaks(shards / "again.json") == merged  # equal figures agree


def test_merge_names_a_bad_input(shards: Path):
    (shards / "other.json").write_text('{"format": "coverage"}')
    done = tfmem(shards, "merge", "-o", "out.json", "shard1.json", "other.json")
    assert done.returncode == EXIT_BAD_INPUT
    assert "'other.json': neither a pytest-tfmem report nor a baseline (its \"format\" is 'coverage')" in done.stderr
    done = tfmem(shards, "merge", "-o", "out.json", "missing.json")
    assert done.returncode == EXIT_BAD_INPUT and "report file 'missing.json': no such file" in done.stderr
    done = tfmem(shards, "merge", "-o", "out.json", "shard1.json", "--prefer=best")
    assert done.returncode == EXIT_BAD_INPUT and "invalid choice: 'best'" in done.stderr
    assert not (shards / "out.json").exists()
