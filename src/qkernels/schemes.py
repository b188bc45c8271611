"""Quantization schemes as values.

The strings users type ("w4a16", "w8a8-fp8", "w4a16-g64-sym") are parsed once, at the API boundary
(`parse_scheme`), into frozen dataclasses that carry every choice explicitly; the layers below take the
objects. The defaults live here and only here. Pure data: no device work, no kernel imports.

    W8A8()                      int8 weights per output channel, dynamic per-token int8 activations
    W8A8(fp8=True)              the same in float8_e4m3fn
    WeightOnly(4)               4-bit weights in groups of 128 along K, zero points; fp16 / bf16 activations
    WeightOnly(8)               8-bit weights per output channel, symmetric
    WeightOnly(4, fp8_act=True) W4A8-FP8: W4A16's weights, activations quantized per token to float8_e4m3fn
                                in the linear (batched calls; a single token runs W4A16's GEMV)

Per channel (one group spanning a whole row) is `group_size=PER_CHANNEL` (-1) everywhere in the API.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

PER_CHANNEL = -1
WEIGHT_ONLY_BITS = (4, 8)
DEFAULT_GROUP_SIZE = {4: 128, 8: PER_CHANNEL}
DEFAULT_SYMMETRIC = {4: False, 8: True}


GROUP_SIZES = f"a power of two >= 32, or {PER_CHANNEL} (one group per output channel)"


def check_group_size(group_size) -> None:
    g = group_size
    if not isinstance(g, int) or isinstance(g, bool) or not (g == PER_CHANNEL or (g >= 32 and g & (g - 1) == 0)):
        raise ValueError(f"group_size must be {GROUP_SIZES}, got {g!r}")


@dataclass(frozen=True)
class W8A8:
    """8-bit weights (per output channel) and 8-bit activations (per token, quantized on the fly or by the
    fused norm / SwiGLU kernel before the GEMM)."""
    fp8: bool = False

    weight_only = False

    def __post_init__(self):
        if not isinstance(self.fp8, bool):
            raise TypeError(f"fp8 must be a bool, got {self.fp8!r}")

    @property
    def name(self) -> str:
        return "w8a8-fp8" if self.fp8 else "w8a8"

    @property
    def format(self) -> str:
        """The qkernels.formats name of the weight and activation codes."""
        return "fp8_e4m3" if self.fp8 else "int8"

    @property
    def gemm_dtype(self) -> str:
        """w8a8_linear's `dtype` argument."""
        return "fp8" if self.fp8 else "int8"

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class WeightOnly:
    """`bits`-bit weights in groups of `group_size` along K (PER_CHANNEL: one group per row), with zero points
    unless symmetric; activations stay fp16 / bf16. None takes the default for `bits`. fp8_act (4-bit only,
    "w4a8-fp8"): the same weights, stored and loaded exactly as W4A16's, multiplied by activations quantized per
    token to float8_e4m3fn inside the linear on FP8 tensor cores wherever a call has W4A8_MIN_M rows or more (a
    few decode tokens gain nothing from FP8 and run W4A16's GEMVs)."""
    bits: int = 4
    group_size: int | None = None
    symmetric: bool | None = None
    fp8_act: bool = False

    weight_only = True      # stored as weight-only schemes are (PackedWeight); fp8_act changes only the product

    def __post_init__(self):
        if self.bits not in WEIGHT_ONLY_BITS or isinstance(self.bits, bool):
            raise ValueError(f"bits must be one of {WEIGHT_ONLY_BITS}, got {self.bits!r}")
        if not isinstance(self.fp8_act, bool):
            raise TypeError(f"fp8_act must be a bool, got {self.fp8_act!r}")
        if self.fp8_act and self.bits != 4:
            raise ValueError(f"fp8_act (W4A8-FP8) takes 4-bit weights, got bits={self.bits}")
        if self.group_size is None:
            object.__setattr__(self, "group_size", DEFAULT_GROUP_SIZE[self.bits])
        check_group_size(self.group_size)
        if self.fp8_act and self.group_size != PER_CHANNEL and self.group_size % 64:
            raise ValueError(f"w4a8-fp8 needs group_size a multiple of 64 or {PER_CHANNEL} (per channel): its kernels "
                             f"promote whole 64-k chunks, got {self.group_size}")
        if self.symmetric is None:
            object.__setattr__(self, "symmetric", DEFAULT_SYMMETRIC[self.bits])
        if not isinstance(self.symmetric, bool):
            raise TypeError(f"symmetric must be a bool, got {self.symmetric!r}")

    @property
    def name(self) -> str:
        return "w4a8-fp8" if self.fp8_act else f"w{self.bits}a16"

    @property
    def spec(self) -> str:
        """The full string parse_scheme reads back: "w4a16-g128-asym", "w8a16-g-1-sym"."""
        return f"{self.name}-g{self.group_size}-{'sym' if self.symmetric else 'asym'}"

    def __str__(self) -> str:
        return self.name


