"""Options, ini values and marker arguments: declared once, parsed and validated once.

Every option exists as ``--tfmem-NAME`` on the command line and ``tfmem_NAME`` in the ini
file (``pytest.ini``, ``pyproject.toml [tool.pytest.ini_options]``, ...); the command line
wins. An on/off option (one parsed by ``parse_bool``) is turned on by ``--tfmem-NAME`` (a
switch) or ``--tfmem-NAME=VALUE`` (an option that takes a value), and off by
``--no-tfmem-NAME``; when both are given, the last one wins. Bad values raise
``pytest.UsageError`` naming the value and the accepted forms.

A path option (one parsed by ``parse_path``) follows pytest's own rule for relative paths,
the same for every path option: on the command line, from the directory pytest was started
in (like ``--junitxml``); in the ini file, from the ini file's directory (like pytest's
``paths`` ini values; from the current directory for ``-o NAME=VALUE`` without an ini file).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_tfmem import platforms
from pytest_tfmem.files import Output, overwrite_refusal, prepare_output
from pytest_tfmem.units import SIZE_FORMS, parse_size

if TYPE_CHECKING:  # pytest is imported only where pytest runs: ``tfmem`` commands start without it
    import pytest

MARKER = "tfmem"


def parse_optional_size(value: object, what: str) -> int | None:
    """A size, or ``None`` (meaning: no limit)."""
    if value is None:
        return None
    return parse_size(value, what=what)


def parse_bool(value: object, what: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"invalid {what} {value!r}: expected true/false (also 1/0, yes/no, on/off)")


def parse_path(value: object, what: str) -> Path:
    """A file or directory path, ``~`` expanded; ``read_option`` makes a relative one absolute."""
    text = str(value).strip()
    if not text or "\0" in text:
        raise ValueError(f"invalid {what} {value!r}: expected a path")
    return Path(os.path.expanduser(text))


PATH_HELP = (
    "; a relative path is taken from the current directory on the command line, from the ini "
    "file's directory in an ini file"
)


def parse_positive_int(value: object, what: str) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ValueError(f"invalid {what} {value!r}: expected a whole number >= 1")
    return int(text)


@dataclass(frozen=True)
class Option:
    """One setting, available as ``--tfmem-NAME`` and ini ``tfmem_NAME``."""

    name: str
    help: str
    parse: Callable[[object, str], Any]
    default: Any = None
    flag: bool = False  # a command-line switch without a value

    @property
    def cli(self) -> str:
        return "--tfmem-" + self.name.replace("_", "-")

    @property
    def no_cli(self) -> str | None:
        """``--no-tfmem-NAME`` for an on/off option: turns it off, also against the ini file."""
        return "--no-" + self.cli[2:] if self.parse is parse_bool else None

    @property
    def ini(self) -> str:
        return "tfmem_" + self.name


# Every option a feature declared, by name: what a misspelled option or ini key is matched against.
DECLARED: dict[str, Option] = {}


def add_options(parser: pytest.Parser, options: list[Option]) -> None:
    group = parser.getgroup("tfmem", "memory budgets for TensorFlow/Keras tests (pytest-tfmem)")
    for option in options:
        DECLARED[option.name] = option
        text = option.help + (PATH_HELP if option.parse is parse_path else "")
        cli_help = f"{text} [ini: {option.ini}]".replace("%", "%%")  # argparse %-formats help
        if option.flag:
            group.addoption(option.cli, action="store_const", const=True, default=None, dest=option.ini,
                            help=cli_help)
        else:
            group.addoption(option.cli, action="store", default=None, dest=option.ini, metavar="VALUE",
                            help=cli_help)
        if option.no_cli is not None:  # same dest: of --tfmem-NAME and --no-tfmem-NAME, the last wins
            group.addoption(option.no_cli, action="store_const", const=False, default=None, dest=option.ini,
                            help=f"turn {option.cli} off, whatever ini {option.ini} says")
        parser.addini(option.ini, help=text, default=None)


def misspelled_options(arguments: list[str]) -> list[str]:
    """A line for each ``--tfmem-NAME`` (or ``--no-tfmem-NAME``) among ``arguments`` that no
    feature declared, with its nearest spelling (pytest itself says only ``unrecognized
    arguments``)."""
    known = {form for option in DECLARED.values() for form in (option.cli, option.no_cli) if form}
    lines = []
    for argument in arguments:
        name = argument.split("=", 1)[0]
        if name.startswith(("--tfmem-", "--no-tfmem-")) and name not in known:
            lines.append(f"unknown option {name}{_nearest(name, known)}")
    return lines


def misspelled_ini_keys(unknown: set[str], inipath: Path | None) -> list[str]:
    """A line for each ``tfmem_*`` key of the ini file (or ``-o``) that no feature declared, with
    its nearest spelling (pytest itself only warns ``Unknown config option``, and the session
    would run unmeasured)."""
    known = {option.ini for option in DECLARED.values()}
    where = f" in {inipath}" if inipath is not None else ""
    return [f"unknown ini key {key!r}{where}{_nearest(key, known)}" for key in sorted(unknown)
            if key.startswith("tfmem")]


def _nearest(name: str, known: set[str]) -> str:
    """``; did you mean --tfmem-budget?``: the closest of ``known`` by what follows the prefix they
    share (every name starts with ``--tfmem-``, ``--no-tfmem-`` or ``tfmem_``)."""
    import difflib

    def bare(text: str) -> str:
        return text.removeprefix("--no-tfmem-").removeprefix("--tfmem-").removeprefix("tfmem_")

    by_bare = {bare(form): form for form in sorted(known) if form.startswith(name[: len(name) - len(bare(name))])}
    close = difflib.get_close_matches(bare(name), sorted(by_bare), n=1, cutoff=0.6)
    return f"; did you mean {by_bare[close[0]]}?" if close else " (pytest --help lists tfmem's options, under 'tfmem')"


def read_output_option(config: pytest.Config, option: Option, kind: Output) -> Path | None:
    """A path option that names a file tfmem writes (``read_option``), made ready to be written
    before any test runs (``files.prepare_output``: its missing directories made), or refused as a
    usage error where it cannot be written, where the file would replace something that is not one
    of ``kind`` (``files.overwrite_refusal``), or where the session was given it to collect: a path
    taken from the next argument (``--tfmem-report tests/test_x.py``, a space where ``=`` was
    meant) never costs a file."""
    import pytest

    path, given = read_option(config, option)
    if not given:
        return None
    arguments = {(config.invocation_params.dir / argument.split("::", 1)[0]).absolute() for argument in config.args}
    reason = "the session was given it to collect" if path in arguments else overwrite_refusal(path, kind)
    if reason is not None:
        raise pytest.UsageError(
            f"pytest-tfmem: {option.cli} would write the {kind.name} over {path}: {reason}; it was left unchanged. "
            f"Give it a path of its own: {option.cli}=PATH (after a space, the next argument is taken for the path)"
        )
    reason = prepare_output(path)
    if reason is not None:
        raise pytest.UsageError(f"pytest-tfmem: {option.cli} cannot write the {kind.name} to {path}: {reason}")
    return path


def read_option(config: pytest.Config, option: Option) -> tuple[Any, bool]:
    """The option's parsed value (command line, else ini, else default) and whether it was set."""
    import pytest

    raw = config.getoption(option.ini, default=None)  # False (--no-tfmem-NAME) is set, too
    source, base = option.cli, config.invocation_params.dir
    if raw is None:
        raw = config.getini(option.ini)
        source = f"ini {option.ini}"
        base = config.inipath.parent if config.inipath is not None else base
    if raw is None or raw == "" or raw == []:
        return option.default, False
    if isinstance(raw, list):  # an ini line written without quotes may come back split
        raw = " ".join(raw)
    try:
        value = option.parse(raw, f"{source} value")
    except ValueError as error:
        raise pytest.UsageError(f"pytest-tfmem: {error}") from None
    if isinstance(value, Path):  # see the module docstring
        value = (base / value).absolute()
    return value, True


