"""scripts/bench_allreduce.py (the one-shot all-reduce against NCCL's over message sizes) needs CUDA GPUs under
torchrun: without them it says what it needs and exits 2, before any setup."""
from .helpers import run_script


def test_bench_allreduce_names_what_it_needs_without_gpus():
    run = run_script("bench_allreduce.py", "--kb", "8")
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert "needs CUDA GPUs and torchrun" in run.stderr and "CUDA not available" in run.stderr
