#!/usr/bin/env python3
"""Build the miles images: one variant = one Dockerfile, one base image, its build arguments.

    python docker/build.py --variant cu13                 # docker build ... -t miles:cu13 .
    python docker/build.py --variant rocm700-mi30x --dry-run
    python docker/build.py --all --dry-run                # every variant's command
    python docker/build.py --variant cu13 --tag registry.example/miles:cu13 --push
    python docker/build.py --print-requirements           # what the GPU images pip-install for miles
    python docker/build.py --print-constraints            # what that install may not replace (megatron-core, TE)
    python docker/build.py --print-matrix                 # the version matrix (docs/reference/docker.md)

The version matrix (which SGLang, CUDA / ROCm, GPU arch, Python, Megatron-core, Transformer Engine) is
VARIANTS below; docs/reference/docker.md is generated from it (``matrix_markdown``). Every base image named
is one SGLang publishes (docker/published_tags.txt, from SGLang's release workflows; a test checks it). The
dry run prints each variant's docker build command, then the image's install steps (``install_steps``)
as comments.
Standard library only: it runs before any environment exists. The context is the repository root.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SGLANG_VERSION = "0.5.23"  # miles_core/rollout/sglang/__init__.py pins the same (tested)
MEGATRON_CORE_VERSION = "0.19.2"
TRANSFORMER_ENGINE_VERSION = "2.20.2"  # CUDA: PyPI wheels; ROCm: built from ROCm's fork (TE_ROCM_BRANCH)
TE_ROCM_BRANCH = "v2.8_rocm"
# What the SGLang base images provide (at SGLang's own pins): the GPU images do not reinstall them.
BASE_PROVIDED = ("torch", "transformers", "tokenizers", "safetensors", "huggingface-hub")
PROXY_ARGS = ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")


@dataclass(frozen=True)
class Variant:
    """One image. ``accelerator``: the platform line of docs/docker.md's matrix."""

    dockerfile: str
    base_image: str
    accelerator: str
    python: str
    platform: str = "linux/amd64"
    build_args: dict[str, str] = field(default_factory=dict)

    def args(self) -> dict[str, str]:
        return {"BASE_IMAGE": self.base_image, **self.build_args}


def _cuda(tag: str, cuda_major: str, accelerator: str) -> Variant:
    return Variant(dockerfile="docker/Dockerfile", base_image=f"lmsysorg/sglang:{tag}", accelerator=accelerator, python="3.12",
                   build_args={"CUDA_MAJOR": cuda_major, "SGLANG_VERSION": SGLANG_VERSION,
                               "MEGATRON_CORE_VERSION": MEGATRON_CORE_VERSION,
                               "TRANSFORMER_ENGINE_VERSION": TRANSFORMER_ENGINE_VERSION})


def _rocm(tag: str, gpu_arch: str, accelerator: str) -> Variant:
    return Variant(dockerfile="docker/Dockerfile.rocm", base_image=f"lmsysorg/sglang:{tag}", accelerator=accelerator, python="3.12",
                   build_args={"GPU_ARCH": gpu_arch, "SGLANG_VERSION": SGLANG_VERSION,
                               "MEGATRON_CORE_VERSION": MEGATRON_CORE_VERSION, "TE_ROCM_BRANCH": TE_ROCM_BRANCH})


VARIANTS: dict[str, Variant] = {
    "cpu": Variant(dockerfile="docker/Dockerfile.cpu", base_image="python:3.11-slim-bookworm", accelerator="CPU only",
                   python="3.11", build_args={}),
    "cu13": _cuda(f"v{SGLANG_VERSION}", "13", "NVIDIA, CUDA 13.0 (Blackwell, Hopper)"),
    "rocm700-mi30x": _rocm(f"v{SGLANG_VERSION}-rocm700-mi30x", "gfx942", "AMD, ROCm 7.0, MI300X / MI325X"),
    "rocm700-mi35x": _rocm(f"v{SGLANG_VERSION}-rocm700-mi35x", "gfx950", "AMD, ROCm 7.0, MI350X / MI355X"),
    "rocm720-mi35x": _rocm(f"v{SGLANG_VERSION}-rocm720-mi35x", "gfx950", "AMD, ROCm 7.2, MI350X / MI355X"),
}

# variants there is no base image for: asked for by name, each says why and what to build instead
RETIRED: dict[str, str] = {
    "cu12": f"SGLang publishes no CUDA 12 image for v{SGLANG_VERSION} (its CUDA 12 lane ended with v0.5.19, "
            "sgl-project/sglang PR #38404; docker/published_tags.txt): build cu13, the CUDA 13 image",
}


def _variant(name: str) -> str:
    """--variant's type: a retired variant is refused with its reason (argparse's choices name the others)."""
    if name in RETIRED:
        raise argparse.ArgumentTypeError(f"{name!r}: {RETIRED[name]}")
    return name


