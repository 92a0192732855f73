"""Trace directory names, uniqueness and rotation (no TensorFlow needed)."""

from __future__ import annotations

import json

import pytest

from pytest_tfmem.trace import dirs as tracedirs


@pytest.mark.parametrize(
    ("nodeid", "name"),
    [
        ("tests/test_fit.py::test_fit", "tests.test_fit.py__test_fit"),
        ("tests/test_fit.py::test_fit[adam-64]", "tests.test_fit.py__test_fit@adam-64"),
        ("test_fit.py::TestFit::test_fit[0.5-x=1]", "test_fit.py__TestFit__test_fit@0.5-x=1"),
        ("test_a.py::test_b[with space/and*glob?[x]]", "test_a.py__test_b@with_space.and_glob_x_"),
        ("test_a.py::test_b[caf\u00e9]", "test_a.py__test_b@caf_"),
    ],
)
def test_node_ids_become_readable_directory_names(nodeid: str, name: str) -> None:
    assert tracedirs.readable_name(nodeid) == name


@pytest.mark.parametrize(
    "nodeid",
    [
        "test_a.py::test_b[../../../../etc/passwd]",
        "../../outside",
        "/absolute/path::test",
        "..",
        ".",
        "",
        "test_a.py::test_b[\0nul]",
        "test_a.py::test_b[" + "../" * 200 + "]",
        "test_a.py::test_b[" + "x" * 5000 + "]",
        "\\..\\..\\windows",
    ],
)
def test_hostile_node_ids_stay_inside_the_session_directory(tmp_path, nodeid: str) -> None:
    session = tmp_path / "session"
    name = tracedirs.readable_name(nodeid)
    assert not set(name) & set("/\\\0*?[]{}")  # no separators, no glob characters
    assert not name.startswith(".") and ".." not in name
    assert 0 < len(name) <= tracedirs.MAX_NAME_LENGTH
    created = tracedirs.create_unique_dir(session, name)
    assert created.parent.resolve() == session.resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session"]


def test_long_names_keep_their_start_and_differ_by_a_hash() -> None:
    first = tracedirs.readable_name("test_a.py::test_b[" + "x" * 300 + "1]")
    second = tracedirs.readable_name("test_a.py::test_b[" + "x" * 300 + "2]")
    assert first.startswith("test_a.py__test_b@xxx") and second.startswith("test_a.py__test_b@xxx")
    assert first != second
    assert len(first) == len(second) == tracedirs.MAX_NAME_LENGTH


def test_colliding_names_are_made_unique(tmp_path) -> None:
    name_a = tracedirs.readable_name("test_a.py::test_b[x/y]")
    name_b = tracedirs.readable_name("test_a.py::test_b[x.y]")
    assert name_a == name_b  # two ids, one sanitised name
    first = tracedirs.create_unique_dir(tmp_path, name_a)
    second = tracedirs.create_unique_dir(tmp_path, name_b)
    assert (first.name, second.name) == ("test_a.py__test_b@x.y", "test_a.py__test_b@x.y-2")


def test_rotation_keeps_the_newest_sessions_and_never_touches_other_folders(tmp_path) -> None:
    root = tmp_path / "traces"
    names = [f"2025-01-0{day}_10-00-00_1" for day in range(1, 6)]
    for name in names:
        session = tracedirs.prepare_session(root, name, {"pid": 1})
        (session / "test_a.py__test_b").mkdir()
    (root / "my-notes").mkdir()
    (root / "my-notes" / "keep.txt").write_text("not ours")
    removed = tracedirs.rotate(root, keep=2)
    assert sorted(p.name for p in removed) == names[:3]
    assert sorted(p.name for p in root.iterdir()) == [".gitignore", *names[3:], "my-notes"]
    assert (root / "my-notes" / "keep.txt").read_text() == "not ours"


def test_an_empty_current_session_is_removed(tmp_path) -> None:
    root = tmp_path / "traces"
    tracedirs.prepare_session(root, "2025-01-01_10-00-00_1", {})
    assert tracedirs.rotate(root, keep=5, current="2025-01-01_10-00-00_1") == [root / "2025-01-01_10-00-00_1"]
    assert tracedirs.session_dirs(root) == []


def test_the_trace_root_is_kept_out_of_version_control(tmp_path) -> None:
    session = tracedirs.prepare_session(tmp_path / "traces", "s_1", {"pid": 7})
    assert (tmp_path / "traces" / ".gitignore").read_text().splitlines()[-1] == "*"
    assert json.loads((session / tracedirs.SESSION_MARKER).read_text()) == {"pid": 7}
