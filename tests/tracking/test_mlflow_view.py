"""Which view MLflow's UI opens an experiment in, read from the installed MLflow's own UI bundle (3.17):
the page's ``workflowType`` query parameter decides, not the experiment's ``mlflow.experimentKind`` tag; miles'
links carry the model-training value (flows/links.py)."""

from __future__ import annotations

import re
from pathlib import Path

import mlflow
import pytest

from flows.links import EXPERIMENT_KIND, ML_VIEW

BUNDLE = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"


@pytest.fixture(scope="module")
def main_js() -> str:
    (path,) = BUNDLE.glob("main.*.js")
    return path.read_text(errors="replace")


def test_the_ui_reads_the_view_from_the_workflow_type_parameter(main_js):
    # the workflow switch: GENAI="genai", MACHINE_LEARNING="machine_learning"; the page's parameter wins over the saved
    # choice (localStorage mlflow.workflowType), whose initial value is GENAI
    assert 'e.GENAI="genai",e.MACHINE_LEARNING="machine_learning"' in main_js
    assert re.search(r'key:"mlflow\.workflowType",version:1,initialValue:\w\}', main_js)
    assert re.search(r'const n=e\.get\("workflowType"\);return n===\w\.GENAI\|\|n===\w\.MACHINE_LEARNING\?n:t', main_js)
    # the experiment's kind is the switch's when the switch is enabled, the tag's only otherwise ...
    kind = re.search(r'n=\(0,s\.(\w+)\)\(\);return\(0,r\.useMemo\)\(\(\)=>n\?m\(t\):\(e=>\{var t;return null===e\|\|void 0===e\|\|'
                     r'null===\(t=e\.find\(e=>"mlflow\.experimentKind"===e\.key\)\)', main_js)
    assert kind, "MLflow's UI no longer chooses the experiment kind as in 3.17: re-read it and update flows/links.py"
    # ... and the switch is enabled: the feature flag is a constant true in this build
    assert re.search(rf'{kind.group(1)}:\(\)=>(\w+)\b', main_js)
    flag = re.search(rf'{kind.group(1)}:\(\)=>(\w+)\b', main_js).group(1)
    assert re.search(rf'[,{{]{flag}=\(\)=>!0[,;]', main_js), "the workflow switch is no longer always on"
    # model training maps to the experiment kind whose default tab is the runs table
    assert 'm=e=>e===a.g$.GENAI?o.Gk.GENAI_DEVELOPMENT:o.Gk.CUSTOM_MODEL_DEVELOPMENT' in main_js


def test_the_experiment_kind_tag_is_a_kind_the_ui_knows(main_js):
    assert EXPERIMENT_KIND[0] == "mlflow.experimentKind"
    assert f'CUSTOM_MODEL_DEVELOPMENT="{EXPERIMENT_KIND[1]}"' in main_js


def test_default_tab_is_runs_unless_genai():
    (chunk,) = [p for p in BUNDLE.glob("*.chunk.js") if "getExperimentPageTabRoute" in (t := p.read_text(errors="replace"))
                and "GENAI_DEVELOPMENT&&(l=" in t]
    text = chunk.read_text(errors="replace")
    assert re.search(r'let l=\w\.fM\.Runs;\w===\w\.Gk\.GENAI_DEVELOPMENT&&\(l=', text)


def test_miles_links_open_the_model_training_view():
    from flows.links import mlflow_run_url
    from flows.recipes import load_config

    cfg = load_config("tiny", {"mlflow_ui_url": "http://127.0.0.1:5000/"})
    url = mlflow_run_url(cfg, "3", "abc")
    assert url == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    assert url.endswith(ML_VIEW)
