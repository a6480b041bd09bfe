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
