"""scripts/ab_chain.py (weight-only configs in the decode chain, PDL on and off) runs: on a CPU eagerly under the
interpreter at a small shape, one line per M, config and PDL setting with a time per shape (and with --fp16 one
line of fp16 F.linear per M)."""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ab_chain_prints_each_config_with_and_without_pdl():
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    cfg = '{"path": "mm", "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 128, "GROUP_N": 8, "num_warps": 4, "num_stages": 1}'
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_chain.py"), "--bits", "8", "--ms", "2",
                          "--shapes", "64x256", "32x128", "--config", cfg, "--table", "--fp16", "--timeline"],
                         capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    fp16 = [l for l in run.stdout.splitlines() if l.startswith("M=") and l.endswith("F.linear")]
    assert len(fp16) == 1 and all(float(t) > 0 for t in fp16[0].split()[3:5]), run.stdout    # --fp16: the baseline
    lines = [l for l in run.stdout.splitlines() if l.startswith("M=") and l not in fp16]
    assert len(lines) == 4, run.stdout               # (config, table) x (PDL, no PDL)
    assert "--timeline: no GPU" in run.stdout and "kernel/period/gap" not in run.stdout     # a GPU's profile only
    for line in lines:
        words = line.split()
        times = words[words.index("PDL") + 1:][:2]        # one per shape, after "PDL" / "no PDL"
        assert all(float(t) > 0 for t in times), line
    assert sum("table" in l for l in lines) == 2 and sum('"mm"' in l for l in lines) == 2, run.stdout


def test_ab_chain_times_a_scheme_through_the_table():
    """--scheme: QuantizedLinear layers (here W8A8, which takes no weight-only config) with PDL on and off."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_chain.py"), "--scheme", "w8a8", "--ms", "1",
                          "--shapes", "64x256", "--table"], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [l for l in run.stdout.splitlines() if l.startswith("M=")]
    assert len(lines) == 2 and all(float(l.split()[-2]) > 0 for l in lines), run.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_chain.py"), "--scheme", "w8a8", "--config",
                          "{}"], capture_output=True, text=True, env=env, timeout=600)
    assert bad.returncode != 0 and "drop --config" in bad.stderr


def test_ab_chain_times_swiglu_calls():
    """--swiglu: the weight-only calls with SwiGLU applied (a fused MLP's gate|up), through the table, and through
    the table's configs capped in registers (--maxnreg)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "ab_chain.py"), "--bits", "4", "--swiglu", "--ms",
                          "1", "--shapes", "64x256", "--table", "--maxnreg", "64"], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "with SwiGLU" in run.stdout
    lines = [l for l in run.stdout.splitlines() if l.startswith("M=")]
    assert len(lines) == 4 and sum("maxnreg=64" in l for l in lines) == 2, run.stdout
    assert all(float(l.split("PDL")[1].split()[0]) > 0 for l in lines), run.stdout
