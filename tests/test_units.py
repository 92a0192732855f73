import pytest

from pytest_tfmem.units import format_size, parse_size

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
        ("1000000", 1_000_000),
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


def test_format_size_signed():
    assert format_size(2**20, signed=True) == "+1.0 MiB"
    assert format_size(-(2**20), signed=True) == "-1.0 MiB"
