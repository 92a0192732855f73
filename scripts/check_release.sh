#!/usr/bin/env bash
# Build pytest-tfmem's sdist and wheel and check them as a release would ship them:
# twine check, then the wheel installed into a fresh virtual environment (its dependencies
# from the package index, nothing from this one) and a first pytest run with a budget.
# The release workflow (.github/workflows/release.yml) runs this before it publishes;
# tests/test_release.py runs it too.
#
#     scripts/check_release.sh [DIST_DIR]        (default: dist; emptied first)
#
# With RELEASE_TAG set (v0.2.0), the tag must name pyproject.toml's version.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dist=$(mkdir -p "${1:-$root/dist}" && cd "${1:-$root/dist}" && pwd)
python=${PYTHON:-python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

version=$("$python" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$root/pyproject.toml")
if [ -n "${RELEASE_TAG:-}" ] && [ "$RELEASE_TAG" != "v$version" ]; then
    echo "check_release: tag $RELEASE_TAG does not name pyproject.toml's version $version (expected v$version)" >&2
    exit 1
fi

rm -f "$dist"/pytest_tfmem-*
"$python" -m build --outdir "$dist" "$root" > "$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
wheel="$dist/pytest_tfmem-$version-py3-none-any.whl"
sdist="$dist/pytest_tfmem-$version.tar.gz"
[ -f "$wheel" ] && [ -f "$sdist" ] || { echo "check_release: expected $wheel and $sdist" >&2; ls "$dist" >&2; exit 1; }
"$python" -m twine check --strict "$wheel" "$sdist"

# The wheel holds the package and its py.typed, and none of the clone's tests or scenarios.
"$python" - "$wheel" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
assert "pytest_tfmem/py.typed" in names and "pytest_tfmem/plugin.py" in names, names
stray = [n for n in names if n.split("/")[0] in ("tests", "scenarios", "benchmarks", "scripts")]
assert not stray, stray
PY

"$python" -m venv "$work/venv"
unset PYTHONPATH  # the fresh environment sees the wheel alone, not a clone on the path
"$work/venv/bin/python" -m pip install --quiet "$wheel"
mkdir "$work/try"
printf 'def test_small():\n    assert len(bytearray(50 * 2**20)) > 0\n' > "$work/try/test_small.py"
(cd "$work/try" && "$work/venv/bin/python" -m pytest -p no:cacheprovider --tfmem-budget=1GB test_small.py) > "$work/run.log" 2>&1 \
    || { cat "$work/run.log" >&2; exit 1; }
grep -E '^test_small.py::test_small +(4[89]|5[0-2])\.[0-9] MiB .* passed$' "$work/run.log" \
    || { echo "check_release: no tfmem table line for test_small (about 50 MiB) in the first run:" >&2; cat "$work/run.log" >&2; exit 1; }
"$work/venv/bin/tfmem" --help > /dev/null
echo "check_release: $(basename "$wheel") and $(basename "$sdist") built, checked, installed and run"
