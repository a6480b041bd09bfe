"""The engine names the server modules use, and the HF weight files reader (rollout/hf_files.py) they re-export.

The engine itself is ``miles_core.rollout.hf_engine.HFEngine`` (per-request seeds, the "exact" /
"dynamic" batching policy, abort polling and the progress heartbeat all live there); the server
builds one with ``HFEngine.from_pretrained``. ``request_seed``, ``BATCHING`` and ``HFEngine`` are
re-exported here for the server modules.
"""

from __future__ import annotations

from miles_core.rollout.hf_engine import BATCHING, Batching, HFEngine, request_seed
from miles_core.rollout.hf_files import ShardOutsideModelDir, hf_weight_files, iter_hf_weights

__all__ = ["BATCHING", "Batching", "HFEngine", "ShardOutsideModelDir", "hf_weight_files", "iter_hf_weights",
           "request_seed"]
