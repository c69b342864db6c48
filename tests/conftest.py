"""Fixtures shared by several test modules."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_torch_thread():
    """The tiny models run fastest on one thread, and a loaded 2-core box makes 2 threads ~10x slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
