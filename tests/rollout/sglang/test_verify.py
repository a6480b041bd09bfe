"""verify.compare: the check that the GPU images run against the installed SGLang's own parser. Here (no
SGLang) against parsers built from the snapshot with SGLang's rules, intact and with one thing changed."""

from __future__ import annotations

import argparse
from dataclasses import replace

from miles_core.config.server_args import Snapshot, snapshot
from miles_core.rollout.sglang.verify import compare, snapshot_parser


def _with(name: str, **changes) -> Snapshot:
    snap = snapshot()
    return Snapshot(version=snap.version, args={**snap.args, name: replace(snap.args[name], **changes)}, spellings=snap.spellings)


def test_the_snapshot_agrees_with_the_parser_it_describes():
    assert compare(snapshot_parser()) == []


def test_each_kind_of_difference_is_reported():
    parser = snapshot_parser()
    cases = [
        (_with("mem_fraction_static", type="int"), "mem_fraction_static (--mem-fraction-static): type int in the snapshot, float in SGLang"),
        (_with("enable_metrics", kind="value", type="str"), "enable_metrics (--enable-metrics): read as value in the snapshot, store_true in SGLang"),
        (_with("log_level", default="debug"), "log_level (--log-level): default 'debug' in the snapshot, 'info' in SGLang"),
        (_with("tp_size", flags=("--tp-size",)), "tp_size (--tp-size): flags ['--tp-size'] in the snapshot, ['--tensor-parallel-size', '--tp-size'] in SGLang"),
        (_with("cuda_graph_bs_decode", nargs="*"), "cuda_graph_bs_decode (--cuda-graph-bs-decode): nargs * in the snapshot, + in SGLang"),
        (_with("tokenizer_mode", choices=("auto",)), "tokenizer_mode (--tokenizer-mode): choices differ (1 in the snapshot, 2 in SGLang)"),
    ]
    for snap, expected in cases:
        assert compare(parser, snap) == [expected]


def test_arguments_on_one_side_only():
    parser = snapshot_parser()
    parser.add_argument("--brand-new-flag", type=int, default=3)
    assert compare(parser) == ["brand_new_flag (--brand-new-flag): in SGLang, not in the snapshot"]
    snap = snapshot()
    fewer = argparse.ArgumentParser()
    for action in snapshot_parser()._actions:
        if action.option_strings and action.dest not in ("help", "log_level"):
            fewer._add_action(action)
    assert compare(fewer, snap) == ["log_level (--log-level): in the snapshot, not in SGLang"]
