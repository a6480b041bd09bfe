"""Tracking arguments (REFERENCE §7)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ._base import Group


class TrackingConfig(Group):
    """MLflow, W&B, TensorBoard and Prometheus: where the run's params and metrics go."""

    form_first = ("mlflow_new_run", "mlflow_run_name")

    mlflow_tracking_uri: str | None = Field(None, description="MLflow tracking URI (default sqlite:///<run_dir>/mlflow.db).")
    mlflow_experiment_name: str = Field("miles", description="MLflow experiment.")
    mlflow_run_name: str | None = Field(None, description="MLflow run name (default the recipe name).")
    mlflow_ui_url: str | None = Field(
        None, description="Base URL of an MLflow UI serving this store (`mlflow ui --backend-store-uri ...`), for the run link in the "
                          "Prefect summary (default: the tracking URI when it is http(s); none for a SQLite store).")
    mlflow_new_run: bool = Field(False, description="On resume, log into a new MLflow run instead of re-attaching to the checkpoint's run (needed when params changed).")
    log_reward_category: str | None = Field(
        None, description="Key of a dict reward holding a category (why the reward function failed a response): "
                          "rollout/error_cat/<category> = the fraction of the rollout's samples in each category.")
    log_passrate: bool = Field(
        False, description="Log passrate/pass@k of each rollout (n_samples_per_prompt > 1) and eval/<ds>-pass@k of each eval "
                           "dataset (n_samples_per_eval_prompt > 1): the unbiased pass@k, reward == 1 passes, k = 1, 2, 4, ... "
                           "<= the group size; off, neither is logged (the reference's --log-passrate).")
    log_correct_samples: bool = Field(
        False, description="Log rollout/correct_* over the samples whose raw reward is 1: correct_response_lengths (their mean "
                           "response length), correct_length/p25, p50, p75, p100 (the share of them in each quarter of "
                           "rollout_max_response_len) and correct_entropy (the mean over them of each one's masked token mean of "
                           "-logp_old); none when no sample is correct (the reference's --log-correct-samples).")
    log_samples: int = Field(8, ge=0, description="Sample completions logged per rollout as a table.")
    log_multi_turn: bool = Field(
        False, description="custom_generate_function_path: the sample table shows whole conversations (turn markers, tool "
        "messages) with their round number, tool calls and tool failure.")
    log_samples_interval: int | None = Field(
        None, ge=1, description="Log the sample table after rollout i when (i+1) % interval == 0 or i is the last (default: eval_interval, else 1).")
    # ---- trackers beside MLflow (the primary): the same keys at the same step axes (docs/guide/trackers.md)
    use_wandb: bool = Field(False, description="Also log to Weights & Biases (same keys and step axes as MLflow; a resume continues the same W&B run).")
    wandb_project: str | None = Field(None, description="W&B project (default: mlflow_experiment_name).")
    wandb_group: str | None = Field(
        None, description="W&B run group, as the reference: <wandb_group>_<8 random characters> (kept on resume), the run "
                          "named <group>-RANK_0; none: no group, the run named after the MLflow run.")
    disable_wandb_random_suffix: bool = Field(
        False, description="With wandb_group: the W&B group is wandb_group exactly and the run is named wandb_group (no "
                           "random suffix), as the reference's flag.")
    wandb_team: str | None = Field(None, description="W&B entity (team or user); default: the account's default entity.")
    wandb_mode: Literal["online", "offline", "disabled"] | None = Field(
        None, description="W&B mode: online (sends to the W&B server), offline (files under wandb_dir only; `wandb sync` later), "
                          "disabled (no-op); default: WANDB_MODE, else online.")
    wandb_dir: str | None = Field(None, description="Directory for W&B's files (default: the run dir; W&B writes <dir>/wandb/).")
    wandb_host: str | None = Field(
        None, description="URL of the W&B server (a self-hosted one, https://wandb.example.com); default: W&B's own setting "
                          "(WANDB_BASE_URL, `wandb login --host`, else W&B's default server). The key comes from the environment only "
                          "(WANDB_API_KEY or `wandb login`), never from the config.")
    wandb_always_use_train_step: bool = Field(
        False, description="With use_wandb: W&B plots rollout/* and eval/* at train steps, as the reference's "
                           "compute_rollout_step: the rollout/step value of rollout i is i * num_steps_per_rollout, the eval "
                           "after rollout i (eval/step i + 2, its weight version) and the one before training (eval/step 1) "
                           "at i * num_steps_per_rollout and 0. MLflow, TensorBoard and Prometheus keep the rollout id and "
                           "the weight version; needs one weight sync per rollout.")
    wandb_run_id: str | None = Field(
        None, description="W&B run id to log into (default: a new id, recorded in <run_dir>/wandb_run.json and reused on resume).")
    use_tensorboard: bool = Field(False, description="Also write TensorBoard event files (tensorboardX), one subdirectory per MLflow run.")
    tensorboard_dir: str | None = Field(None, description="TensorBoard log dir (default: <run_dir>/tensorboard).")
    tb_project_name: str | None = Field(
        None, description="TensorBoard project: the event files go under <tensorboard_dir>/<tb_project_name>/ (default: straight "
                          "under tensorboard_dir).")
    tb_experiment_name: str | None = Field(
        None, description="TensorBoard experiment: the event files' subdirectory (default: the MLflow run id, one per run); a "
                          "resume into the same name continues above the steps its event files hold.")
    use_prometheus: bool = Field(False, description="Serve the latest value of every logged metric as Prometheus gauges on http://<prometheus_host>:<prometheus_port>/metrics while the run lives.")
    prometheus_port: int = Field(9090, ge=0, le=65535, description="Port of the Prometheus /metrics endpoint (0: a free port, written to the run's MLflow tag miles.prometheus_url).")
    prometheus_run_name: str | None = Field(
        None, description="The run_name label of every Prometheus gauge (default: the MLflow run name).")
    prometheus_host: str = Field("127.0.0.1", description="Address the /metrics endpoint binds to (0.0.0.0 to expose it beyond this machine).")
    # ---- the run's telemetry dashboard (docs/guide/trackers.md#dashboard; miles_core/tracking/dashboard/)
    use_miles_dashboard: bool = Field(
        False, description="Collect the run's telemetry under <run_dir>/dashboard/ (append-only JSONL): every row the trackers "
                           "log, GPU samples (host CPU and memory on a CPU run), the HTTP engines' SGLang /metrics; logged to "
                           "MLflow under dashboard/ at the end; `miles dashboard <run_dir>` serves it as JSON on 127.0.0.1.")
    dashboard_flush_interval: float = Field(5.0, gt=0, allow_inf_nan=False, description="Seconds between the dashboard's flushes to its JSONL files.")
    dashboard_gpu_sample_interval: float = Field(
        1.0, gt=0, allow_inf_nan=False, description="Seconds between two samples of every GPU (NVML: utilization, memory, power; "
                                                    "without NVML, torch.cuda's device memory) or, with no GPU, of the host (CPU %, memory).")
    dashboard_sglang_scrape_interval: float = Field(2.0, gt=0, allow_inf_nan=False, description="Seconds between two scrapes of every HTTP engine's /metrics.")
    dashboard_sglang_scrape_mode: Literal["auto", "router", "direct"] = Field(
        "auto", description="How the engines' metrics are fetched: direct (each engine's /metrics), router (an SGLang router's "
                            "/engine_metrics: not supported yet, miles' router is in-process) or auto (direct here).")
    dashboard_sglang_metrics: str | None = Field(
        None, description="Comma-separated SGLang metric names the scraper keeps (the : after sglang may be written _); default: "
                          "num_running_reqs, num_queue_reqs, gen_throughput, token_usage, cache_hit_rate and the PD queue ones.")
    dashboard_forward_prometheus: bool = Field(
        False, description="Also set the dashboard's latest GPU / host / engine values as gauges on the use_prometheus endpoint "
                           "(miles_dashboard_*), for an external Grafana.")

    @property
    def dashboard_metric_names(self) -> tuple[str, ...] | None:
        """dashboard_sglang_metrics as names (sglang:x written sglang_x, as the scraper compares them); None: the default list."""
        if self.dashboard_sglang_metrics is None:
            return None
        return tuple(n.strip().replace(":", "_") for n in self.dashboard_sglang_metrics.split(",") if n.strip())
