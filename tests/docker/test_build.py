"""docker/build.py: every variant's full `docker build` command (--dry-run, no docker needed), checked against
its Dockerfile's ARGs, the pinned SGLang and the version matrix of docs/docker.md."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from miles_core.rollout.sglang import SGLANG_VERSION

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "docker" / "build.py"
spec = importlib.util.spec_from_file_location("docker_build", BUILD)
build = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = build  # dataclasses look their module up while the file executes
spec.loader.exec_module(build)
VARIANTS = ["cpu", "cu13", "rocm700-mi30x", "rocm700-mi35x", "rocm720-mi35x"]  # no cu12: docker/published_tags.txt
PASSED_FROM_ENV = set(build.PROXY_ARGS)


def _dry_run(*args: str, env: dict[str, str] | None = None, steps: bool = False) -> list[str]:
    """The commands --dry-run prints (steps=True: the image's install steps it prints as comments after them)."""
    out = subprocess.run([sys.executable, str(BUILD), *args, "--dry-run"], capture_output=True, text=True, check=True,
                         cwd=ROOT, env=env or {"PATH": "/usr/bin:/bin"})
    prefix = "#   in the image: "
    lines = out.stdout.splitlines()
    return [line.removeprefix(prefix) for line in lines if line.startswith(prefix)] if steps else \
        [line for line in lines if not line.startswith("#")]


def _args(dockerfile: Path) -> dict[str, str | None]:
    """ARG NAME[=default] of a Dockerfile."""
    return {m[0]: (m[2] if m[1] else None) for m in re.findall(r"^ARG (\w+)(=(\S*))?", dockerfile.read_text(), re.M)}


def test_the_variants_are_the_five_of_the_product():
    assert list(build.VARIANTS) == VARIANTS
    assert build.SGLANG_VERSION == SGLANG_VERSION


@pytest.mark.parametrize("variant", VARIANTS)
def test_dry_run_prints_the_full_build_command(variant):
    [line] = _dry_run("--variant", variant)
    cmd = shlex.split(line)
    v = build.VARIANTS[variant]
    assert cmd[:3] == ["docker", "build", "-f"] and cmd[3] == v.dockerfile and cmd[-3:] == ["-t", f"miles:{variant}", "."]
    given = dict(cmd[i + 1].split("=", 1) for i, a in enumerate(cmd) if a == "--build-arg")
    assert given["BASE_IMAGE"] == v.base_image and given == v.args()
    declared = _args(ROOT / v.dockerfile)
    assert set(given) <= set(declared), f"build args the Dockerfile does not declare: {set(given) - set(declared)}"
    unset = {a for a, default in declared.items() if default is None} - set(given) - PASSED_FROM_ENV
    assert not unset, f"{v.dockerfile} ARGs without a default that build.py does not set: {unset}"
    assert re.search(r"^FROM \$\{BASE_IMAGE\}$", (ROOT / v.dockerfile).read_text(), re.M)
    if variant != "cpu":
        assert given["SGLANG_VERSION"] == SGLANG_VERSION and v.python == "3.12"


def test_proxies_and_pip_indexes_are_passed_on():
    [line] = _dry_run("--variant", "cu13", "--tag", "reg.example/miles:x",
                      env={"PATH": "/usr/bin:/bin", "HTTPS_PROXY": "http://proxy:3128", "PIP_INDEX_URL": "http://mirror/simple"})
    assert "--build-arg HTTPS_PROXY=http://proxy:3128 --build-arg PIP_INDEX_URL=http://mirror/simple -t reg.example/miles:x ." in line


def test_all_and_push():
    assert [shlex.split(line)[-2] for line in _dry_run("--all")] == [f"miles:{v}" for v in VARIANTS]
    lines = _dry_run("--variant", "cpu", "--push")
    assert lines[1] == "docker push miles:cpu"


def test_gpu_images_install_miles_pins_but_not_what_sglang_brings():
    reqs = subprocess.run([sys.executable, str(BUILD), "--print-requirements"], capture_output=True, text=True, check=True).stdout.split()
    names = {r.split("==")[0] for r in reqs}
    assert {"prefect", "mlflow", "ray", "pydantic"} <= names and not names & set(build.BASE_PROVIDED)


def test_every_base_image_named_is_a_published_tag():
    """docker/published_tags.txt: the tags SGLang's release workflows publish for this SGLang (sources in the file)."""
    published = {line.strip() for line in (ROOT / "docker" / "published_tags.txt").read_text().splitlines()
                 if line.strip() and not line.startswith("#")}
    named = {v.base_image for v in build.VARIANTS.values()}
    assert named <= published, named - published
    assert all(f"v{SGLANG_VERSION}" in tag for tag in published if tag.startswith("lmsysorg/"))


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v != "cpu"])
def test_megatron_core_0_19_stays_installed(variant):
    """The image installs and import-checks megatron-core 0.19.x; miles' requirements then ask for the same pin under
    a constraint, so the project's pyproject pin (0.16.1, the CPU lock's) cannot replace it."""
    steps = _dry_run("--variant", variant, steps=True)
    first = next(i for i, s in enumerate(steps) if "megatron-core" in s)
    assert re.search(r'pip install "megatron-core==0\.19\.\d+"', steps[first]), steps[first]
    later = " ".join(steps[first + 1 :])
    assert set(re.findall(r"megatron-core==([\d.]+)", later)) == {build.MEGATRON_CORE_VERSION}
    assert f"constraints: megatron-core=={build.MEGATRON_CORE_VERSION}" in later
    assert steps[-1].startswith("pip install --no-deps")  # the project itself brings no dependency
    script = (ROOT / "docker" / "install_miles.sh").read_text()
    assert "--print-constraints" in script and re.search(r"pip install -r \S+ -c \S+", script)


def test_docs_matrix_lists_every_variant():
    page = (ROOT / "docs" / "reference" / "docker.md").read_text()
    for name, v in build.VARIANTS.items():
        row = next((line for line in page.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"docs/reference/docker.md has no matrix row for {name}"
        assert v.base_image in row and v.dockerfile in row and f"Python {v.python}" in row, row
        for value in v.build_args.values():
            if value not in (SGLANG_VERSION,):
                assert value in row or value in page, (name, value)


def test_a_retired_variant_says_why_and_what_to_build():
    """cu12 (the variant the issue named) has no base image for this SGLang: asked for, it is refused with the reason
    and the variant to build instead, not argparse's bare 'invalid choice'."""
    out = subprocess.run([sys.executable, str(BUILD), "--variant", "cu12", "--dry-run"], capture_output=True, text=True,
                         cwd=ROOT, env={"PATH": "/usr/bin:/bin"})
    said = " ".join(out.stderr.split())
    assert out.returncode == 2 and not out.stdout
    assert f"no CUDA 12 image for v{SGLANG_VERSION}" in said and "build cu13" in said and "invalid choice" not in said
    assert set(build.RETIRED).isdisjoint(build.VARIANTS)
    assert not any(f"{name}-" in tag or tag.endswith(f"-{name}") for name in build.RETIRED
                   for tag in (v.base_image for v in build.VARIANTS.values()))