BUDGET = Option("budget", f"peak memory budget for every test; {SIZE_FORMS}", parse_optional_size)
TOP = Option("top", "rows in the terminal summary of the heaviest tests (default 10)", parse_positive_int, 10)
TF_WARMUP = Option(
    "tf_warmup",
    "start the runtime of each framework in use (TensorFlow, JAX, PyTorch) before the first measured "
    "test, so its start-up memory is not charged to whichever test runs first (default true)",
    parse_bool,
    True,
)
FIRST_USE_WARMUP = Option(
    "first_use_warmup",
    "before the first measured test, pay each framework's first use once its runtime started (a tiny "
    "Keras fit with Adam, a predict with conv and embedding kernels, a tf.data pipeline, a traced "
    "function, a gradient), so whichever test runs first is not charged for it in the figures shown; "
    "booked in the session's account. About a second a session: off by default, as a verdict on a "
    "test's figures is confirmed by a re-run instead (tfmem_confirm) (default false; needs tfmem_tf_warmup)",
    parse_bool,
    False,
)
SUBTESTS = Option(
    "subtests",
    "list each subtest's figure under its test in the terminal summary (subtests are measured "
    "either way; the JSON report and a failed test's section always list them)",
    parse_bool,
    False,
    flag=True,
)
BOOK_IMPORTS = Option(
    "book_imports",
    "leave a module's first import in the process (TensorFlow: ~580 MiB) out of the figures of the "
    "test that does it, and name it in the test's section instead (default true)",
    parse_bool,
    True,
)
CONFIRM = Option(
    "confirm",
    "before a test fails a check on its figures (budget, baseline, history gate, GPU budget), and "
    "before a figure far above its recorded level is kept, run its body once more in the same "
    "process and judge the figure that reproduces; what the first run took beyond it is booked as a "
    "one-time cost of the process (default true; @pytest.mark.tfmem(rerun=False) turns it off for one test)",
    parse_bool,
    True,
)
PLATFORM = Option(
    "platform",
    "how memory is read: auto (default: what this operating system keeps; Linux's, macOS's and "
    "Windows' own marks) or portable (psutil alone, on any system: every peak sampled, processes "
    "spawned; sets TFMEM_PLATFORM for the processes the session starts)",
    platforms.parse_choice,
    platforms.AUTO,
)
FREEZE_AT_EXIT = Option(
    "freeze_at_exit",
    "once a measured session is over, spare the interpreter's exit its last pass over every object "
    "(1 to 1.5 s with TensorFlow loaded): at exit, the young objects are collected and the rest frozen, "
    "so the finalizers of objects in reference cycles still alive at exit do not run, which Python "
    "does not promise either (default true)",
    parse_bool,
    True,
)
CORE_OPTIONS = [BUDGET, TOP, TF_WARMUP, FIRST_USE_WARMUP, SUBTESTS, BOOK_IMPORTS, CONFIRM, PLATFORM, FREEZE_AT_EXIT]