def build_command(name: str, tag: str | None = None, env: dict[str, str] | None = None) -> list[str]:
    """-> the full ``docker build`` argv of a variant. Proxy and pip index variables set in ``env``
    (default: this process's environment) are passed on as build arguments."""
    v = VARIANTS[name]
    env = os.environ if env is None else env
    cmd = ["docker", "build", "-f", v.dockerfile, "--platform", v.platform]
    for key, value in v.args().items():
        cmd += ["--build-arg", f"{key}={value}"]
    for key in PROXY_ARGS:
        if env.get(key):
            cmd += ["--build-arg", f"{key}={env[key]}"]
    return [*cmd, "-t", tag or f"miles:{name}", "."]


def push_command(tag: str) -> list[str]:
    return ["docker", "push", tag]


def _name(requirement: str) -> str:
    return requirement.split("==")[0].split(";")[0].strip().lower()


def image_constraints() -> list[str]:
    """What the GPU images install before miles' dependencies and keep: pip constraints for that install, so a
    dependency's pin (pyproject's megatron-core==0.16.1, the CPU lock's) cannot replace them."""
    return [f"megatron-core=={MEGATRON_CORE_VERSION}"]


def image_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """miles' dependencies less the ones the SGLang base image brings (BASE_PROVIDED), with the image's own pin for
    what the image installs itself (image_constraints: megatron-core)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    own = {_name(c): c for c in image_constraints()}
    return [own.get(_name(d), d) for d in deps if _name(d) not in BASE_PROVIDED]


def install_steps(name: str) -> list[str]:
    """The pip installs a variant's image runs, in order, with its build arguments filled in: the Dockerfile's own
    ``pip install`` lines, then docker/install_miles.sh's (miles' requirements under the constraints; the project)."""
    v = VARIANTS[name]
    text = (ROOT / v.dockerfile).read_text().replace("\\\n", " ")
    steps = []
    for cmd in re.findall(r"pip install [^&|\n)]*", text):
        for key, value in v.args().items():
            cmd = cmd.replace("${" + key + "}", value)
        steps.append(" ".join(cmd.split()))
    if "install_miles.sh deps" in text:
        steps.append("pip install -r <miles requirements> -c <constraints>: " + " ".join(image_requirements())
                     + " | constraints: " + " ".join(image_constraints()))
    if "install_miles.sh project" in text:
        steps.append("pip install --no-deps --ignore-requires-python -e .")
    return steps


MATRIX_COLUMNS = ("variant", "Dockerfile", "base image", "accelerator", "Python", "SGLang", "megatron-core", "Transformer Engine")


def _te(v: Variant) -> str:
    if "TRANSFORMER_ENGINE_VERSION" in v.build_args:
        major = v.build_args["CUDA_MAJOR"]
        return f"{v.build_args['TRANSFORMER_ENGINE_VERSION']} (PyPI wheels for CUDA {major}; `CUDA_MAJOR={major}`)"
    if "TE_ROCM_BRANCH" in v.build_args:
        return f"ROCm fork `{v.build_args['TE_ROCM_BRANCH']}`, built for the arch"
    return "none"


def matrix_markdown() -> str:
    """The version matrix of every variant as a markdown table (docs/reference/docker.md)."""
    rows = ["| " + " | ".join(MATRIX_COLUMNS) + " |", "|" + "---|" * len(MATRIX_COLUMNS)]
    for name, v in VARIANTS.items():
        arch = f" (`GPU_ARCH={v.build_args['GPU_ARCH']}`)" if "GPU_ARCH" in v.build_args else ""
        sglang = f"{v.build_args['SGLANG_VERSION']} (base image)" if "SGLANG_VERSION" in v.build_args else "none"
        cells = [f"`{name}`", f"`{v.dockerfile}`", f"`{v.base_image}`", v.accelerator + arch, f"Python {v.python}", sglang,
                 v.build_args.get("MEGATRON_CORE_VERSION", "none"), _te(v)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python docker/build.py", description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--variant", type=_variant, choices=list(VARIANTS), help="the image to build")
    which.add_argument("--all", action="store_true", help="every variant, in turn")
    which.add_argument("--print-requirements", action="store_true", help="print image_requirements(), one a line")
    which.add_argument("--print-constraints", action="store_true", help="print image_constraints(), one a line")
    which.add_argument("--print-matrix", action="store_true", help="print the version matrix (markdown)")
    p.add_argument("--tag", help="image name:tag (default miles:<variant>; only with --variant)")
    p.add_argument("--push", action="store_true", help="docker push the tag after the build")
    p.add_argument("--dry-run", action="store_true", help="print each command, run nothing")
    args = p.parse_args(argv)
    printed = {"print_requirements": lambda: "\n".join(image_requirements()),
               "print_constraints": lambda: "\n".join(image_constraints()), "print_matrix": matrix_markdown}
    for flag, text in printed.items():
        if getattr(args, flag):
            print(text().rstrip("\n"))
            return 0
    if args.tag and args.all:
        p.error("--tag names one image: use it with --variant")
    for name in VARIANTS if args.all else [args.variant]:
        tag = args.tag or f"miles:{name}"
        cmds = [build_command(name, tag)] + ([push_command(tag)] if args.push else [])
        for cmd in cmds:
            print(shlex.join(cmd), flush=True)
            if not args.dry_run:
                subprocess.run(cmd, cwd=ROOT, check=True)
        if args.dry_run:
            for step in install_steps(name):
                print(f"#   in the image: {step}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
