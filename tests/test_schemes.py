"""Typed schemes (src/qkernels/schemes.py): the strings users type parse to one object, with the defaults filled in."""
import pytest

from qkernels.schemes import PER_CHANNEL, W8A8, WeightOnly, parse_scheme


@pytest.mark.parametrize("text,want", [
    ("w8a8", W8A8()),
    ("w8a8-fp8", W8A8(fp8=True)),
    ("w4a16", WeightOnly(4, 128, False)),
    ("w8a16", WeightOnly(8, PER_CHANNEL, True)),
    ("w4a16-g64", WeightOnly(4, 64, False)),
    ("w4a16-g-1-sym", WeightOnly(4, PER_CHANNEL, True)),
    ("w8a16-g128-asym", WeightOnly(8, 128, False)),
    ("w4a8-fp8", WeightOnly(4, 128, False, fp8_act=True)),
    ("w4a8-fp8-g64-sym", WeightOnly(4, 64, True, fp8_act=True)),
])
def test_strings_parse_to_objects_with_defaults(text, want):
    got = parse_scheme(text)
    assert got == want and parse_scheme(got) is got
    assert got.name == text.split("-g")[0]
    if got.weight_only:                      # the full spelling reads back to the same object
        assert parse_scheme(got.spec) == got


def test_names_formats():
    assert (W8A8().format, W8A8().gemm_dtype, str(W8A8())) == ("int8", "int8", "w8a8")
    assert (W8A8(True).format, W8A8(True).gemm_dtype, W8A8(True).name) == ("fp8_e4m3", "fp8", "w8a8-fp8")
    assert WeightOnly(4).spec == "w4a16-g128-asym" and WeightOnly(8).spec == "w8a16-g-1-sym"
    assert not W8A8().weight_only and WeightOnly().weight_only
    w4a8 = WeightOnly(4, fp8_act=True)       # stored as W4A16 is: a weight-only scheme to every loader
    assert (w4a8.name, w4a8.spec, w4a8.weight_only) == ("w4a8-fp8", "w4a8-fp8-g128-asym", True)
    assert parse_scheme("w4a8-fp8", group_size=-1) == WeightOnly(4, PER_CHANNEL, False, True)


def test_options_beside_the_string():
    assert parse_scheme("w4a16", group_size=32, symmetric=True) == WeightOnly(4, 32, True)
    assert parse_scheme("w4a16-g32", group_size=32) == WeightOnly(4, 32)      # said twice, agreeing
    assert parse_scheme("w8a8", group_size=PER_CHANNEL, symmetric=True) == W8A8()
    with pytest.raises(ValueError, match="group_size=64 contradicts the scheme w4a16-g32"):
        parse_scheme("w4a16-g32", group_size=64)
    with pytest.raises(ValueError, match="symmetric=False contradicts"):
        parse_scheme(WeightOnly(8), symmetric=False)
    with pytest.raises(ValueError, match="'w8a8' quantizes weights per output channel and symmetrically"):
        parse_scheme("w8a8", group_size=128)


@pytest.mark.parametrize("bad,err,msg", [
    ("w3a16", ValueError, r"scheme must be w8a8, w8a8-fp8, or w4a16 / w8a16 .*got 'w3a16'"),
    ("w4a16-g48", ValueError, r"group_size must be a power of two >= 32, or -1 .*got 48"),
    ("w4a8-fp8-g32", ValueError, r"w4a8-fp8 needs group_size a multiple of 64 or -1 .*got 32"),
    ("w8a8-g128", ValueError, r"'w8a8' quantizes weights per output channel"),
    ("W4A16", ValueError, r"scheme must be"),
    (4, TypeError, r"scheme must be a str .*got int"),
])
def test_bad_schemes_are_named(bad, err, msg):
    with pytest.raises(err, match=msg):
        parse_scheme(bad)


def test_bad_fields():
    with pytest.raises(ValueError, match="bits must be one of \\(4, 8\\), got 3"):
        WeightOnly(3)
    with pytest.raises(TypeError, match="symmetric must be a bool, got 'yes'"):
        WeightOnly(4, symmetric="yes")
    with pytest.raises(TypeError, match="fp8 must be a bool"):
        W8A8(fp8=1)
    with pytest.raises(ValueError, match="fp8_act .* takes 4-bit weights, got bits=8"):
        WeightOnly(8, fp8_act=True)
    with pytest.raises(TypeError, match="fp8_act must be a bool, got 1"):
        WeightOnly(4, fp8_act=1)
    with pytest.raises(Exception, match="cannot assign"):
        WeightOnly(4).bits = 8                # frozen: a scheme is a value
