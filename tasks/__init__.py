"""Prefect tasks: one file per stage, thin wrappers over miles_core. Inputs are hashable
(run key, rollout id, config); live objects are looked up in the runtime registry."""

# Every task has a timeout: a hung engine, reward service or disk fails the task (then its retries, then the
# flow) instead of hanging the run forever. Generous on purpose: a large model's rollout or eval takes minutes.
MINUTE = 60
HOUR = 60 * MINUTE
