"""`qkernels env` and `qkernels bench [quantize|gemm|weight-only|all]`.

On a machine without a CUDA GPU the kernels run in the Triton interpreter (TRITON_INTERPRET=1 is
set here, before any kernel module is imported) at small sizes, and the output says so.
"""
from __future__ import annotations

import argparse
import os
import sys

BENCHES = ("quantize", "gemm", "weight-only")


def _ensure_backend() -> bool:
    import torch
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        os.environ["TRITON_INTERPRET"] = "1"
    return torch.cuda.is_available()


def cmd_env(_args) -> int:
    has_gpu = _ensure_backend()
    import torch
    import triton

    from qkernels import __version__
    from qkernels._runtime import is_interpreter
    print(f"qkernels     {__version__}")
    print(f"python       {sys.version.split()[0]}")
    print(f"torch        {torch.__version__} (cuda {torch.version.cuda})")
    print(f"triton       {triton.__version__}")
    try:
        import numpy
        print(f"numpy        {numpy.__version__}")
    except ImportError:
        pass
    print(f"interpreter  {'yes (TRITON_INTERPRET=1: kernels run on the CPU)' if is_interpreter() else 'no'}")
    if has_gpu:
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"gpu {i}        {p.name}, capability {p.major}.{p.minor}, {p.multi_processor_count} SMs, "
                  f"{p.total_memory / 2**30:.0f} GiB")
        if not is_interpreter():
            target = triton.runtime.driver.active.get_current_target()
            print(f"backend      {target.backend} (arch {target.arch})")
    else:
        print("gpu          none")
        print("backend      Triton interpreter (CPU)")
    return 0


def cmd_bench(args) -> int:
    has_gpu = _ensure_backend()
    from qkernels._runtime import is_interpreter
    if not has_gpu or is_interpreter():
        print("NOTE: no CUDA GPU in use: running the kernels in the Triton interpreter on the CPU at small sizes. "
              "Times below are host wall-clock of the interpreter, not GPU performance.")
    names = BENCHES if args.name == "all" else (args.name,)
    for name in names:
        print(f"== qkernels bench {name}")
        import importlib
        importlib.import_module(f"qkernels.bench.{name.replace('-', '_')}").run(args.out)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="qkernels", description="qkernels: quantized Triton kernels")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("env", help="versions, GPU, Triton backend, interpreter or not").set_defaults(fn=cmd_env)
    b = sub.add_parser("bench", help="run benchmarks against the peers and write results JSON + PNG")
    b.add_argument("name", nargs="?", default="quantize", choices=BENCHES + ("all",))
    b.add_argument("--out", default="benchmarks/results", help="results root (default: benchmarks/results)")
    b.set_defaults(fn=cmd_bench)
    args = parser.parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
