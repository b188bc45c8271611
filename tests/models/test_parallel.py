"""Tensor parallelism (qkernels.models.parallel): cutting layers, and TP=2 against TP=1 on the same weights.

The TP=2 checks run in two processes (torch.multiprocessing spawn): gloo on the CPU (kernels in the Triton
interpreter), NCCL where there are two GPUs. Each rank builds the TP=1 model on its own (a one-rank
subgroup) beside the TP=2 one, so the two are compared in the same process; the ranks' outputs are
compared with each other through an all-gather.
"""
import json
import os
import traceback

import pytest
import torch

transformers = pytest.importorskip("transformers")

import qkernels as qk  # noqa: E402
from qkernels.models.parallel import Part, shard_linear  # noqa: E402
from qkernels.packed_weight import PackedWeight  # noqa: E402

from ..conftest import DEVICE  # noqa: E402
from ..helpers import spawn_workers  # noqa: E402

WORLD = 2
CUDA_TP = torch.cuda.device_count() >= WORLD
# greedy decode steps compared (the interpreter: fewer, every path still taken: a prompt, then steps on the cache)
STEPS = 32 if CUDA_TP else 4
SAMPLED = (24, 16) if CUDA_TP else (8, 4)      # tokens sampled: without a seed, with one


# ---------------------------------------------------------------------------------------------
# cutting one layer (no process group needed)


def _linear(n=96, k=128, dt=torch.float16, bias=True):
    torch.manual_seed(3)
    return torch.nn.Linear(k, n, bias=bias).to(DEVICE, dt)


ROWS = Part(0, ((16, 48), (64, 80)))                          # two spans of output rows
COLS = [Part(1, ((0, 64),), keep_bias=True), Part(1, ((64, 128),), keep_bias=False)]


@pytest.mark.parametrize("scheme", [None, "w4a16-g32", "w4a16-g-1", "w8a16", "w8a8", "w8a8-fp8", "w4a8-fp8-g64"])
def test_row_parts_hold_exactly_the_rows(scheme):
    lin = _linear()
    full = qk.QuantizedLinear.from_linear(lin, scheme) if scheme else lin
    part = shard_linear(full, ROWS)
    assert scheme is None or part.scheme == full.scheme
    rows = torch.cat([torch.arange(16, 48), torch.arange(64, 80)]).to(DEVICE)
    if scheme is None:
        assert torch.equal(part.weight, lin.weight[rows]) and torch.equal(part.bias, lin.bias[rows])
    elif full.scheme.weight_only:
        assert torch.equal(part.packed_weight().dequantize(), full.packed_weight().dequantize()[rows])
        assert torch.equal(part.bias, full.bias[rows])
    else:
        assert torch.equal(part.weight, full.weight[rows]) and torch.equal(part.weight_scale, full.weight_scale[rows])


@pytest.mark.parametrize("scheme", [None, "w4a16-g32", "w4a16-g-1", "w8a16", "w8a8", "w8a8-fp8", "w4a8-fp8-g64"])
def test_column_parts_sum_to_the_whole(scheme):
    if scheme and "fp8" in scheme and DEVICE.type == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89+")
    lin = _linear()
    full = qk.QuantizedLinear.from_linear(lin, scheme) if scheme else lin
    parts = [shard_linear(full, p) for p in COLS]
    assert scheme is None or all(p.scheme == full.scheme for p in parts)
    assert parts[0].bias is not None and parts[1].bias is None          # the bias is added once
    if scheme is not None and full.scheme.weight_only:
        w = full.packed_weight().dequantize()
        assert torch.equal(torch.cat([p.packed_weight().dequantize() for p in parts], 1), w)
    elif scheme is not None:     # w8a8: the codes' columns, each row's scale as it was
        assert torch.equal(torch.cat([p.weight.view(torch.uint8) for p in parts], 1), full.weight.view(torch.uint8))
        assert all(torch.equal(p.weight_scale, full.weight_scale) for p in parts)
    x = torch.randn(5, 128, device=DEVICE, dtype=torch.float16)
    want = full(x).float()
    got = parts[0](x[:, :64]).float() + parts[1](x[:, 64:]).float()
    # w8a8: each part quantizes its own slice of x per token, so the sum differs by activation rounding (e4m3:
    # 3 mantissa bits)
    tol = {"w8a8": 2e-2, "w8a8-fp8": 6e-2, "w4a8-fp8-g64": 6e-2}.get(scheme, 4e-3)
    assert ((got - want).norm() / want.norm()).item() < tol