@dataclass(frozen=True)
class CoreSettings:
    budget: int | None
    top: int
    tf_warmup: bool
    first_use_warmup: bool
    subtests: bool  # list subtests in the terminal summary
    book_imports: bool  # leave first imports out of the tests' figures
    confirm: bool  # a verdict on figures stands only if a re-run reproduces it (``core.confirm``)
    freeze_at_exit: bool  # the interpreter's exit skips what is still alive (``probes.garbage.freeze_at_exit``)
    any_set: bool  # a tfmem option or ini value was given: measure every test

    @classmethod
    def from_config(cls, config: pytest.Config) -> CoreSettings:
        values = {option.name: read_option(config, option) for option in CORE_OPTIONS}
        return cls(
            budget=values["budget"][0],
            top=values["top"][0],
            tf_warmup=values["tf_warmup"][0],
            first_use_warmup=values["first_use_warmup"][0],
            subtests=values["subtests"][0],
            book_imports=values["book_imports"][0],
            confirm=values["confirm"][0],
            freeze_at_exit=values["freeze_at_exit"][0],
            any_set=values["budget"][1] or values["subtests"][0],
        )


def marker_arguments(item: pytest.Item, keywords: dict[str, Callable[[object, str], Any]]) -> dict[str, Any]:
    """Parsed keyword arguments of the item's ``tfmem`` markers (the closest marker wins);
    ``keywords``: each accepted keyword's parser (the features' ``TFMEM_DECLARATIONS``).

    Raises ``pytest.UsageError`` naming the test, the bad argument and the accepted forms.
    """
    import pytest

    arguments: dict[str, Any] = {}
    for mark in reversed(list(item.iter_markers(MARKER))):
        if mark.args:
            raise pytest.UsageError(
                f"pytest-tfmem: {item.nodeid}: @pytest.mark.tfmem takes keyword arguments only "
                f"(e.g. budget='512MB'), got positional {mark.args!r}"
            )
        for key, value in mark.kwargs.items():
            parse = keywords.get(key)
            if parse is None:
                import difflib

                accepted = ", ".join(sorted(keywords))
                close = difflib.get_close_matches(key, sorted(keywords), n=1)
                nearest = f"; did you mean {close[0]!r}?" if close else ""
                raise pytest.UsageError(
                    f"pytest-tfmem: {item.nodeid}: unknown tfmem marker argument {key!r}{nearest} accepted: {accepted}"
                )
            try:
                arguments[key] = parse(value, f"tfmem marker argument {key}")
            except ValueError as error:
                raise pytest.UsageError(f"pytest-tfmem: {item.nodeid}: {error}") from None
    return arguments
