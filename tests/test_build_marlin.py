"""scripts/build_marlin.sh (Marlin built from its public source as a benchmark peer, on a GPU machine): without its
source, or without a GPU, it says what it expected and exits 2 before building anything."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(src, site):
    env = dict(os.environ, MARLIN_SRC=str(src), MARLIN_SITE=str(site), CUDA_VISIBLE_DEVICES="")
    return subprocess.run(["bash", str(ROOT / "scripts" / "build_marlin.sh")], capture_output=True, text=True,
                          env=env, timeout=300)


def test_build_marlin_names_a_missing_source(tmp_path):
    run = _run(tmp_path / "none", tmp_path / "site")
    assert run.returncode == 2 and "expected Marlin's source (setup.py, marlin/) in" in run.stderr, run.stderr


def test_build_marlin_needs_a_gpu(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "setup.py").write_text("raise SystemExit('not to be built here')\n")
    run = _run(tmp_path / "src", tmp_path / "site")
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr, run.stderr
    assert not (tmp_path / "site").exists()


HINTED = '''__device__ inline void cp_async4_stream(void* smem_ptr, const void* glob_ptr) {
  asm volatile(
    "{\\n"
    "   .reg .b64 p;\\n"
    "   createpolicy.fractional.L2::evict_first.b64 p, 1.0;"
    "   cp.async.cg.shared.global.L2::cache_hint [%0], [%1], %2, p;\\n"
    "}\\n" :: "r"(smem), "l"(glob_ptr), "n"(BYTES)
  );
}
'''


def test_the_weight_copies_lose_their_cache_hint_and_nothing_else(tmp_path):
    """scripts/marlin_drop_cache_hint.py: the evict-first policy and the hinted copy become a plain cp.async.cg;
    a source without them is left as it is, byte for byte."""
    kernel = tmp_path / "marlin_cuda_kernel.cu"
    kernel.write_text("// before\n" + HINTED + "// after\n")
    script = str(ROOT / "scripts" / "marlin_drop_cache_hint.py")
    run = subprocess.run(["python3", script, str(kernel)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "cache hint dropped" in run.stdout, run.stderr
    got = kernel.read_text()
    assert "createpolicy" not in got and "L2::cache_hint" not in got
    assert '"   cp.async.cg.shared.global [%0], [%1], %2;\\n"' in got
    assert got.replace('    "   cp.async.cg.shared.global [%0], [%1], %2;\\n"\n', "") == \
        ("// before\n" + HINTED + "// after\n").replace(
            '    "   createpolicy.fractional.L2::evict_first.b64 p, 1.0;"\n'
            '    "   cp.async.cg.shared.global.L2::cache_hint [%0], [%1], %2, p;\\n"\n', "")
    run = subprocess.run(["python3", script, str(kernel)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "no L2 cache hint" in run.stdout and kernel.read_text() == got
