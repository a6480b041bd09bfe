"""Config of the trackers and the promotion gate: reference flag names, checked choices, the gate's needs."""

from __future__ import annotations

import pytest

from miles_core.config import ConfigError
from flows.recipes import load_config


def test_tracker_fields_keep_the_reference_names_and_defaults():
    t = load_config("tiny", {"use_wandb": True, "wandb_mode": "offline", "wandb_team": "lab", "use_prometheus": True}).tracking
    assert (t.use_wandb, t.wandb_mode, t.wandb_team, t.wandb_project, t.wandb_run_id) == (True, "offline", "lab", None, None)
    assert (t.use_tensorboard, t.prometheus_port, t.prometheus_host) == (False, 9090, "127.0.0.1")


def test_an_unknown_wandb_mode_names_the_choices():
    with pytest.raises(ConfigError, match="wandb_mode"):
        load_config("tiny", {"wandb_mode": "cloud"})


def test_a_manual_promotion_gate_needs_exports_a_model_and_a_metric():
    with pytest.raises(ConfigError, match="promotion_gate manual .* needs export_interval, registered_model_name and champion_metric"):
        load_config("tiny", {"promotion_gate": "manual", "registered_model_name": "m"})
    cfg = load_config("tiny", {"promotion_gate": "manual", "registered_model_name": "m", "champion_metric": "eval/arith",
                               "export_interval": 5})
    assert cfg.checkpoint.promotion_gate == "manual" and cfg.checkpoint.promotion_timeout == 3600
