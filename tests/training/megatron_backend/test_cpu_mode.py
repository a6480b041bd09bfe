"""The CPU redirects are one small module, applied only for device cpu on a machine without CUDA."""

from __future__ import annotations

import torch

from miles_core.training.megatron import cpu


def test_inert_when_cuda_is_available():
    before = (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.get_rng_state, torch.cuda.manual_seed)
    assert cpu.install("cpu", cuda_available=True) == []
    assert cpu.install("cuda", cuda_available=True) == []
    assert (torch.cuda.current_device, torch.cuda.synchronize, torch.cuda.get_rng_state, torch.cuda.manual_seed) == before
    assert not cpu.should_redirect("cpu", cuda_available=True) and not cpu.should_redirect("cuda", cuda_available=False)


def test_redirects_on_cpu_and_restores():
    original = torch.cuda.current_device
    try:
        patched = cpu.install("cpu", cuda_available=False)
        assert "torch.cuda.current_device" in patched and "torch.cuda.get_rng_state" in patched
        assert torch.cuda.current_device() == torch.device("cpu")
        state = torch.cuda.get_rng_state()  # the CPU generator's
        a = torch.rand(3)
        torch.cuda.set_rng_state(state)
        assert torch.equal(torch.rand(3), a)
    finally:
        cpu.uninstall()
    assert torch.cuda.current_device is original


def test_cuda_type_names_only_inside_the_optimizer_set_up():
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    seen = cpu._cuda_type_names(lambda t: (t.type(), t.type(torch.float64).dtype))(torch.zeros(2))
    assert seen == ("torch.cuda.FloatTensor", torch.float64)  # named as CUDA's; a cast still casts
    assert torch.zeros(2).type() == "torch.FloatTensor"
    original = DistributedOptimizer.__init__
    try:
        cpu.install("cpu", cuda_available=False)
        cpu.install("cpu", cuda_available=False)  # idempotent: wrapped once
        assert DistributedOptimizer.__init__.__wrapped__ is original
    finally:
        cpu.uninstall()
    assert DistributedOptimizer.__init__ is original
