"""Two Ray nodes on one machine: the multi-node path we cannot otherwise run here. ``ray.cluster_utils.Cluster`` starts a
real head (GCS + raylet) and a second raylet, each with a custom resource of its own; the second reports the address
127.0.0.2 (a loopback address, so reachable here, but not 127.0.0.1: an engine URL built from a hard-coded localhost
fails). Two engines of TP 2 (our HTTP server processes, started by EngineGroup's actors), one placed on each node by its
node's resource: each binds the address its node reports, the router reaches both there, with the run's API key
required; a broadcast sync from the driver on the head (group ranks 1+2 and 3+2 of 5, across the nodes) and a disk
sync each leave both engines generating what the trainer's weights generate. The same cluster (one Ray start) holds the
TP engines' GPU test: 4 GPUs declared on the head."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import httpx
import pytest
import torch

from miles_core.config import build_config
from miles_core.runtime.ray.engines import EngineGroup, start_hf_server
from miles_core.runtime.ray.placement import create_placement_group, plan_placement

NODE2 = "127.0.0.2"
BUCKET = 256 * 1024
GPUS = 4  # declared on the head, for test_two_colocated_engines_of_tp_2_each_see_two_gpus


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # the in-process engine computes as the servers do: bit for bit


@pytest.fixture(scope="module")
def two_nodes():
    """-> {resource: the address its node reports}. Head: 7 CPUs (the train bundle and engine 0's two, the GPU test's 4
    while those are held) and 4 declared GPUs (no real ones); node 2: 2 CPUs."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 7, "num_gpus": GPUS, "resources": {"head_node": 3},
                                                            "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=2, resources={"node2": 2}, node_ip_address=NODE2)
        ray.init(address=cluster.address, log_to_driver=False)
        nodes = {r: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"] for r in ("head_node", "node2") if r in n["Resources"]}
        yield nodes
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def engines(two_nodes, tiny_model_dir, tmp_path_factory):
    """EngineGroup over a placement group whose engine bundles ask for a node's resource: engine 0 on the head, 1 on node 2."""
    import ray

    cfg = build_config({"prompt_data": "x.jsonl", "rollout_batch_size": 4, "n_samples_per_prompt": 2, "runtime": "ray",
                        "rollout_num_gpus": 4, "rollout_num_gpus_per_engine": 2, "num_threads": 1,
                        "run_dir": str(tmp_path_factory.mktemp("run"))})
    plan = plan_placement(cfg.cluster, use_gpu=False)
    where = {0: "head_node"} | {b: "head_node" for b in plan.engine_bundle_sets()[0]} | {b: "node2" for b in plan.engine_bundle_sets()[1]}
    plan = dataclasses.replace(plan, bundles=[{**bundle, where[i]: 1.0} for i, bundle in enumerate(plan.bundles)])
    pg = create_placement_group(plan)
    group = EngineGroup(cfg, str(tiny_model_dir), pg, plan, start_hf_server)
    yield group
    group.shutdown()
    ray.util.remove_placement_group(pg)


@pytest.fixture(scope="module")
def trainer_model(moved_tiny_model):
    return moved_tiny_model()


def test_engines_bind_the_address_their_node_reports_and_require_the_key(two_nodes, engines):
    assert two_nodes["node2"] == NODE2 and engines.hosts == [two_nodes["head_node"], NODE2]
    assert [u.rsplit(":", 1)[0] for u in engines.urls] == [f"http://{two_nodes['head_node']}", f"http://{NODE2}"]
    for url in engines.urls:
        assert httpx.get(url + "/model_info").status_code == 401  # the run's key is required ...
        assert httpx.get(url + "/health").status_code == 200  # ... except on the probes, as in SGLang
        info = httpx.get(url + "/server_info", headers={"Authorization": f"Bearer {engines.api_key}"}).json()
        assert info["tp_size"] == 2


@pytest.mark.parametrize("mode", ["broadcast", "disk"])
def test_weight_sync_across_the_nodes(mode, two_nodes, engines, trainer_model, tiny_tokenizer, tmp_path):
    """The sender is the driver, on the head: its group address is the head's (Ray's node report); engine 1's TP ranks
    join from node 2. Afterwards both engines serve the new version and generate what the trainer's weights do."""
    from miles_core.rollout.hf_engine import HFEngine
    from miles_core.rollout.http import EngineRouter
    from miles_core.rollout.protocol import GenerateRequest, SamplingParams
    from miles_core.weights.sync import WeightSender, WeightSync

    version = {"broadcast": 1, "disk": 2}[mode]
    with torch.no_grad():
        trainer_model.model.norm.weight.mul_(1.01)  # a trainer step since the last sync
    sender = WeightSender(lambda: trainer_model.state_dict().items(), trainer_model.config)
    assert sender.master_address()[0] == two_nodes["head_node"]
    sync = WeightSync(mode, BUCKET, disk_dir=tmp_path / "weight_sync")
    with EngineRouter.from_urls(engines.urls, {"api_key": engines.api_key}, bucket_bytes=BUCKET) as router:
        assert router.group_ranks(router.weight_targets()) == ([1, 3], 5)
        sync.sync(sender, router, version)
        sync.close()
        assert router.engine_versions() == {u: version for u in engines.urls}
        name = "model.norm.weight"
        assert all(torch.equal(s.client.get_weights_by_name(name), trainer_model.state_dict()[name]) for s in router.slots)
        sp = SamplingParams(max_new_tokens=5, stop_token_ids=(tiny_tokenizer.eos_token_id,))
        reqs = [GenerateRequest(tiny_tokenizer(f"{i}+{i}=")["input_ids"], sp) for i in range(4)]
        local = HFEngine(trainer_model, tiny_tokenizer, batching="exact")
        local.set_weight_version(version)
        key = lambda r: (r.output_ids, r.output_log_probs, r.weight_version)  # noqa: E731
        for slot in router.slots:  # each engine, not only the one the router picks
            assert [key(r) for r in slot.client.generate(reqs, seed=3)] == [key(r) for r in local.generate(reqs, seed=3)]
        if mode == "broadcast":
            events = [e for s in router.slots for e in s.client.server_info()["events"] if e.startswith("group:")]
            assert [e.rsplit(":", 1)[-1] for e in events] == ["1+2/5", "3+2/5"]


@dataclass
class Reported:
    """What EngineWorker needs of a server process: its url (here: the CUDA_VISIBLE_DEVICES it would see)."""

    url: str

    def stop(self) -> None:
        pass


def report_devices(spec) -> Reported:
    return Reported(spec.server_env().get("CUDA_VISIBLE_DEVICES", ""))


def test_two_colocated_engines_of_tp_2_each_see_two_gpus(two_nodes, tmp_path):
    """Finding 5 of issue 27 (each engine actor got one GPU, 0.5 colocated, while its server had --tp-size N): 4 train
    ranks and two engines of TP 2 on their bundles, on the head's 4 declared GPUs; Ray gives each bundle a GPU id and
    each engine's server the ids of its two bundles. The start function is a stand-in that reports that environment."""
    import ray

    cfg = build_config({"prompt_data": "x.jsonl", "rollout_batch_size": 4, "n_samples_per_prompt": 2, "runtime": "ray",
                        "colocate": True, "actor_num_gpus_per_node": 4, "rollout_num_gpus_per_engine": 2,
                        "run_dir": str(tmp_path)})
    plan = plan_placement(cfg.cluster, use_gpu=True)
    pg = create_placement_group(plan)
    try:
        group = EngineGroup(cfg, "unused", pg, plan, report_devices)
        seen = [set(u.split(",")) for u in group.urls]
        group.shutdown()
    finally:
        ray.util.remove_placement_group(pg)
    assert [len(s) for s in seen] == [2, 2] and not seen[0] & seen[1]  # two distinct GPUs each
    assert set().union(*seen) <= {str(i) for i in range(GPUS)}
