"""Which kernel and config run a weight-only call: the rules, as data where they can be.

Paths (the "path" of a config-table entry; tables per GPU in configs/<gpu>.json, keys "w4a16" / "w8a16",
M-bucketed, shape overrides; defaults in configs/__init__.py):
  "gemv"     Triton-language GEMV, fp32 FMA reduction (decode)
  "gv"       Gluon GEMV with paired fp16 products (decode): 4-bit weights, fp16 x, K a multiple of 64, groups of a
             multiple of 64 or per channel
  "gvt"      Gluon GEMV on tensor cores (decode, M <= 16): 4- or 8-bit weights with integer zero points, fp16 x,
             K a multiple of 64, groups of a multiple of 128 (8-bit: 64) or per channel
  "tc"       Gluon tensor-core kernel for M <= 16: 4-bit weights, groups of a multiple of TC_K or per channel
  "mm"       Triton-language tensor-core GEMM with in-register dequantization
  "wg"       Gluon Hopper kernel (wgmma on in-register dequantized weights, overlapped with the next tile's
             dequantization): 4- or 8-bit weights, groups of a multiple of WG_K or per channel
  "dequant"  dequantize to x's dtype, then cuBLAS
A "gv", "gvt", "tc" or "wg" config carries a "fallback" config for the cases its kernel does not run (SUPPORTED). A GPU
without a table autotunes once per shape (qkernels.autotune). Tests and tuners pin a path with force_path() or a
whole config with use_config(): scoped, never by assigning module globals.
"""
from __future__ import annotations

import functools

import torch

from ... import configs
from ..._runtime import capability, device_name, gpu_slug, is_interpreter, next_pow2, scoped_value
from ...schemes import PER_CHANNEL

# "tc" (kernels/weight_only/tc.py, Gluon): 4-bit weights, K a multiple of TC_K, groups of a multiple of TC_K
# or per channel, CUDA GPUs of sm_80+. "wg" (kernels/weight_only/wg.py, Gluon, wgmma): 4- or 8-bit weights, K a
# multiple of WG_K, groups of a multiple of WG_K or per channel, sm_90 (Hopper) only.
TC_K = 128
WG_K = 64
GV_K = 64
GVT_K = {4: 128, 8: 64}          # "gvt": k per block (16 code words of a row), by bits
TC_DEFAULT = dict(path="tc", BLOCK_N=64, BLOCK_M=8, num_warps=4, SPLIT_K=8, MIN_PROGRAMS=2048)
WG_DEFAULT = dict(path="wg", BLOCK_M=256, BLOCK_N=128, GROUP_M=8, STAGES=4, num_warps=8)
GV_DEFAULT = dict(path="gv", BLOCK_N=8, BLOCK_K=2048, WPT=4, num_warps=2, SPLIT_K=4, MIN_PROGRAMS=1024)
GVT_DEFAULT = dict(path="gvt", TILES=1, WPT=8, num_warps=1, SPLIT_K=8, MIN_PROGRAMS=4096)   # the sweeps' M <= 4 pick
_GLUON_DEFAULTS = {"tc": TC_DEFAULT, "wg": WG_DEFAULT, "gv": GV_DEFAULT, "gvt": GVT_DEFAULT}
# the Triton-language path a forced Gluon path falls back to
_GLUON_FALLBACK = {"tc": "gemv", "wg": "mm", "gv": "gemv", "gvt": "gemv"}
# what force_path takes: a path, or "<path>-splitk" (K split 3 ways, whatever the grid)
PATHS = ("gemv", "mm", "dequant", "tc", "wg", "gv", "gvt", "gemv-splitk", "mm-splitk", "tc-splitk", "wg-splitk",
         "gv-splitk", "gvt-splitk")
FORCED_SPLIT_K = 3


def tc_supported(bits: int, K: int, group_size: int, qweight: torch.Tensor, dtype: torch.dtype | None = None,
                 int_zeros: bool = True) -> bool:
    """Whether the Gluon tensor-core kernel runs this case: NVIDIA sm_80+ (mma.sync, cp.async); it has no
    interpreter twin (the Triton-language kernels are its CPU stand-ins). It reads code rows as 16-byte
    vectors: rows must be 16-byte aligned."""
    return (bits == 4 and K % TC_K == 0 and (group_size == PER_CHANNEL or group_size % TC_K == 0) and not is_interpreter()
            and qweight.is_cuda and torch.version.hip is None and _capability(qweight.device) >= (8, 0)
            and qweight.data_ptr() % 16 == 0 and qweight.stride(0) % 16 == 0)


def wg_supported(bits: int, K: int, group_size: int, qweight: torch.Tensor, dtype: torch.dtype | None = None,
                 int_zeros: bool = True) -> bool:
    """Whether the Gluon wgmma kernel runs this case: 4- or 8-bit codes, sm_90 (wgmma is Hopper's; no interpreter
    twin), code rows 16-byte aligned (TMA descriptors need 16-byte aligned bases and row strides)."""
    return (bits in (4, 8) and K % WG_K == 0 and (group_size == PER_CHANNEL or group_size % WG_K == 0)
            and not is_interpreter() and qweight.is_cuda and torch.version.hip is None and _capability(qweight.device) == (9, 0)
            and qweight.data_ptr() % 16 == 0 and qweight.stride(0) % 16 == 0)