Scheme = W8A8 | WeightOnly
SCHEME_NAMES = ("w8a8", "w8a8-fp8", "w4a16", "w8a16", "w4a8-fp8")
# rows of a call from which a w4a8-fp8 linear quantizes its activations (fewer: W4A16's kernels, whose GEMVs beat
# the FP8 wgmma kernel's 16-token tiles there: H200, Llama-3-8B's decode step at batch 8 2519 µs on W4A16's kernels
# against 2902 on W4A8's, benchmarks/results/h200/runtime.json 2026-12-02)
W4A8_MIN_M = 9
_GRAMMAR = re.compile(r"(?P<base>w8a8-fp8|w8a8|w4a16|w8a16|w4a8-fp8)(?:-g(?P<group>-?\d+))?(?:-(?P<sym>sym|asym))?")
_SYNTAX = ("w8a8, w8a8-fp8, or w4a16 / w8a16 / w4a8-fp8 optionally followed by -g<group_size> (-g-1: per channel) "
           "and -sym or -asym")


def parse_scheme(scheme, *, group_size: int | None = None, symmetric: bool | None = None) -> Scheme:
    """A Scheme from a Scheme or from the string a user types (see _SYNTAX), with group_size / symmetric given
    beside it (as quantize_(model, "w4a16", group_size=64) takes them). A choice made twice must agree."""
    if isinstance(scheme, W8A8 | WeightOnly):
        parsed, from_string = scheme, {}
    elif isinstance(scheme, str):
        m = _GRAMMAR.fullmatch(scheme)
        if m is None:
            raise ValueError(f"scheme must be {_SYNTAX} (e.g. 'w4a16-g64-sym'), got {scheme!r}")
        base = m["base"]
        from_string = {}
        if m["group"]:
            from_string["group_size"] = int(m["group"])
        if m["sym"]:
            from_string["symmetric"] = m["sym"] == "sym"
        if base.startswith("w8a8"):
            if from_string:
                raise ValueError(f"scheme {base!r} quantizes weights per output channel and symmetrically; "
                                 f"got {scheme!r}")
            parsed = W8A8(fp8=base == "w8a8-fp8")
        else:
            parsed = WeightOnly(int(base[1]), **from_string, fp8_act=base == "w4a8-fp8")
    else:
        raise TypeError(f"scheme must be a str ({_SYNTAX}) or a qkernels.schemes.W8A8 / WeightOnly, "
                        f"got {type(scheme).__name__}")
    given = {k: v for k, v in (("group_size", group_size), ("symmetric", symmetric)) if v is not None}
    if not given:
        return parsed
    if not parsed.weight_only:
        if given.get("group_size", PER_CHANNEL) != PER_CHANNEL or "symmetric" in given and not given["symmetric"]:
            raise ValueError(f"scheme {parsed.name!r} quantizes weights per output channel and symmetrically; "
                             f"got {given}")
        return parsed
    explicit = from_string if isinstance(scheme, str) else {"group_size": scheme.group_size,
                                                            "symmetric": scheme.symmetric}
    for key, value in given.items():
        if key in explicit and explicit[key] != value:
            raise ValueError(f"{key}={value!r} contradicts the scheme {scheme!s} ({key}={explicit[key]!r})")
    return WeightOnly(parsed.bits, given.get("group_size", parsed.group_size),
                      given.get("symmetric", parsed.symmetric), parsed.fp8_act)
