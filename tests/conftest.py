"""Test set-up: on a machine without CUDA the Triton interpreter runs every kernel on the CPU.

TRITON_INTERPRET must be set before any @triton.jit function is created, i.e. before qkernels is
imported, so it is set here at the top. `gpu`-marked tests (the same checks at real sizes) run only
where CUDA is available.
"""
import os
import zlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=20, deadline=None, derandomize=True)
settings.register_profile("gpu", max_examples=100, deadline=None)
settings.load_profile("gpu" if torch.cuda.is_available() else "ci")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
ON_GPU = DEVICE.type == "cuda"


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the README's test command): a worker per CPU core on the interpreter; on a GPU machine the workers
    share the device, so 4 at most."""
    n = os.cpu_count() or 1
    return min(n, 4) if ON_GPU else n


def pytest_collection_modifyitems(config, items):
    if ON_GPU:
        return
    skip = pytest.mark.skip(reason="gpu: needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed(request):
    # fixed per test (reproducible), different across tests
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def device():
    return DEVICE
