"""Real SGLang servers as rollout engines (rollout_engine: sglang): the pinned version, its server
arguments (a snapshot read from the wheel's source, server_args.json), passthrough validation and the
launch command. sglang itself is imported nowhere in miles: the server runs as ``python -m
sglang.launch_server`` (docs/engines.md).
"""

SGLANG_VERSION = "0.5.23"  # the `sglang` extra in pyproject.toml pins the same
