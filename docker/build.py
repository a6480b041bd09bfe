#!/usr/bin/env python3
"""Build the miles images: one variant = one Dockerfile, one base image, its build arguments.

    python docker/build.py --variant cu13                 # docker build ... -t miles:cu13 .
    python docker/build.py --variant rocm700-mi30x --dry-run
    python docker/build.py --all --dry-run                # every variant's command
    python docker/build.py --variant cu12 --tag registry.example/miles:cu12 --push
    python docker/build.py --print-requirements           # what the GPU images pip-install for miles

The version matrix (which SGLang, CUDA / ROCm, GPU arch, Python, Megatron-core, Transformer Engine) is
VARIANTS below and docs/docker.md; a test keeps the two and the Dockerfiles' ARGs in agreement.
Standard library only: it runs before any environment exists. The context is the repository root.
"""

from __future__ import annotations

import argparse
import os
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
    return Variant(dockerfile="docker/Dockerfile.rocm", base_image=f"rocm/sgl-dev:{tag}", accelerator=accelerator, python="3.12",
                   build_args={"GPU_ARCH": gpu_arch, "SGLANG_VERSION": SGLANG_VERSION,
                               "MEGATRON_CORE_VERSION": MEGATRON_CORE_VERSION, "TE_ROCM_BRANCH": TE_ROCM_BRANCH})


VARIANTS: dict[str, Variant] = {
    "cpu": Variant(dockerfile="docker/Dockerfile.cpu", base_image="python:3.11-slim-bookworm", accelerator="CPU only",
                   python="3.11", build_args={}),
    "cu12": _cuda(f"v{SGLANG_VERSION}-cu129", "12", "NVIDIA, CUDA 12.9 (Hopper, Ampere)"),
    "cu13": _cuda(f"v{SGLANG_VERSION}", "13", "NVIDIA, CUDA 13.0 (Blackwell, Hopper)"),
    "rocm700-mi30x": _rocm(f"v{SGLANG_VERSION}-rocm700-mi30x", "gfx942", "AMD, ROCm 7.0, MI300X / MI325X"),
    "rocm700-mi35x": _rocm(f"v{SGLANG_VERSION}-rocm700-mi35x", "gfx950", "AMD, ROCm 7.0, MI350X / MI355X"),
    "rocm720-mi35x": _rocm(f"v{SGLANG_VERSION}-rocm720-mi35x", "gfx950", "AMD, ROCm 7.2, MI350X / MI355X"),
}


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


def image_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """miles' dependencies less the ones the SGLang base image brings (BASE_PROVIDED)."""
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [d for d in deps if d.split("==")[0].strip().lower() not in BASE_PROVIDED]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python docker/build.py", description=__doc__.splitlines()[0])
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--variant", choices=list(VARIANTS), help="the image to build")
    which.add_argument("--all", action="store_true", help="every variant, in turn")
    which.add_argument("--print-requirements", action="store_true", help="print image_requirements(), one a line")
    p.add_argument("--tag", help="image name:tag (default miles:<variant>; only with --variant)")
    p.add_argument("--push", action="store_true", help="docker push the tag after the build")
    p.add_argument("--dry-run", action="store_true", help="print each command, run nothing")
    args = p.parse_args(argv)
    if args.print_requirements:
        print("\n".join(image_requirements()))
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
