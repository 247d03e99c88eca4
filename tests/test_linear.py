"""Linear: nn.Linear's parameters and results."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

from minitransformer.nn.linear import Linear
from minitransformer.training import device as device_mod


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 24), (1, 1, 24), (5, 24), (2, 3, 24)])
def test_equals_torch_linear(bias, shape):
    ours, theirs = Linear(24, 40, bias=bias), nn.Linear(24, 40, bias=bias)
    theirs.load_state_dict(ours.state_dict())  # same parameters, same names
    x = torch.randn(*shape, requires_grad=True)
    y, ref = ours(x), theirs(x)
    assert y.shape == ref.shape == (*shape[:-1], 40)
    torch.testing.assert_close(y, ref, rtol=1e-6, atol=1e-6)
    g, g_ref = torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0]
    torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6)


class ThreadSensitive(nn.Module):
    """Sleeps longer on one thread (fast_on_many) or on several (not fast_on_many)."""

    def __init__(self, fast_on_many: bool):
        super().__init__()
        self.fast_on_many = fast_on_many

    def forward(self, idx):
        many = torch.get_num_threads() > 1
        time.sleep(0.001 if many == self.fast_on_many else 0.01)


@pytest.mark.parametrize("fast_on_many", [True, False])
def test_decoding_threads_keeps_the_faster_count(monkeypatch, fast_on_many):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        model = ThreadSensitive(fast_on_many).train()
        chosen = device_mod.decoding_threads(model, torch.device("cpu"))
        assert chosen == (2 if fast_on_many else 1) == torch.get_num_threads()
        assert model.training  # put back as it was
    finally:
        torch.set_num_threads(before)


def test_decoding_threads_leaves_omp_num_threads_alone(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    n = torch.get_num_threads()
    assert device_mod.decoding_threads(ThreadSensitive(True), torch.device("cpu")) == n
