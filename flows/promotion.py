"""Register an export of the train flow, and judge versions whose eval lands later, behind the promotion gate.

promotion_gate auto: the champion alias moves as soon as a version's champion_metric, at the eval/step of
its own weights, beats the champion's (miles_core/tracking/registry.py). promotion_gate manual: when it
would move, the flow run pauses (Prefect ``pause_flow_run`` with an approve/reject form that shows the eval
table); approved, the alias moves; rejected, or no answer within promotion_timeout seconds, it stays and the
run goes on. A version whose eval had not run when it was registered is gated when that eval lands (a later
eval point of the train flow, or the eval flow). Approve or reject from the flow run's page in the Prefect
UI ("Resume"), or through the API: ``prefect.flow_runs.resume_flow_run(flow_run_id, run_input={"approve": True})``.
"""

from __future__ import annotations

from pydantic import Field
from prefect.exceptions import FlowPauseTimeout
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput

from miles_core.config import TrainConfig
from miles_core.evaluation import PointResult
from miles_core.tracking.registry import crown_pending, set_champion
from miles_core.tracking.report import read_run
from miles_core.tracking.runlog import log
from tasks.export import register
from tasks.timeouts import timed

POLL_S = 2  # how often the paused flow asks the API whether it was resumed


class Promotion(RunInput):
    approve: bool = Field(False, description="Move the champion alias to this model version.")


def register_export(config: TrainConfig, run_id: str, export_path: str, rollout_id: int, eval_step: int | None) -> dict:
    """-> register's result ({version, artifact_uri, champion, candidate}), champion after the gate. ``eval_step``:
    the eval/step of the exported weights (the champion is judged there)."""
    c = config.checkpoint
    manual = c.promotion_gate == "manual"
    step = (rollout_id + 1) * config.num_steps_per_rollout
    result = timed(register, config)(config.tracking_uri, run_id, export_path, rollout_id, step, c.registered_model_name, c.champion_metric,
                      eval_step, crown=not manual)
    if manual and result["candidate"]:
        result["champion"] = _gate(config, config.tracking_uri, run_id, result["version"])
    return result


def judge_pending(config: TrainConfig, run_id: str, tracking_uri: str, result: PointResult) -> list[str]:
    """An eval landed: registered versions that waited for it are judged for the champion alias now (behind the
    gate). -> the versions crowned."""
    ck = config.checkpoint
    value = result.metrics.get(ck.champion_metric) if ck.champion_metric else None
    if not ck.registered_model_name or value is None or result.skipped:
        return []
    manual = ck.promotion_gate == "manual"
    beat = crown_pending(tracking_uri, run_id, ck.registered_model_name, ck.champion_metric, result.step, value, crown=not manual)
    return [v for v in beat if _gate(config, tracking_uri, run_id, v)] if manual else beat


def _gate(config: TrainConfig, tracking_uri: str, run_id: str, version: str) -> bool:
    c = config.checkpoint
    form = Promotion.with_initial_data(description=_question(config, tracking_uri, run_id, version), approve=False)
    log.info("promotion gate: %s version %s beats the champion on %s; waiting up to %d s for approve/reject",
             c.registered_model_name, version, c.champion_metric, c.promotion_timeout)
    try:
        answer = pause_flow_run(wait_for_input=form, timeout=c.promotion_timeout, poll_interval=POLL_S,
                                key=f"promote-{c.registered_model_name}-v{version}")
    except FlowPauseTimeout:  # nobody answered: the flow run goes on, the alias stays
        _running_again()
        log.warning("promotion gate: no answer within promotion_timeout (%d s); the champion alias stays", c.promotion_timeout)
        return False
    if not answer.approve:
        log.info("promotion gate: %s version %s rejected; the champion alias stays", c.registered_model_name, version)
        return False
    set_champion(tracking_uri, c.registered_model_name, version)
    log.info("promotion gate: %s version %s approved; champion alias moved", c.registered_model_name, version)
    return True


def _question(config: TrainConfig, tracking_uri: str, run_id: str, version: str) -> str:
    c = config.checkpoint
    facts = read_run(tracking_uri, run_id)
    ds = facts.datasets
    rows = [f"| {r['eval/step']} | " + " | ".join(f"{r[d]:.4g}" if d in r else "" for d in ds) + " |" for r in facts.eval_table()]
    return "\n".join([f"**Promote {c.registered_model_name} version {version}** to `champion`? Its {c.champion_metric} "
                      f"beats the current champion's ({facts.champion or 'none yet'}).", "",
                      "| eval/step | " + " | ".join(ds) + " |", "|---" * (len(ds) + 1) + "|", *rows])


def _running_again() -> None:
    """After a pause timed out, the flow run is set Running again so its next tasks run."""
    from prefect import get_client
    from prefect.context import get_run_context
    from prefect.states import Running

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(get_run_context().flow_run.id, Running(), force=True)
