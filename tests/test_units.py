import json
import pickle
import re

import pytest

from pytest_tfmem.units import format_limit, format_size, parse_size

pytestmark = pytest.mark.any_os  # no TensorFlow, any system (.github/workflows/tests.yml)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4GB", 4 * 10**9),
        ("4 GB", 4 * 10**9),
        ("4GiB", 4 * 2**30),
        ("512MB", 512 * 10**6),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("1000000B", 1_000_000),
        ("0", 0),
        ("64kib", 64 * 1024),
        (1024, 1024),
    ],
)
def test_parse_size_accepts_the_documented_forms(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["4XB", "-1GB", "abc", "", "GB", "1..5GB", [1], True, None, -5])
def test_parse_size_rejects_bad_input_naming_value_and_forms(bad):
    with pytest.raises(ValueError) as error:
        parse_size(bad, what="budget")
    message = str(error.value)
    assert repr(bad) in message
    assert "MiB" in message and "GB" in message


@pytest.mark.parametrize(
    ("nbytes", "text"),
    [(642_123_776, "612.4 MiB"), (0, "0 B"), (1536, "1.5 KiB"), (3 * 2**30, "3.0 GiB"), (None, "-")],
)
def test_format_size_always_prints_a_unit(nbytes, text):
    assert format_size(nbytes) == text


@pytest.mark.parametrize("text", ["200", "1.5", " 4096 "])
def test_a_size_written_without_a_unit_is_refused_naming_the_forms_it_may_have_meant(text):
    """``--tfmem-budget=200`` is 200 bytes to a machine and 200 MB to most readers."""
    number = text.strip()
    with pytest.raises(ValueError, match=rf"invalid budget '{re.escape(text)}': a size written as text needs a unit "
                                         rf"\({re.escape(number)}B for bytes, {re.escape(number)}MB"):
        parse_size(text, what="budget")


def test_format_size_signed():
    assert format_size(2**20, signed=True) == "+1.0 MiB"
    assert format_size(-(2**20), signed=True) == "-1.0 MiB"


@pytest.mark.parametrize(
    ("written", "shown"),
    [("400MB", "400MB (381.5 MiB)"), ("1.5 GB", "1.5 GB (1.4 GiB)"), ("512MiB", "512.0 MiB"), ("100B", "100 B"),
     (2**20, "1.0 MiB")],
)
def test_a_limit_written_in_decimal_units_is_quoted_as_written_beside_its_binary_value(written, shown):
    size = parse_size(written)
    assert format_limit(size) == shown
    assert pickle.loads(pickle.dumps(size)) == size and format_limit(pickle.loads(pickle.dumps(size))) == shown
    assert json.dumps({"budget": size}) == f'{{"budget": {int(size)}}}'  # a plain number in every report
