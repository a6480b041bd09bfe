"""env_report: the environment a run ran in, as the reference's launcher report (miles/utils/env_report.py
collect_and_print_node_env_report, decode_env_report; miles/utils/tracking_utils/wandb_utils.py:98-100).

The value is the launcher's report (JSON, or base64 of JSON; the default is $MILES_SCRIPT_ENV_REPORT). When it is
set, the driver collects its node report:

    role, rank             "driver", 0 (the reference collects one per train actor and per engine)
    launcher_env_report    the decoded launcher report
    editable_packages      {name, version, location} of each package installed editable
    git_repos              {package_name, location, commit, dirty, diff_stat} of each editable package in a git work tree
    full_pip_list          [{name, version}] of every installed distribution

It is printed as one ``ENV_REPORT_JSON=<json>`` line, as the reference's, logged to MLflow as the artifact
``env_report/driver_0.json`` with params ``launcher_env_report.*`` (the launcher's report, flattened) and
``env_report.git.<package>.commit`` / ``.dirty``, and the launcher's report goes into the W&B config as
``launcher_env_report`` (the reference's key). The reference reads the installed packages with ``pip inspect``; ours
reads the same facts (name, version, PEP 610 direct_url.json) with importlib.metadata, in process.
"""

from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

log = logging.getLogger(__name__)
PREFIX = "ENV_REPORT_JSON="


@dataclass(frozen=True, kw_only=True)
class GitRepo:
    package_name: str
    location: str
    commit: str
    dirty: bool
    diff_stat: str


@dataclass(frozen=True, kw_only=True)
class NodeEnvReport:
    role: str
    rank: int
    launcher_env_report: dict | None
    editable_packages: list[dict] = field(default_factory=list)  # {name, version, location}
    git_repos: list[GitRepo] = field(default_factory=list)
    full_pip_list: list[dict] = field(default_factory=list)  # {name, version}

    def to_dict(self) -> dict:
        return asdict(self)


def _editable_location(dist: metadata.Distribution) -> str | None:
    raw = dist.read_text("direct_url.json")
    if not raw:
        return None
    info = json.loads(raw)
    if not info.get("dir_info", {}).get("editable"):
        return None
    return str(info.get("url", "")).removeprefix("file://") or None


def _git(location: str, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=location, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        log.warning("env_report: git %s in %s failed: %s", " ".join(args), location, e)
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_repo(package_name: str, location: str) -> GitRepo | None:
    """The git state of an editable package's dir (None when it is not in a git work tree)."""
    if not Path(location).is_dir():
        return None
    commit = _git(location, "rev-parse", "HEAD")
    if commit is None:
        return None
    diff_stat = _git(location, "diff", "--stat", "HEAD") or ""
    return GitRepo(package_name=package_name, location=location, commit=commit, dirty=bool(diff_stat), diff_stat=diff_stat)


def collect(launcher: dict | None, role: str = "driver", rank: int = 0) -> NodeEnvReport | None:
    """This process's node report beside ``launcher`` (env_report decoded: MiscConfig.launcher_env_report), None when
    there is none (env_report empty: the reference collects nothing then)."""
    if launcher is None:
        return None
    pip, editable = [], []
    for dist in sorted(metadata.distributions(), key=lambda d: (d.metadata["Name"] or "").lower()):
        name, version = dist.metadata["Name"] or "", dist.version or ""
        pip.append({"name": name, "version": version})
        location = _editable_location(dist)
        if location is not None:
            editable.append({"name": name, "version": version, "location": location})
    repos = [r for p in editable if (r := git_repo(p["name"], p["location"])) is not None]
    return NodeEnvReport(role=role, rank=rank, launcher_env_report=launcher, editable_packages=editable, git_repos=repos,
                         full_pip_list=pip)


def report_line(report: NodeEnvReport) -> str:
    return PREFIX + json.dumps(report.to_dict(), separators=(",", ":"), sort_keys=True, default=str)


def mlflow_params(report: NodeEnvReport) -> dict[str, object]:
    """The params a run logs: the launcher's report under launcher_env_report, the git state under env_report.git."""
    git = {r.package_name: {"commit": r.commit, "dirty": r.dirty} for r in report.git_repos}
    return {"launcher_env_report": report.launcher_env_report or {}, "env_report": {"git": git}}


def log_report(tracker, report: NodeEnvReport) -> None:
    """Print the ENV_REPORT_JSON line, log the params and the artifact env_report/<role>_<rank>.json to MLflow."""
    print(report_line(report), flush=True)
    tracker.log_params(mlflow_params(report))
    tracker.log_dict(report.to_dict(), f"env_report/{report.role}_{report.rank}.json")
