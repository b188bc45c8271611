"""Checkpoint writes under faults: save_quantized interrupted at every step of its writing (in process), and a
child process killed at random times while it saves, never leave a directory that loads to anything but the old
checkpoint or the new one; damaged files (truncated or with a byte range overwritten) either load bit-exactly or
raise a ValueError that names the file, never another exception and never garbage."""
import json
import multiprocessing as mp
import os
import random
import time

import pytest
import torch
from torch import nn

import qkernels._files as files
from qkernels.nn.convert import CONFIG_NAME, load_quantized, quantize_, save_quantized


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(128, 256)
        self.b = nn.Linear(256, 128, bias=False)


def _quantized(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    m = _Net().half()
    quantize_(m, "w4a16", progress=False)
    return m


def _which(path, old, new) -> str:
    """'old' or 'new': the checkpoint the directory loads to (anything else fails the test)."""
    with torch.device("meta"):
        fresh = _Net().half()
    got = load_quantized(fresh, path)
    for name, m in (("old", old), ("new", new)):
        if all(torch.equal(got.state_dict()[k].cpu(), v.cpu()) for k, v in m.state_dict().items()):
            return name
    raise AssertionError("the directory loaded to neither the old nor the new checkpoint")


class _Crash(BaseException):
    """Stands for the process dying: not an Exception, so nothing on the way catches it as an error."""


def _interrupted_at(k: int, save, monkeypatch) -> bool:
    """Run save() with the process 'dying' at its k-th write step (a file flush or a rename in qkernels._files);
    returns whether it finished (it has fewer than k steps)."""
    real_replace, real_fsync = os.replace, files._fsync
    calls = [0]

    def step(fn, *a):
        calls[0] += 1
        if calls[0] == k:
            raise _Crash()
        return fn(*a)
    monkeypatch.setattr(files.os, "replace", lambda *a: step(real_replace, *a))
    monkeypatch.setattr(files, "_fsync", lambda p: step(real_fsync, p))
    try:
        save()
        return True
    except _Crash:
        return False
    finally:
        monkeypatch.setattr(files.os, "replace", real_replace)
        monkeypatch.setattr(files, "_fsync", real_fsync)


def test_save_interrupted_at_every_step_keeps_old_or_new(tmp_path, monkeypatch):
    old, new = _quantized(0), _quantized(1)
    save_quantized(old, tmp_path)
    steps, outcomes = 0, []
    for k in range(1, 40):
        finished = _interrupted_at(k, lambda: save_quantized(new, tmp_path), monkeypatch)
        outcomes.append(_which(tmp_path, old, new))
        if finished:
            steps = k - 1
            break
        save_quantized(old, tmp_path)            # back to the old checkpoint for the next fault point
    assert steps >= 4, "save_quantized has fewer write steps than expected: the fault loop did not run"
    assert outcomes[-1] == "new" and "old" in outcomes
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    assert not leftovers, leftovers
    cfg = json.loads((tmp_path / CONFIG_NAME).read_text())
    assert sorted(p.name for p in tmp_path.glob("*.safetensors")) == [cfg["weights"]], "old weights left behind"


def test_gptq_save_interrupted_at_every_step_never_loads_a_mix(tmp_path, monkeypatch):
    """save_gptq replaces two files (weights, then config.json with their checksum): interrupted anywhere, the
    directory loads to the old or the new model, or load_pretrained refuses it naming the interruption."""
    transformers = pytest.importorskip("transformers")
    from qkernels.nn.checkpoints import load_pretrained, save_gptq

    def model(seed, group):
        torch.manual_seed(seed)
        cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        m = transformers.LlamaForCausalLM(cfg).half().eval()
        quantize_(m, f"w4a16-g{group}", progress=False, fuse=False)
        return m

    old, new = model(0, 32), model(1, 64)        # another group size: a mix would still have loadable shapes
    save_gptq(old, tmp_path)
    outcomes = []
    for k in range(1, 40):
        finished = _interrupted_at(k, lambda: save_gptq(new, tmp_path), monkeypatch)
        try:
            got = load_pretrained(tmp_path, dtype=torch.float16)
            sd = {k: v for k, v in got.state_dict().items() if "rotary" not in k}
            which = [n for n, m in (("old", old), ("new", new))
                     if all(torch.equal(v, m.state_dict()[k]) for k, v in sd.items())]
            assert len(which) == 1, "the directory loaded to neither the old nor the new model"
            outcomes.append(which[0])
        except ValueError as err:
            assert "a save was interrupted" in str(err), err
            outcomes.append("refused")
        if finished:
            break
        save_gptq(old, tmp_path)
    assert outcomes[-1] == "new" and "old" in outcomes and "refused" in outcomes, outcomes
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def _save_forever(path: str, seed: int) -> None:
    torch.set_num_threads(1)
    models = [_quantized(seed), _quantized(seed + 1)]
    i = 0
    while True:
        save_quantized(models[i % 2], path)
        i += 1


def test_killed_while_saving_keeps_a_loadable_checkpoint(tmp_path):
    """A child saves two models alternately without end and is killed at a random moment, several times; after
    each kill the directory loads to one of the two, bit for bit."""
    a, b = _quantized(5), _quantized(6)
    save_quantized(a, tmp_path)
    ctx = mp.get_context("spawn")
    rng = random.Random(0)
    for trial in range(3):
        p = ctx.Process(target=_save_forever, args=(str(tmp_path), 5))
        p.start()
        time.sleep(4.0 + rng.random() * 2.0)     # past the child's start-up, into its save loop
        p.kill()
        p.join()
        assert _which(tmp_path, a, b) in ("old", "new")


@pytest.mark.parametrize("target", ["config", "weights"])
def test_damaged_files_load_exactly_or_raise_a_named_error(tmp_path, target):
    m = _quantized(3)
    save_quantized(m, tmp_path)
    cfg = json.loads((tmp_path / CONFIG_NAME).read_text())
    f = tmp_path / (CONFIG_NAME if target == "config" else cfg["weights"])
    good = f.read_bytes()
    rng = random.Random(1)
    cases = [good[:n] for n in sorted(rng.sample(range(len(good)), 40))]              # truncations
    for _ in range(60):                                                                 # overwritten ranges
        i = rng.randrange(len(good))
        n = rng.randrange(1, 64)
        cases.append(good[:i] + bytes(rng.randrange(256) for _ in range(min(n, len(good) - i))) + good[i + n:])
    loaded = errors = 0
    for data in cases:
        f.write_bytes(data)
        try:
            with torch.device("meta"):
                fresh = _Net().half()
            got = load_quantized(fresh, tmp_path)
        except (ValueError, FileNotFoundError) as e:
            assert f.name in str(e) or CONFIG_NAME in str(e), str(e)
            errors += 1
            continue
        for k, v in m.state_dict().items():           # what loads must be what was saved
            assert torch.equal(got.state_dict()[k], v.cpu()), k
        loaded += 1
    f.write_bytes(good)
    assert loaded + errors == len(cases) and errors > 0
