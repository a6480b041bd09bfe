"""Prefect tasks: one file per stage, thin wrappers over miles_core. Inputs are hashable
(run key, rollout id, config); live objects are looked up in the runtime registry."""
