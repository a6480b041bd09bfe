"""distributed_timeout_minutes (the reference's Megatron-LM flag, default 10): the timeout of the trainer's collectives,
read back from the gloo process groups themselves (the one-rank world of the local runtime and megatron-core's groups)."""

from __future__ import annotations

import datetime

import pytest
import torch

from miles_core.config.parallel import ParallelConfig
from miles_core.training.megatron import cpu, parallel


def _timeouts() -> tuple[datetime.timedelta, datetime.timedelta]:
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    def of(group):
        return group._get_backend(torch.device("cpu")).options._timeout

    return of(dist.group.WORLD), of(ps.get_tensor_model_parallel_group())


@pytest.mark.parametrize("minutes", [10, 3])
def test_the_groups_time_out_after_distributed_timeout_minutes(minutes):
    p = ParallelConfig() if minutes == 10 else ParallelConfig(distributed_timeout_minutes=minutes)  # 10: the default
    parallel.init_parallel(p, seed=1234, device="cpu")
    try:
        assert _timeouts() == (datetime.timedelta(minutes=minutes),) * 2
    finally:
        parallel.teardown()
        cpu.uninstall()
