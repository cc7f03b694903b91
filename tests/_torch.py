"""Shared by the torch test modules (imported after their ``pytest.importorskip("torch")``)."""
from __future__ import annotations

import pytest
import torch.distributed as dist

import mpicoll.torch  # noqa: F401 - registers the backend and mpi://


@pytest.fixture(scope="module", autouse=True)
def world_group():
    """The module's default process group on the mpicoll backend, made once, destroyed after it."""
    if not dist.is_initialized():
        dist.init_process_group("mpicoll", init_method="mpi://")
    yield dist.group.WORLD
    dist.destroy_process_group()
