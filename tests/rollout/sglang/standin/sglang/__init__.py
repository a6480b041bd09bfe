"""A stand-in for the sglang package in tests (put standin/ on PYTHONPATH): only `python -m sglang.launch_server`."""