def _act_order(g_idx):
    torch.manual_seed(4)
    N, K = 32, 128
    q = torch.randint(0, 16, (N, K), dtype=torch.uint8)
    s = torch.rand(N, K // 32) + 0.5
    z = torch.randint(0, 16, (N, K // 32)).float()
    pw = PackedWeight.from_int(q, s.half(), z, bits=4, group_size=32, g_idx=g_idx)
    return qk.QuantizedLinear.from_packed(pw.to(DEVICE))


def test_act_order_columns_cut_on_whole_groups():
    # input channels shuffled within each half: each half holds whole groups, in act-order order
    g = torch.arange(128) // 32
    g = torch.cat([g[:64][torch.randperm(64)], g[64:][torch.randperm(64)]])
    full = _act_order(g)
    parts = [shard_linear(full, p) for p in COLS]
    w = full.packed_weight().dequantize()
    assert torch.equal(torch.cat([p.packed_weight().dequantize() for p in parts], 1), w)
    assert all(p.perm is not None for p in parts)


def test_act_order_split_across_groups_is_refused():
    full = _act_order(torch.arange(128)[torch.randperm(128)] // 32)    # every group spread over K
    with pytest.raises(ValueError, match="do not form whole groups of 32 in its act-order"):
        shard_linear(full, COLS[0], "model.layers.0.mlp.down_proj")


def test_groups_cut_in_the_middle_are_refused():
    full = qk.QuantizedLinear.from_linear(_linear(), "w4a16-g64")
    with pytest.raises(ValueError, match="do not form whole groups of 64"):
        shard_linear(full, Part(1, ((0, 32),)), "o_proj")


def test_one_shot_bytes_from_the_environment(monkeypatch):
    """QKERNELS_TP_ONESHOT_BYTES sets the one-shot all-reduce's largest message (default 16 MB); a value that is not
    a byte count of at least 4096, a multiple of 16, is refused naming the variable."""
    from qkernels.models.parallel import one_shot_bytes
    monkeypatch.delenv("QKERNELS_TP_ONESHOT_BYTES", raising=False)
    assert one_shot_bytes() == 16 << 20
    monkeypatch.setenv("QKERNELS_TP_ONESHOT_BYTES", str(1 << 16))
    assert one_shot_bytes() == 1 << 16
    for bad in ("16MB", "100", "65537", "-65536"):
        monkeypatch.setenv("QKERNELS_TP_ONESHOT_BYTES", bad)
        with pytest.raises(ValueError, match=f"QKERNELS_TP_ONESHOT_BYTES: expected a byte count .* got '{bad}'"):
            one_shot_bytes()


def test_allreduce_choice_from_the_environment(monkeypatch):
    """QKERNELS_TP_ALLREDUCE: unset, "nccl" or "ll"; anything else is refused naming the variable."""
    from qkernels.models.parallel import allreduce_choice
    monkeypatch.delenv("QKERNELS_TP_ALLREDUCE", raising=False)
    assert allreduce_choice() == ""
    for v in ("nccl", "ll"):
        monkeypatch.setenv("QKERNELS_TP_ALLREDUCE", v)
        assert allreduce_choice() == v
    monkeypatch.setenv("QKERNELS_TP_ALLREDUCE", "NCCL ")
    with pytest.raises(ValueError, match=r"QKERNELS_TP_ALLREDUCE: expected 'nccl', 'll' or unset, got 'NCCL '"):
        allreduce_choice()


def test_default_group_dies_with_destroy_process_group():
    """A script that imports qkernels.models and then initializes its group: torch.distributed.nn (imported by
    qkernels.models, and later by loading a model) holds no reference to the group in its defaults, so
    destroy_process_group frees it (its gloo threads, left alive, aborted the process at exit)."""
    import subprocess
    import sys
    script = (
        "import sys, torch, torch.distributed as dist\n"
        "import qkernels.models\n"
        "dist.init_process_group('gloo', rank=0, world_size=1, store=dist.HashStore())\n"
        "import torch.distributed.nn.functional as f\n"
        "pg = dist.group.WORLD\n"
        "dist.destroy_process_group()\n"
        "print(f.broadcast.__defaults__[-1] is None, sys.getrefcount(pg))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    defaults_free, refs = run.stdout.split()
    assert defaults_free == "True"
    assert int(refs) == 2          # the script's own name and getrefcount's argument: nothing else holds it


# ---------------------------------------------------------------------------------------------
# TP=2 against TP=1, in two processes


def _run_checks(rank: int, tmp: str):
    """Every TP check on this rank: {name: "ok" or the failure}."""
    import torch.distributed as dist

    from qkernels.models import from_pretrained

    from .test_llama import hf_model
    dev = torch.device("cuda", rank) if CUDA_TP else torch.device("cpu")
    single, _ = dist.new_subgroups(1)              # a one-rank group per rank: TP=1
    results = {}

    def same_on_ranks(t):
        got = [torch.empty_like(t) for _ in range(WORLD)]
        dist.all_gather(got, t.contiguous())
        return all(torch.equal(g, got[0]) for g in got)

    def check(name, fn):
        try:
            fn()
            results[name] = "ok"
        except Exception:   # noqa: BLE001  (reported to the parent test, which fails on it)
            results[name] = traceback.format_exc(limit=4)

    def both(src, scheme=None, dtype=torch.float32, **kw):
        one = from_pretrained(src, scheme, device=dev, dtype=dtype, tp_group=single, **kw)
        two = from_pretrained(src, scheme, device=dev, dtype=dtype, **kw)
        return one, two

    def fp32(kind, over):
        hf = hf_model(kind, **over).to(dev)
        one, two = both(hf)
        torch.manual_seed(7)
        ids = torch.randint(0, 96, (2, 13), device=dev)
        want, got = one(ids), two(ids)
        # fp32; the partial sums of the row-parallel layers add in another order (1e-5 of the logit scale)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        assert same_on_ranks(got)
        ids = torch.randint(0, 96, (2, 7), device=dev)
        g1, g2 = one.generate(ids, STEPS), two.generate(ids, STEPS)
        assert torch.equal(g1, g2) and same_on_ranks(g2)

    for kind, over in [("llama", {}), ("llama", {"tie_word_embeddings": True, "num_key_value_heads": 1}),
                       ("qwen3", {"tie_word_embeddings": True}), ("qwen2", {"num_key_value_heads": 4})]:
        check(f"fp32 {kind} {over}", lambda: fp32(kind, over))

    def fused_norm(scheme):
        """The blocks hand their partial sums to the norm after them: with Parallel.all_reduce_rms_norm taking the
        message (here a stand-in with the fused op's bits: the partials gathered, summed as the one-shot all-reduce
        sums them, then the rms_norm kernel; GPUs run the kernel itself), the model is TP=1's, every norm after the
        embeddings goes through it (int8 codes and scales straight into the next GEMM with w8a8), and every rank
        agrees."""
        from qkernels import reference as ref
        from qkernels import rms_norm as norm_op
        dt = torch.float32 if scheme is None else qdt
        hf = hf_model("llama", dtype=dt).to(dev)
        one, two = both(hf, scheme, dt)
        calls = []

        def op(x, residual, weight, eps, quantize=None):
            parts = [torch.empty_like(x) for _ in range(WORLD)]
            dist.all_gather(parts, x.contiguous(), group=two.tp.group)
            calls.append(quantize)
            out = norm_op(ref.all_reduce_sum(parts), weight, eps, residual=residual, quantize=quantize)
            return out if isinstance(out, tuple) else (out,)
        two.tp.all_reduce_rms_norm = op
        torch.manual_seed(10)
        ids = torch.randint(0, 96, (2, 9), device=dev)
        want, got = one(ids).float(), two(ids).float()
        assert len(calls) == 2 * len(two.layers), calls
        assert set(calls) == ({None} if scheme is None else {None, "int8"}), calls
        if scheme is None:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        else:   # per shard: per-token activation scales over a rank's slice of K
            assert rel(got, want) < 3e-2, rel(got, want)
        assert same_on_ranks(got)
        assert same_on_ranks(two.generate(ids, min(6, STEPS)))

    def sampling():
        one, two = both(hf_model("llama").to(dev))
        out = two.generate([[3, 4, 5]], SAMPLED[0], temperature=0.9, top_k=40, top_p=0.95)   # no seed: rank 0 draws
        assert same_on_ranks(torch.tensor(out, device=dev))
        a = two.generate([3, 4, 5], SAMPLED[1], temperature=0.9, seed=11)
        b = one.generate([3, 4, 5], SAMPLED[1], temperature=0.9, seed=11)
        assert a == b
    check("sampling", sampling)

    qdt = torch.float16 if CUDA_TP else torch.bfloat16

    def rel(a, b):
        return ((a - b).norm() / b.norm()).item()

    def scheme_case(scheme):
        hf = hf_model("llama", dtype=qdt).to(dev)
        one, two = both(hf, scheme, qdt)
        torch.manual_seed(8)
        ids = torch.randint(0, 96, (2, 9), device=dev)
        want, got = one(ids).float(), two(ids).float()
        if scheme == "w4a16-g32":
            # the same codes and scales; partial sums rounded to the activation dtype before they are added
            assert rel(got, want) < 1e-2, rel(got, want)
        else:
            # row-parallel layers quantized per shard (per-channel scales over a rank's slice of K; w8a8: per-token
            # activation scales over it too): another rounding of the same weights, as close to the float model
            exact = from_pretrained(hf, None, device=dev, dtype=qdt, tp_group=single)(ids).float()
            assert rel(got, exact) < 1.25 * rel(want, exact) + 1e-3, (rel(got, exact), rel(want, exact))
        assert same_on_ranks(got)
        assert same_on_ranks(two.generate(ids, min(8, STEPS)))

    for scheme in ("w4a16-g32", "w4a16-g-1", "w8a16", "w8a8") + (("w8a8-fp8",) if not CUDA_TP or
                                                                  torch.cuda.get_device_capability(dev) >= (8, 9)
                                                                  else ()):
        check(f"scheme {scheme}", lambda: scheme_case(scheme))

    def images():
        """Qwen3-VL with images under TP: the vision tower whole on every rank, the language model split; logits of
        prompts with images (two images, and a batch of two prompts) and greedy tokens after them as TP=1's."""
        if not hasattr(transformers, "Qwen3VLConfig"):
            return
        from .test_vision import hf_vl, prompt_with
        from .test_vision import images as pixels
        hf = hf_vl().to(dev)
        one, two = both(hf)
        assert two.visual is not None
        torch.manual_seed(11)                      # the same pixels on every rank
        pv, grid = pixels([[1, 4, 6], [1, 2, 4]])
        pv, grid = pv.to(dev), grid.to(dev)
        ids = torch.tensor([prompt_with([6, 2], [[5, 6, 7], [8, 9], [10]])], device=dev)
        want, got = one(ids, pixel_values=pv, image_grid_thw=grid), two(ids, pixel_values=pv, image_grid_thw=grid)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        assert same_on_ranks(got)
        g1 = one.generate(ids, STEPS // 2, pixel_values=pv, image_grid_thw=grid)
        g2 = two.generate(ids, STEPS // 2, pixel_values=pv, image_grid_thw=grid)
        assert torch.equal(g1, g2) and same_on_ranks(g2)
    check("images", images)

    def ll_protocol():
        """QKERNELS_TP_ALLREDUCE=ll: the decode step's fused all-reduces under the LL protocol give the flag
        protocol's bits (logits of a prompt, greedy tokens through the captured decode step)."""
        hf = hf_model("llama", dtype=qdt).to(dev)
        flag = from_pretrained(hf, "w4a16-g32", device=dev, dtype=qdt)
        os.environ["QKERNELS_TP_ALLREDUCE"] = "ll"
        try:
            ll = from_pretrained(hf, "w4a16-g32", device=dev, dtype=qdt)
        finally:
            del os.environ["QKERNELS_TP_ALLREDUCE"]
        assert ll.tp.norm_peers.ll and not flag.tp.norm_peers.ll
        torch.manual_seed(12)
        ids = torch.randint(0, 96, (2, 9), device=dev)
        assert torch.equal(ll(ids), flag(ids))
        assert torch.equal(ll.generate(ids, STEPS), flag.generate(ids, STEPS))
    if CUDA_TP:                                     # gloo: no one-shot kernels
        check("LL protocol", ll_protocol)

    check("fused all-reduce + norm, fp32", lambda: fused_norm(None))
    check("fused all-reduce + norm, w8a8", lambda: fused_norm("w8a8"))

    def from_dirs():
        # rank 0 writes each directory, every rank reads it (as ranks read one checkpoint)
        def written(name, save):
            d = os.path.join(tmp, name)
            if rank == 0:
                save(d)
            dist.barrier()
            return d

        hf = hf_model("qwen3", tie_word_embeddings=True)
        one, two = both(written("hf", lambda d: hf.save_pretrained(d, safe_serialization=True)))  # read shard-only
        torch.manual_seed(9)                         # the same prompt on every rank
        ids = torch.randint(0, 96, (1, 6), device=dev)
        want = one(ids)
        torch.testing.assert_close(two(ids), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
        hq = hf_model("llama", dtype=qdt)
        qk.quantize_(hq, "w4a16-g32", progress=False)
        hw = hf_model("llama", dtype=qdt)
        qk.quantize_(hw, "w8a8", progress=False)         # fused QuantizedMLP: gate|up cut as one merged weight
        for name, model, fmt in (("gptq", hq, "gptq"), ("w4a16", hq, "qkernels"), ("w8a8", hw, "qkernels")):
            one, two = both(written(name, lambda d: qk.save_quantized(model, d, format=fmt)), dtype=qdt)
            want, got = one(ids).float(), two(ids).float()
            # the same codes; w8a8: per-token activation scales over a rank's slice of K
            assert rel(got, want) < (3e-2 if name == "w8a8" else 1e-2), (name, rel(got, want))
            assert same_on_ranks(got)
    check("directories", from_dirs)

    def act_order():
        # a GPTQ act-order checkpoint (every projection's input channels in a random group order) but o_proj's,
        # whose heads a rank must hold: each rank takes whole groups of the down projection in its act-order
        # order, and gate / up rows to match
        from pathlib import Path

        from safetensors.torch import load_file, save_file

        from ..nn.test_checkpoints import write_checkpoint

        def write(d):
            d, _ = write_checkpoint(Path(d), "gptq", act_order=True)
            f = d / "model.safetensors"
            sd = load_file(str(f))
            for k in [k for k in sd if k.endswith("o_proj.g_idx")]:
                sd[k] = (torch.arange(sd[k].numel()) // 32).to(torch.int32)
            save_file(sd, str(f), metadata={"format": "pt"})
            (Path(tmp) / "act_dir").write_text(str(d))

        if rank == 0:
            os.makedirs(os.path.join(tmp, "act"), exist_ok=True)
            write(os.path.join(tmp, "act"))
        dist.barrier()
        d = open(os.path.join(tmp, "act_dir")).read()
        one, two = both(d, dtype=qdt)
        assert two.layers[0].feed_forward.w_down.perm is not None
        torch.manual_seed(9)                         # the same prompt on every rank (rank 0's writer drew numbers)
        ids = torch.randint(0, 96, (1, 6), device=dev)
        want, got = one(ids).float(), two(ids).float()
        # the same codes; partial sums rounded to the activation dtype (bf16 on the CPU) before they are added
        assert rel(got, want) < 2e-2, rel(got, want)
        assert same_on_ranks(got)
    check("act-order", act_order)

    def refused():
        import pytest as pt
        with pt.raises(ValueError, match=r"intermediate_size \(64\) must be a multiple of group_size=128"):
            from_pretrained(hf_model("llama", dtype=qdt), "w4a16", device=dev, dtype=qdt)
        with pt.raises(ValueError, match="num_key_value_heads=3 must divide or be a multiple"):
            from_pretrained(hf_model("llama", hidden_size=96, num_attention_heads=6, num_key_value_heads=3), device=dev)
    check("refused splits", refused)
    return results


def _worker(rank: int, port: int, tmp: str):
    import datetime

    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if CUDA_TP:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if CUDA_TP else "gloo", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=300))
    try:
        results = _run_checks(rank, tmp)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(tmp, f"results{rank}.json"), "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module")
def tp_results(tmp_path_factory):
    if DEVICE.type == "cuda" and not CUDA_TP:
        pytest.skip(f"tensor parallel on GPUs needs {WORLD} of them")
    tmp = str(tmp_path_factory.mktemp("tp"))
    spawn_workers(_worker, WORLD, (tmp,), 1500, "the tensor-parallel workers")
    return [json.load(open(os.path.join(tmp, f"results{r}.json"))) for r in range(WORLD)]


CHECKS = (["fp32 llama {}", "fp32 llama {'tie_word_embeddings': True, 'num_key_value_heads': 1}",
           "fp32 qwen3 {'tie_word_embeddings': True}", "fp32 qwen2 {'num_key_value_heads': 4}", "sampling"]
          + [f"scheme {s}" for s in ("w4a16-g32", "w4a16-g-1", "w8a16", "w8a8", "w8a8-fp8")]
          + ["images", "LL protocol", "fused all-reduce + norm, fp32", "fused all-reduce + norm, w8a8", "directories",
             "act-order", "refused splits"])


@pytest.mark.parametrize("name", CHECKS)
def test_tp2_matches_tp1(tp_results, name):
    if name == "scheme w8a8-fp8" and name not in tp_results[0]:
        pytest.skip("fp8 needs sm_89+")
    if name == "LL protocol" and not CUDA_TP:
        pytest.skip("the one-shot all-reduce kernels run on GPUs")
    failed = {rank: res.get(name) for rank, res in enumerate(tp_results) if res.get(name) != "ok"}
    assert not failed, "\n".join(f"rank {r}: {why}" for r, why in failed.items())


# ---------------------------------------------------------------------------------------------
# a rank that fails mid-decode


def _failing_worker(rank: int, port: int, tmp: str):
    """Two ranks decode; rank 1's process ends after the third token (as a crash would). Rank 0 must end with an
    error naming rank 1, not hang: it writes what it raised and how long after rank 1 left."""
    import datetime
    import time

    import torch.distributed as dist

    from qkernels.models import from_pretrained

    from .test_llama import hf_model
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=300))
    model = from_pretrained(hf_model("llama"), device="cpu", dtype=torch.float32)
    left = []

    def on_tokens(new):
        left.append(time.monotonic())
        if rank == 1 and len(left) == 3:
            os._exit(0)                  # no clean-up, no goodbye: the peers only see its connections close

    try:
        model.generate([3, 4, 5], 12, on_tokens=on_tokens)
        res = {"raised": None}
    except RuntimeError as e:
        res = {"raised": str(e), "after_s": time.monotonic() - left[-1]}
    with open(os.path.join(tmp, f"failed{rank}.json"), "w") as f:
        json.dump(res, f)
    os._exit(0)                          # the group is broken: no destroy_process_group


@pytest.mark.skipif(DEVICE.type == "cuda", reason="gloo on the CPU: on GPUs the one-shot kernels' bounded wait is "
                    "tested emulated (tests/ops/test_collective.py)")
def test_a_rank_that_fails_mid_decode_is_named_not_waited_for(tmp_path):
    spawn_workers(_failing_worker, WORLD, (str(tmp_path),), 600, "the tensor-parallel workers")
    assert not (tmp_path / "failed1.json").exists()          # rank 1 ended before it could write
    res = json.load(open(tmp_path / "failed0.json"))
    assert res["raised"] and "rank 1 stopped answering" in res["raised"], res
    assert "tensor parallel: an all-reduce failed on rank 0 of 2" in res["raised"], res
    assert res["after_s"] < 60, res
