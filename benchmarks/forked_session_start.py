"""How long a trivial inner session of this project's tests takes: in a fresh interpreter, and forked.

    python -m benchmarks.forked_session_start [--repeat 7]

The project's tests start several hundred inner ``python -m pytest`` sessions, and most fork from a
process that imported pytest and its plugins once (``tests/forked_sessions.py``,
``tests/session_zygote.py``). This runs a session of one test that does nothing, with the
settings the tests give their inner sessions (``tests/conftest.py``: ``PYTEST_ADDOPTS`` among
them), alternating a fresh interpreter and a fork, and prints the median wall time of each; the
forking process's own start is left out (each of the tests' workers pays it once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def seconds(session: Callable[[], subprocess.CompletedProcess[str]]) -> float:
    started = time.perf_counter()
    done = session()
    if done.returncode != 0:
        raise RuntimeError(f"the trivial session failed:\n{done.stdout[-3000:]}\n{(done.stderr or '')[-3000:]}")
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="sessions of each kind (default 7)")
    arguments = parser.parse_args(argv)
    sys.path.insert(0, str(TESTS))
    import conftest  # noqa: F401  # the inner sessions' settings, as the tests' workers have them
    import forked_sessions  # the tests' own module: this measures what they run

    with tempfile.TemporaryDirectory(prefix="tfmem-forked-start-") as folder:
        Path(folder, "pytest.ini").write_text("[pytest]\n")
        Path(folder, "test_nothing.py").write_text("def test_nothing():\n    pass\n")
        command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "test_nothing.py"]
        environment = dict(os.environ)
        try:
            forked_sessions.run(command, cwd=folder, env=environment, framework=False)  # the forking process starts
            fresh, forked = [], []
            for _ in range(arguments.repeat):
                fresh.append(seconds(lambda: subprocess.run(command, cwd=folder, env=environment, capture_output=True,
                                                            text=True, check=False)))  # fmt: skip
                forked.append(seconds(lambda: forked_sessions.run(command, cwd=folder, env=environment,
                                                                  framework=False)))  # fmt: skip
        finally:
            forked_sessions.ZYGOTES.close()
    fresh_s, forked_s = statistics.median(fresh), statistics.median(forked)
    print(f"a session of one trivial test, median of {arguments.repeat} each: fresh interpreter {fresh_s:.2f} s, "
          f"forked {forked_s:.2f} s (x{forked_s / fresh_s:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
