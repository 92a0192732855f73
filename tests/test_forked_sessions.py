"""The suite's forked inner sessions (``forked_sessions.py``, ``session_zygote.py``) read as fresh ones."""

from __future__ import annotations

import forked_sessions
import pytest

IMPORTS_THE_HELPER = """
import helper_on_the_path


def test_imports():
    assert helper_on_the_path.VALUE == 1
"""


def test_a_forked_sessions_xdist_workers_get_its_python_path_not_the_forking_processs(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    """pytest-xdist hands its workers the ``sys.path`` it copied as its plugin was imported: in a
    fork, the forking process's, started here without the folder the session's ``PYTHONPATH`` adds."""
    pytester.makepyfile(test_trivial="def test_trivial():\n    pass\n")
    pytester.runpytest_subprocess("-p", "no:cacheprovider", "test_trivial.py").assert_outcomes(passed=1)
    folder = pytester.mkdir("on_the_path")
    (folder / "helper_on_the_path.py").write_text("VALUE = 1\n")
    monkeypatch.setenv("PYTHONPATH", str(folder))
    pytester.makepyfile(test_imports=IMPORTS_THE_HELPER)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "test_imports.py")
    result.assert_outcomes(passed=1)


def test_a_session_naming_kerass_default_backend_shares_the_suites_forking_process():
    """``KERAS_BACKEND`` unset and ``KERAS_BACKEND=tensorflow`` start alike; another backend or a
    TensorFlow variable read at import does not."""
    suite = {"TF_ENABLE_ONEDNN_OPTS": "1", "HOME": "/root"}
    zygote = forked_sessions.Zygote(suite, framework=True)
    assert zygote.serves({**suite, "KERAS_BACKEND": "tensorflow", "GIT_AUTHOR_NAME": "ci"}, framework=True)
    assert not zygote.serves({**suite, "KERAS_BACKEND": "jax"}, framework=True)
    assert not zygote.serves({**suite, "TF_CPP_MIN_LOG_LEVEL": "3"}, framework=True)
    assert not zygote.serves(suite, framework=False)
