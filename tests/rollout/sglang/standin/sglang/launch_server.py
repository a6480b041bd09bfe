"""Stand-in for ``python -m sglang.launch_server`` in tests: reads the flags of SGLang that the launcher
sets (model path, host, port, api key) and serves our SGLang-protocol server with them; the rest of the
command line is written to $STANDIN_ARGV_FILE so a test can check it, and otherwise ignored."""

import argparse
import json
import os
import sys

from miles_core.rollout.http.server import API_KEY_ENV, main

p = argparse.ArgumentParser()
for flag in ("--model-path", "--host", "--api-key"):
    p.add_argument(flag, required=True)
p.add_argument("--port", type=int, required=True)
args, _ = p.parse_known_args()
if os.environ.get("STANDIN_ARGV_FILE"):
    with open(os.environ["STANDIN_ARGV_FILE"], "w") as f:
        json.dump(sys.argv[1:], f)
os.environ[API_KEY_ENV] = args.api_key
main(["--model-path", args.model_path, "--host", args.host, "--port", str(args.port), "--num-threads", "1"])
