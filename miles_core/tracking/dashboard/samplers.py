"""What the dashboard samples every ``dashboard_gpu_sample_interval`` seconds on the driver's node, first available of:

    nvml        every NVML device (physical order, whatever CUDA_VISIBLE_DEVICES says): utilization %, memory used
                (all processes), power (W); as the reference's GpuSampler (miles/dashboard/gpu_sampler.py) - needs pynvml
    torch.cuda  the devices this process already holds memory on (no CUDA context is opened for the dashboard):
                memory used (total - free, all processes, torch.cuda.mem_get_info); utilization and power are None
                (torch reads them through NVML too)
    host        no GPU: the host's CPU % and memory used, and this process's RSS (psutil) - not a GPU number

The reference runs one sampler per GPU node (a Ray actor each); ours samples the node of the process that runs the
train flow only (docs/guide/trackers.md#dashboard). A device whose read fails is skipped for that tick, with a warning.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Callable

from .store import GpuSample, HostSample

log = logging.getLogger(__name__)


class RateLimitedLog:
    """A warning at most once per ``every`` seconds per message (a failing engine or device ticks every second)."""

    def __init__(self, logger: logging.Logger = log, every: float = 60.0):
        self.logger, self.every, self._last = logger, every, {}

    def warning(self, message: str, *args) -> None:
        now = time.monotonic()
        if now - self._last.get(message, -self.every) >= self.every:
            self._last[message] = now
            self.logger.warning(message, *args)


class NvmlSampler:
    source = "nvml"

    def __init__(self, nvml, node: str):
        self.nvml, self.node = nvml, node
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        self.warn = RateLimitedLog()

    def sample(self, ts: float) -> list[GpuSample]:
        out = []
        for gpu, h in enumerate(self.handles):
            try:
                util = int(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu)
                mem = int(self.nvml.nvmlDeviceGetMemoryInfo(h).used) >> 20
                power = int(self.nvml.nvmlDeviceGetPowerUsage(h)) // 1000
            except Exception as e:  # a GPU reset mid-run: skip it this tick, keep the others
                self.warn.warning("NVML read of gpu %d failed (%s); skipping it this tick", gpu, e)
                continue
            out.append(GpuSample(ts=ts, node=self.node, gpu=gpu, source=self.source, mem_mb=mem, util=util, power_w=power))
        return out

    def close(self) -> None:
        self.nvml.nvmlShutdown()


class TorchCudaSampler:
    source = "torch.cuda"

    def __init__(self, node: str):
        import torch

        self.torch, self.node, self.count = torch, node, torch.cuda.device_count()
        self.warn = RateLimitedLog()

    def sample(self, ts: float) -> list[GpuSample]:
        out = []
        if not self.torch.cuda.is_initialized():
            return out  # no CUDA context in this process yet: opening one on every device is not ours to do
        for gpu in range(self.count):
            if self.torch.cuda.memory_reserved(gpu) == 0:
                continue  # a device this process has no context on (the engines' or another rank's)
            try:
                free, total = self.torch.cuda.mem_get_info(gpu)
            except Exception as e:
                self.warn.warning("torch.cuda.mem_get_info(%d) failed (%s); skipping it this tick", gpu, e)
                continue
            out.append(GpuSample(ts=ts, node=self.node, gpu=gpu, source=self.source, mem_mb=(total - free) >> 20, util=None,
                                 power_w=None))
        return out

    def close(self) -> None:
        """Nothing held."""


class HostSampler:
    source = "host"

    def __init__(self, node: str):
        import psutil

        self.psutil, self.node, self.proc = psutil, node, psutil.Process(os.getpid())
        psutil.cpu_percent(interval=None)  # the first call only starts the measurement

    def sample(self, ts: float) -> list[HostSample]:
        return [HostSample(ts=ts, node=self.node, cpu_util=float(self.psutil.cpu_percent(interval=None)),
                           mem_mb=int(self.psutil.virtual_memory().used) >> 20, rss_mb=int(self.proc.memory_info().rss) >> 20)]

    def close(self) -> None:
        """Nothing held."""


def _nvml(node: str):
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # not installed, or no driver: the next sampler of the table
        log.info("NVML unavailable (%s): GPU utilization and power are not sampled", e)
        return None
    return NvmlSampler(pynvml, node)


def _torch_cuda(node: str):
    import torch

    return TorchCudaSampler(node) if torch.cuda.is_available() else None


def _host(node: str):
    return HostSampler(node)


# tried in order; the first that opens samples the run (its name is meta.json's device_sampler)
SAMPLERS: dict[str, Callable[[str], object]] = {"nvml": _nvml, "torch.cuda": _torch_cuda, "host": _host}


def open_sampler(node: str | None = None):
    node = node or socket.gethostname()
    for opener in SAMPLERS.values():
        sampler = opener(node)
        if sampler is not None:
            return sampler
    raise AssertionError("the host sampler always opens")


class Ticker:
    """Call ``fn()`` now and then every ``interval`` seconds on a daemon thread until ``stop``; an exception is logged
    (rate-limited) and the next tick runs: a telemetry failure never stops the run."""

    def __init__(self, name: str, interval: float, fn: Callable[[], None]):
        self.interval, self.fn = interval, fn
        self._stop = threading.Event()
        self._warn = RateLimitedLog()
        self.thread = threading.Thread(target=self._run, name=f"miles-dashboard-{name}", daemon=True)

    def start(self) -> "Ticker":
        self.thread.start()
        return self

    def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                self.fn()
            except Exception as e:
                self._warn.warning("dashboard %s tick failed: %r", self.thread.name, e)
            if self._stop.wait(max(0.0, self.interval - (time.monotonic() - started))):
                return

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout)
