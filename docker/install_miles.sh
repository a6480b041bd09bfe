#!/usr/bin/env bash
# The miles part of a GPU image (docker/Dockerfile, docker/Dockerfile.rocm), in /opt/miles:
#   deps      miles' own dependencies at its pins, except what the SGLang base image provides at SGLang's pins
#             (docker/build.py BASE_PROVIDED: torch, transformers, tokenizers, ...), under the image's constraints
#             (build.py image_constraints: the megatron-core the image installed and checked stays)
#   project   the project without dependencies (requires-python names the CPU lock's 3.11; the image is
#             SGLang's 3.12, so that check is skipped), then two checks: the pinned SGLang is the one installed,
#             and miles' snapshot of SGLang's server arguments agrees with the image's own SGLang parser
set -euo pipefail
cd /opt/miles
case "${1:-}" in
  deps)
    python3 docker/build.py --print-requirements > /tmp/miles-requirements.txt
    python3 docker/build.py --print-constraints > /tmp/miles-constraints.txt
    pip install -r /tmp/miles-requirements.txt -c /tmp/miles-constraints.txt
    rm /tmp/miles-requirements.txt /tmp/miles-constraints.txt ;;
  project)
    pip install --no-deps --ignore-requires-python -e .
    python3 -c "from miles_core.rollout.sglang.launch import check_sglang_installed as c; print('sglang', c())"
    python3 -m miles_core.rollout.sglang.verify
    miles recipes > /dev/null ;;
  *)
    echo "usage: docker/install_miles.sh deps|project" >&2; exit 2 ;;
esac