def gv_supported(bits: int, K: int, group_size: int, qweight: torch.Tensor, dtype: torch.dtype | None = None,
                 int_zeros: bool = True) -> bool:
    """Whether the Gluon paired-fp16 GEMV runs this case: fp16 x (dtype; None: any the caller has), NVIDIA sm_80+
    (no interpreter twin: the Triton-language GEMV is its CPU stand-in), code rows 16-byte aligned."""
    return (bits == 4 and dtype in (None, torch.float16) and K % GV_K == 0
            and (group_size == PER_CHANNEL or group_size % GV_K == 0) and not is_interpreter()
            and qweight.is_cuda and torch.version.hip is None and _capability(qweight.device) >= (8, 0)
            and qweight.data_ptr() % 16 == 0 and qweight.stride(0) % 16 == 0)


def gvt_supported(bits: int, K: int, group_size: int, qweight: torch.Tensor, dtype: torch.dtype | None = None,
                  int_zeros: bool = True) -> bool:
    """Whether the Gluon tensor-core GEMV runs this case: 4- or 8-bit codes, K a multiple of 64, groups of a
    multiple of its block (GVT_K: 4-bit 128, 8-bit 64) or per channel, fp16 x (dtype; None: any the caller has),
    integer zero points (int_zeros: PackedWeight.int_zeros; its MMA multiplies u - z exactly), NVIDIA sm_80+ (no
    interpreter twin: the Triton-language GEMV is its CPU stand-in), code rows 16-byte aligned."""
    return (bits in GVT_K and dtype in (None, torch.float16) and int_zeros and K % 64 == 0
            and (group_size == PER_CHANNEL or group_size % GVT_K[bits] == 0) and not is_interpreter()
            and qweight.is_cuda and torch.version.hip is None and _capability(qweight.device) >= (8, 0)
            and qweight.data_ptr() % 16 == 0 and qweight.stride(0) % 16 == 0)


# the Gluon paths: which cases their kernels run (elsewhere their configs' "fallback" runs); the x dtype and
# whether the zero points are integers are passed where the caller has them
SUPPORTED = {"tc": tc_supported, "wg": wg_supported, "gv": gv_supported, "gvt": gvt_supported}


def _capability(device: torch.device) -> tuple:
    return capability(device)     # cached per device; a simulated capability (tests) is seen too


@functools.cache
def _config_bucket(bits: int, m_bucket: int, N: int, K: int, device: torch.device) -> dict | None:
    """The shipped config for this GPU, M bucket and shape (configs.lookup: a shape override if the table
    has one); None for a GPU without a table (autotuned)."""
    if is_interpreter():
        return configs.pick(configs.INTERPRETER_WEIGHT_ONLY, m_bucket)
    table = configs.load(gpu_slug(device_name(device))).get(f"w{bits}a16")
    return configs.lookup(table, m_bucket, N, K) if table else None


_FORCED_CONFIG: list = [None]    # set only inside use_config()


def config_for(bits: int, M: int, N: int, K: int, device: torch.device) -> dict | None:
    forced = _FORCED_CONFIG[0]
    if forced is not None:
        return forced
    return _config_bucket(bits, next_pow2(max(M, 1)), N, K, device)


def use_config(cfg: dict):
    """Every weight-only call inside the block runs `cfg` (a config-table entry, e.g. {"path": "gemv",
    "BLOCK_N": 16, ...}) whatever M and shape: the scoped override the tuner and profilers use."""
    if not isinstance(cfg, dict) or "path" not in cfg:
        raise ValueError(f"cfg must be a config-table entry with a 'path' key, got {cfg!r}")
    return scoped_value(_FORCED_CONFIG, cfg)


_FORCED_PATH: list = [None]      # set only inside force_path()


def force_path(path: str):
    """Every weight-only call inside the block runs `path` (one of PATHS) whatever M: the config the table has
    for that path at the nearest M bucket, or the default one. The tests run every path at every M with it."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return scoped_value(_FORCED_PATH, path)


def forced_path() -> str | None:
    return _FORCED_PATH[0]


def path_config(cfg: dict | None, path: str, bits: int, N: int, K: int, device) -> dict:
    """The config that runs `path` (see force_path); cfg: the table's config for this call."""
    base, _, split = path.partition("-")
    if cfg is not None and cfg["path"] == base:
        chosen = cfg
    elif base in _GLUON_DEFAULTS:
        chosen = dict(_GLUON_DEFAULTS[base], fallback=path_config(cfg, _GLUON_FALLBACK[base], bits, N, K, device))
    else:
        table = (_config_bucket(bits, m, N, K, device) for m in (1 << i for i in range(17)))
        chosen = next((c for c in table if c is not None and c["path"] == base), None) or configs.pick(
            {k: v for k, v in configs.DEFAULT_WEIGHT_ONLY.items() if v["path"] == base}, 1)
    return dict(chosen, SPLIT_K=FORCED_SPLIT_K, MIN_PROGRAMS=1 << 30) if split else chosen
