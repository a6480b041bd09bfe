"""CPU mode for megatron-core: the test and debugging mode (docs/guide/backends.md#cpu-mode).

megatron-core 0.16 runs on CPU under ``torch.distributed`` gloo with the local (non Transformer-Engine)
layer spec and ``use_cpu_initialization``, except for a handful of hard-coded CUDA calls. They are
redirected here, and only here, to their CPU equivalents:

    torch.cuda.current_device  -> torch.device("cpu")  (tensors megatron allocates "on the GPU")
    torch.cuda.synchronize     -> no-op
    Tensor.cuda                -> the tensor itself (e.g. the tied-embedding copy of the last pipeline stage)
    torch.cuda.get_rng_state / set_rng_state / manual_seed  -> the CPU generator's
    tensor_parallel.random._get_cuda_rng_state / _set_cuda_rng_state  -> the CPU generator's
        (so the RNG tracker's forks, e.g. for TP-sharded init and dropout, fork the CPU generator)
    MoEAlltoAllTokenDispatcher.cuda_dtoh_stream, torch.cuda.current_stream / stream  -> one synchronous
        CPU "stream" (the MoE all-to-all dispatcher copies its token counts to the host on a side stream;
        on CPU there is nothing to overlap). torch.cuda.Stream itself stays: libraries annotate with it.
    moe token_dispatcher.maybe_move_tensor_to_cpu  -> also for CPU tensors: the all-to-all split sizes become
        numpy arrays (it converts only CUDA tensors, and all_to_all_single takes no tensor as split sizes)
    pipeline_parallel.schedules.torch  -> torch, with device="cuda" in tensor factories read as cpu (the
        schedules allocate their token counter with a literal device="cuda"); the same for the optimizer
        modules optimizer.optimizer, optimizer.clip_grads, optimizer.distrib_optimizer and core.utils (the
        distributed optimizer's flags, norms and gather buffers; utils' local multi-tensor L2 norm)
    DistributedOptimizer.__init__, Float16OptimizerWithFloat16Params.__init__ (bf16 / fp16 main weights),
    clip_grad_by_total_norm_fp32 (as optimizer.optimizer calls it)  -> the same, run with
        Tensor.type() (no arguments) naming a CPU tensor by its CUDA type ("torch.cuda.FloatTensor"):
        they sort parameters into fp32 / 16-bit groups by those names and refuse any other

Each redirect replaces a call that would raise on a machine without CUDA, so nothing that works is
changed. With CUDA present nothing is patched (``should_redirect``), whatever the device: the real
calls are then the right ones.
"""

from __future__ import annotations

import contextlib
import functools
import types

import torch

_ORIGINALS: dict[tuple[object, str], object] = {}


def should_redirect(device: str, cuda_available: bool) -> bool:
    """Redirect only for device cpu on a machine without CUDA."""
    return device == "cpu" and not cuda_available


class _CpuStream:
    """The one stream of a CPU: work is done when the call returns."""

    def wait_stream(self, other) -> None: ...
    def synchronize(self) -> None: ...
    def record_event(self, event=None) -> "_CpuStream":
        return self  # an event on the CPU stream is complete: .synchronize() is a no-op
    def query(self) -> bool:
        return True


_CPU_STREAM = _CpuStream()


class _TorchOnCpu(types.ModuleType):
    """torch, except that zeros / ones / empty / tensor / full read device="cuda" as the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")

    def __getattr__(self, name: str):
        value = getattr(torch, name)
        if name not in ("zeros", "ones", "empty", "tensor", "full"):
            return value

        def factory(*args, device=None, **kwargs):
            return value(*args, device="cpu" if str(device).startswith("cuda") else device, **kwargs)
        return factory


def _cuda_type_names(fn):
    """fn, run with Tensor.type() of a CPU tensor answering its CUDA type name (see the module docstring)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        original = torch.Tensor.type

        def cuda_named(self, dtype=None, non_blocking=False, **kw):
            if dtype is None and not kw and self.device.type == "cpu":
                return original(self).replace("torch.", "torch.cuda.", 1)
            return original(self, dtype, non_blocking, **kw)

        torch.Tensor.type = cuda_named
        try:
            return fn(*args, **kwargs)
        finally:
            torch.Tensor.type = original
    return wrapper


def _original(owner, name: str):
    return _ORIGINALS.get((owner, name), getattr(owner, name))


def _to_host(tensor, as_numpy: bool = False, record_stream: bool = False):
    return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor


def _redirects() -> list[tuple[object, str, object]]:
    import megatron.core.tensor_parallel.random as mrandom
    from megatron.core import utils as mutils
    from megatron.core.optimizer import clip_grads, distrib_optimizer
    from megatron.core.optimizer import optimizer as moptimizer
    from megatron.core.pipeline_parallel import schedules
    from megatron.core.transformer.moe import token_dispatcher
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    cpu = torch.device("cpu")
    return [
        (torch.cuda, "current_device", lambda: cpu),
        (torch.cuda, "synchronize", lambda device=None: None),
        (torch.Tensor, "cuda", lambda self, *args, **kwargs: self),
        (torch.cuda, "get_rng_state", lambda device="cuda": torch.get_rng_state()),
        (torch.cuda, "set_rng_state", lambda new_state, device="cuda": torch.set_rng_state(new_state)),
        (torch.cuda, "manual_seed", lambda seed: torch.manual_seed(seed)),
        (MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", _CPU_STREAM),
        (torch.cuda, "current_stream", lambda device=None: _CPU_STREAM),
        (torch.cuda, "stream", lambda stream: contextlib.nullcontext()),
        (schedules, "torch", _TorchOnCpu()),
        (moptimizer, "torch", _TorchOnCpu()),
        (clip_grads, "torch", _TorchOnCpu()),
        (distrib_optimizer, "torch", _TorchOnCpu()),
        (mutils, "torch", _TorchOnCpu()),
        (distrib_optimizer.DistributedOptimizer, "__init__", _cuda_type_names(_original(distrib_optimizer.DistributedOptimizer, "__init__"))),
        (moptimizer.Float16OptimizerWithFloat16Params, "__init__",
         _cuda_type_names(_original(moptimizer.Float16OptimizerWithFloat16Params, "__init__"))),
        (moptimizer, "clip_grad_by_total_norm_fp32", _cuda_type_names(_original(moptimizer, "clip_grad_by_total_norm_fp32"))),
        (token_dispatcher, "maybe_move_tensor_to_cpu", _to_host),
        (mrandom, "_get_cuda_rng_state", lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()),
        (mrandom, "_set_cuda_rng_state", lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)),
    ]


def install(device: str, cuda_available: bool | None = None) -> list[str]:
    """Apply the redirects when should_redirect(device, cuda_available) (default: torch.cuda.is_available()).
    Idempotent. -> the names patched (empty: inert)."""
    cuda_available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if not should_redirect(device, cuda_available):
        return []
    patched = []
    for owner, name, replacement in _redirects():
        _ORIGINALS.setdefault((owner, name), getattr(owner, name))
        setattr(owner, name, replacement)
        patched.append(f"{getattr(owner, '__name__', owner)}.{name}")
    return patched


def uninstall() -> None:
    """Put the original functions back (tests)."""
    for (owner, name), original in _ORIGINALS.items():
        setattr(owner, name, original)
    _ORIGINALS.clear()
