"""The parallel CSV parser: numpy.loadtxt's numbers bit for bit, or None for a layout it leaves to it."""

from __future__ import annotations

import io

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ktframe.clustering import numeric_csv
from ktframe.clustering.datafile import load_points


def parse(text: str, dtype=np.float64, start: int = 0) -> np.ndarray | None:
    return numeric_csv.parse(np.frombuffer(text.encode() + b"\0", np.uint8), start, np.dtype(dtype))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))


@pytest.mark.parametrize("fmt", ["%.5f", "%.18e", "%.17g", "%g", "%.3e", "%d", "%.25f"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_the_numbers_of_numpy_loadtxt_bit_for_bit(fmt, dtype):
    # Magnitudes from 1e-320 (subnormal) to 1e300: the fast path and strtod's both.
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3000, 7)) * 10.0 ** rng.integers(-320, 300, size=(3000, 7))
    if fmt == "%d":
        X = np.round(X[:, :1] * 0 + rng.integers(-(10**12), 10**12, size=(3000, 1)))
    text = io.StringIO()
    np.savetxt(text, X, fmt=fmt, delimiter=",")
    expected = np.loadtxt(io.StringIO(text.getvalue()), delimiter=",", dtype=dtype, ndmin=2)
    assert same_bits(parse(text.getvalue(), dtype), expected)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=6),
    st.sampled_from(["{!r}", "{:.3e}", "{:.20f}", "{:.16g}", "{:+.1f}", " {} "]),
)
def test_each_number_is_the_nearest_double(values, form):
    texts = [form.format(v) for v in values]
    got = parse(",".join(texts) + "\n")
    assert same_bits(got, np.array([[float(t) for t in texts]]))


def test_the_plain_layout_in_all_its_forms():
    text = " -1.5e3 ,\t.5\r\n\n  \t\n+7,0.005\r\n-0,1.\n12E-2 , 00003.250\n"
    assert same_bits(parse(text), np.array([[-1500.0, 0.5], [7.0, 0.005], [-0.0, 1.0], [0.12, 3.25]]))
    assert same_bits(parse("1,2"), np.array([[1.0, 2.0]]))  # no final line end
    assert parse("\n \n").shape == (0, 0)
    assert same_bits(parse("x,y\n1,2\n", start=4), np.array([[1.0, 2.0]]))


@pytest.mark.parametrize(
    "text",
    [
        '"1",2\n',  # quoted
        "nan,1\n",
        "inf,1\n",
        "1;2\n",  # another separator
        "1,2\n3\n",  # rows of unequal length
        "1,2,\n3,4,\n",  # a trailing comma: an empty field
        "1,,2\n",
        "0x10,1\n",  # strtod's hexadecimal
        "1_000,1\n",  # Python's underscores
        "1e,2\n",
        "-,2\n",
        ".,2\n",
        "1 2,3\n",
        "1,2\r3,4\r",  # carriage returns alone
        "1,\u00e9\n",  # not ASCII
        "# comment\n1,2\n",
    ],
)
def test_any_other_layout_is_left_to_the_general_parser(text):
    assert parse(text) is None


def test_huge_exponents_and_long_digit_runs():
    text = "1e0000001,1e-400,1e400,123456789012345678901234567890,0.000000000000000000000000000001234\n"
    got = parse(text)
    assert same_bits(got, np.array([[10.0, 0.0, np.inf, 1.2345678901234568e29, 1.234e-30]]))


def test_load_points_reads_the_plain_layout_as_numpy_does(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(500, 4))
    path = tmp_path / "points.csv"
    body = io.StringIO()
    np.savetxt(body, X, fmt="%.9f", delimiter=",")
    path.write_bytes(b"\xef\xbb\xbf" + b"\n  \na,b,c,d\r\n" + body.getvalue().encode())
    expected = np.loadtxt(io.StringIO(body.getvalue()), delimiter=",")
    assert same_bits(load_points(path), expected)
    assert same_bits(load_points(path, "float32"), expected.astype(np.float32))
    # A layout the fast parser leaves (quoted cells) is read all the same, by the general one.
    path.write_text('"x","y"\n"1.5","2"\n3,4\n')
    assert same_bits(load_points(path), np.array([[1.5, 2.0], [3.0, 4.0]]))


def test_parse_refuses_bytes_without_the_final_zero():
    with pytest.raises(ValueError, match="0 byte"):
        numeric_csv.parse(np.frombuffer(b"1,2\n", np.uint8), 0, np.dtype(np.float64))
