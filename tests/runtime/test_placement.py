"""Placement plans and data-parallel row shares: pure functions, no Ray."""

from __future__ import annotations

import pytest

from miles_core.config.cluster import ClusterConfig
from miles_core.runtime.ray.placement import plan_placement
from miles_core.training.data_parallel import split_rows


def test_disaggregated_gets_own_bundles():
    p = plan_placement(ClusterConfig(actor_num_gpus_per_node=2, rollout_num_gpus=4, rollout_num_gpus_per_engine=2), use_gpu=False)
    assert len(p.bundles) == 6 and p.bundles[0] == {"CPU": 1.0}
    assert p.train_bundles == [0, 1] and p.engine_bundles == [2, 4]  # 4 rollout bundles / 2 per engine = 2 engines
    assert p.actor_resources() == {"num_cpus": 1.0, "num_gpus": 0.0}


def test_colocated_shares_train_bundles():
    p = plan_placement(ClusterConfig(actor_num_nodes=2, actor_num_gpus_per_node=2, colocate=True), use_gpu=True)
    assert len(p.bundles) == 4 and p.bundles[0] == {"CPU": 1.0, "GPU": 1.0}
    assert p.train_bundles == [0, 1, 2, 3] and p.engine_bundles == [0, 1, 2, 3]  # rollout_num_gpus defaults to the actor total
    assert p.actor_resources() == {"num_cpus": 0.4, "num_gpus": 0.4}  # the reference's shares: train 0.4, engine 0.2
    assert p.engine_resources() == {"num_cpus": 0.2, "num_gpus": 0.2}


def test_external_engines_place_the_train_ranks_only():
    cluster = ClusterConfig(actor_num_gpus_per_node=2, rollout_num_gpus=4, rollout_num_gpus_per_engine=2)
    p = plan_placement(cluster, use_gpu=True, engines=False)
    assert p.bundles == [{"CPU": 1.0, "GPU": 1.0}] * 2 and p.train_bundles == [0, 1] and p.engine_bundles == []
    assert p.actor_resources() == {"num_cpus": 1.0, "num_gpus": 1.0}


def test_bad_engine_split_names_fields():
    with pytest.raises(ValueError, match="rollout_num_gpus_per_engine"):
        plan_placement(ClusterConfig(rollout_num_gpus=3, rollout_num_gpus_per_engine=2), use_gpu=False)
    with pytest.raises(ValueError, match="colocate"):
        plan_placement(ClusterConfig(actor_num_gpus_per_node=1, rollout_num_gpus=2, colocate=True), use_gpu=False)


def test_split_rows_contiguous_and_balanced():
    lengths = [10, 1, 1, 1, 9, 2, 0, 0]
    assert split_rows(range(0, 8), lengths, 2, balance=False) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split_rows(range(0, 5), lengths, 2, balance=False) == [[0, 1, 2], [3, 4]]
    # longest first onto the lightest rank (ties: fewer rows, then lower rank): 10 9 2 1 1 1 0 0 -> 12 | 12
    shares = split_rows(range(0, 8), lengths, 2, balance=True)
    assert sorted(shares[0] + shares[1]) == list(range(8))
    loads = [sum(lengths[i] for i in s) for s in shares]
    assert loads == [12, 12]  # 24 tokens split evenly (a contiguous split gives 13 / 11)
    assert split_rows(range(4, 8), lengths, 2, balance=True) == [[4], [5, 6, 7]]  # 9 | 2 + 0 + 0


def test_engines_bind_loopback_on_one_node_and_their_node_address_across_nodes():
    from miles_core.runtime.ray.placement import engine_hosts

    addresses = {"n1": "10.0.0.1", "n2": "10.0.0.2"}
    assert engine_hosts(["n1"] * 4, addresses, [2, 3]) == ["127.0.0.1", "127.0.0.1"]  # one node: nothing else reaches it
    # train bundles 0-1 on n1, engine bundles 2 (n1) and 3 (n2): each engine binds the address of its own bundle's node
    assert engine_hosts(["n1", "n1", "n1", "n2"], addresses, [2, 3]) == ["10.0.0.1", "10.0.0.2"]
    assert engine_hosts(["n2", "n1"], addresses, [0, 1]) == ["10.0.0.2", "10.0.0.1"]
