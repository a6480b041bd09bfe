"""/weights_checker (SGLang's route; rollout/weight_checker.py) on our engine server over real HTTP: snapshot, scramble,
push the weights back, compare; a tensor the update missed fails naming it unless it is on the skip list."""

from __future__ import annotations

import pytest
from transformers import AutoModelForCausalLM

from miles_core.rollout.http import EngineHTTPError
from miles_core.rollout.http.router import EngineRouter


def _push(client, named) -> None:
    client.begin_weight_update()
    client.update_weights_from_tensor(named)
    client.end_weight_update()


def test_a_tensor_the_update_missed_fails_the_compare(start_server, make_client, model_dir):
    client = make_client(start_server().url)
    loaded = dict(AutoModelForCausalLM.from_pretrained(model_dir).named_parameters())
    missed = "model.layers.1.mlp.up_proj.weight"
    for skip in (None, ["layers.1.mlp"]):
        client.check_weights("snapshot")
        client.check_weights("reset_tensors")
        _push(client, [(n, p.detach()) for n, p in loaded.items() if n != missed])
        if skip is None:
            with pytest.raises(EngineHTTPError, match=f"HTTP 400: .*1 of {len(loaded)} parameters differ .*{missed}"):
                client.check_weights("compare")
        else:
            assert "1 skipped" in client.check_weights("compare", skip_list=skip)
        _push(client, [(missed, loaded[missed].detach())])
    assert f"{len(loaded)} of {len(loaded)} parameters equal" in client.check_weights("compare")
    with pytest.raises(EngineHTTPError, match="no draft model"):
        client.check_weights("compare", selector="draft")


def test_the_router_fails_when_one_engine_differs(start_server, make_client, model_dir):
    a, b = make_client(start_server().url), make_client(start_server().url)
    with EngineRouter([a, b]) as router:
        router.check_weights("snapshot")
        router.check_weights("compare")  # nothing changed
        b.check_weights("reset_tensors")
        with pytest.raises(Exception, match="parameters differ from the snapshot"):
            router.check_weights("compare")


def test_checksums_over_http_are_the_trainers_digests_and_a_differing_engine_is_named(start_server, make_client, model_dir):
    """/weights_checker checksum (save_local_weight_checksum): each engine's sha256 per tensor of the state dict it holds,
    SGLang's ChecksumInfo per rank; the trainer's digests of the same weights (weights/disk.py) are equal; an engine
    given one other tensor differs there, and the event analyzer's rule names it."""
    from miles_core.runtime.event_analyzer import engines_agree, trainer_vs_engines
    from miles_core.runtime.events import MAIN, TRAINER, InferenceEngineWeightChecksumEvent as Held
    from miles_core.runtime.events import TrainEngineLocalWeightChecksumEvent as Sent
    from miles_core.weights.disk import adapter_checksums
    from miles_core.weights.sync import WeightSender

    a, b = make_client(start_server().url), make_client(start_server().url)
    trainer = dict(AutoModelForCausalLM.from_pretrained(model_dir).state_dict())
    want = WeightSender(lambda: trainer.items()).checksums()  # the trainer's side of a sync (train rank 0)
    assert want == adapter_checksums(trainer.items())
    raw = a.request("POST", "/weights_checker", json={"action": "checksum"}).json()
    assert raw["ranks"][0]["checksums"] == want and raw["ranks"][0]["parallelism_info"]["tp_size"] == 1
    name = "model.layers.0.self_attn.o_proj.weight"
    _push(b, [(name, trainer[name] * 2)])
    with EngineRouter([a, b]) as router:
        held = router.weight_checksums()
    assert held[0] == want and {n for n in want if held[1][n] != want[n]} == {name}
    stamp = {"timestamp": "2026-01-01T00:00:00Z", "rollout_id": None, "weight_version": 1}
    events = [Sent(source=TRAINER, param_hashes=want, **stamp), Held(source=MAIN, engine_checksums=held, **stamp)]
    assert [(i.key, i.label_b) for i in trainer_vs_engines(events)] == [(name, "engine 1 holds")]
    assert [(i.key, i.label_b) for i in engines_agree(events)] == [(name, "engine 1 holds")]
