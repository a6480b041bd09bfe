"""Real SGLang servers as rollout engines (rollout_engine: sglang): the pinned version, its server
arguments (a snapshot read from the wheel's source: miles_core/config/server_args.json, pure data that the
config validates against, so it lives in config/) and the launch command. The server runs as ``python -m sglang.launch_server`` (docs/engines.md); the one import
of sglang is verify.py's check of the snapshot against an installed SGLang's own parser.

    launch.py        launch_command (the argv of one engine), require_sglang, new_api_key
    process.py       SGLangProcess: one engine subprocess (start, wait_ready on its probe, kill, stop)
    verify.py        the snapshot against a real SGLang parser; snapshot_parser()
"""

SGLANG_VERSION = "0.5.23"  # the `sglang` extra in pyproject.toml pins the same
