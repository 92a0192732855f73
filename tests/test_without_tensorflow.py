"""Host budgets work where TensorFlow cannot be imported, and the plugin never imports it."""

from __future__ import annotations

import os

import pytest


def test_host_budgets_work_with_tensorflow_hidden(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    hidden = pytester.mkdir("hide_tensorflow")
    (hidden / "tensorflow").mkdir()
    (hidden / "tensorflow" / "__init__.py").write_text("raise ImportError('tensorflow hidden for this test')\n")
    monkeypatch.setenv("PYTHONPATH", str(hidden), prepend=os.pathsep)  # keeps a PYTHONPATH given to the suite
    pytester.makepyfile(
        """
        import numpy as np
        import pytest

        def test_tensorflow_is_not_importable():
            with pytest.raises(ImportError, match="hidden"):
                import tensorflow

        def test_over_budget():
            np.ones(300 * 10**6, dtype=np.uint8)

        def test_within_budget():
            np.ones(50 * 10**6, dtype=np.uint8)
        """
    )
    result = pytester.runpytest_subprocess("--tfmem-budget=200MB")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["tfmem: peak 28*.* MiB > budget 200MB (190.7 MiB) (host RSS 28*.* MiB)"])


def test_the_plugin_does_not_import_tensorflow(pytester: pytest.Pytester):
    pytester.makepyfile(
        """
        import sys
        import numpy as np

        def test_measured(tfmem):
            np.ones(10 * 10**6, dtype=np.uint8)
            tfmem.clean()

        def test_last():
            assert "tensorflow" not in sys.modules
        """
    )
    result = pytester.runpytest_subprocess("--tfmem-budget=1GB", "-p", "no:randomly")
    result.assert_outcomes(passed=2)
