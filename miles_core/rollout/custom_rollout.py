"""The reference's whole-rollout extension points: ``rollout_function_path``, ``data_source_path``,
``disable_rollout_global_dataset`` and ``rollout_all_samples_process_path``, with the reference's signatures
(its miles/rollout/base_types.py, data_source.py and inference_rollout/compatibility.py).

- A rollout function replaces miles' generate loop (generate.py) for a training rollout. Either the
  reference's plain function ``fn(args, rollout_id, data_source, evaluation=False)`` (its legacy form; sync
  or async), or its class form: built once with ``RolloutFnConstructorInput(args, data_source)``, called
  with ``RolloutFnTrainInput(rollout_id, weight_version)``. ``args`` is the config under the reference's
  flag names (resolve.reference_args) plus ``sglang_router_ip`` / ``sglang_router_port``: an SGLang
  ``POST /generate`` endpoint over this run's engines (multi_turn/front.py), open while the function runs.
- It returns ``list[list[Sample]]`` or ``RolloutFnTrainOutput(samples, metrics)``: exactly
  rollout_batch_size groups of n_samples_per_prompt finished samples (the batch invariant), each with
  ``response_length`` tokens at the end of ``tokens`` and a loss mask and rollout log-probs of that length
  (``checked_rollout``; an error names the function). A sample whose ``reward`` is None is scored by the
  run's reward (rm_type / custom_rm_path); ``metrics`` are logged with the rollout's.
- The data source (``RolloutDataSourceWithBuffer``) is miles' own (data/source.py) seen through the
  reference's interface: ``get_samples(n)`` (also ``data_source(n)``, as the reference's class form passes
  its bound method) -> n groups: buffered groups first, then G PENDING samples per new prompt (tokens = the
  prompt ids, prompt, label, metadata); ``add_samples(groups)`` buffers groups for a later call. Its
  cursor and buffer are the data source's state saved in every checkpoint. Without a global dataset
  (``disable_rollout_global_dataset``) a new group is G empty Samples, numbered on from the cursor.
- ``data_source_path`` another class: built with ``(args)``, it must have get_samples, add_samples, save and
  load; ``save(rollout_id)`` runs at every checkpoint save (args.save = the run's save dir) and
  ``load(rollout_id)`` at resume (args.load = the load dir), as the reference's RolloutManager calls them.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any, Callable

from miles_core.config.data import REFERENCE_DATA_SOURCES
from miles_core.data.sample import Sample, Status
from miles_core.data.source import DataSource
from miles_core.resolve import resolve

from .generate import new_group

SOURCE_METHODS = ("get_samples", "add_samples", "save", "load")


@dataclass
class RolloutFnTrainOutput:
    samples: list[list[Sample]]
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    data: dict[str, dict[str, Any]]
    metrics: dict[str, Any] | None = None


@dataclass(frozen=True)
class RolloutFnConstructorInput:
    args: Any
    data_source: Any


@dataclass(frozen=True)
class RolloutFnTrainInput:
    rollout_id: int
    weight_version: int | None = None

    @property
    def evaluation(self) -> bool:
        return False


class RolloutDataSourceWithBuffer:
    """The reference's data-source interface over miles' DataSource (see the module docstring)."""

    def __init__(self, source: DataSource, n_samples_per_prompt: int, *, global_dataset: bool = True, read_only: bool = False):
        self.source, self.G = source, n_samples_per_prompt
        self.global_dataset, self.read_only = global_dataset, read_only
        self.rollout_id = 0  # set by the caller: the rollout the handed-out samples belong to

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        groups = [] if self.read_only else self.source.take_buffered(num_samples)
        n = num_samples - len(groups)
        if self.global_dataset:
            return groups + [new_group(gi, p, self.rollout_id, self.G) for gi, p in self.source.next_prompts(n)]
        cursor = self.source.cursor
        for _ in range(n):
            gi = cursor.next_group_index
            groups.append([Sample(group_index=gi, index=gi * self.G + k, rollout_id=self.rollout_id) for k in range(self.G)])
            cursor.next_group_index += 1
        return groups

    __call__ = get_samples  # the reference's class-form rollout passes data_source.get_samples itself

    def add_samples(self, samples: list[list[Sample]]) -> None:
        if self.read_only:
            raise RuntimeError("data_source_path miles.rollout.data_source.RolloutDataSource is read-only: add_samples needs "
                               "RolloutDataSourceWithBuffer (the default)")
        if not isinstance(samples, list) or not all(isinstance(g, list) and len(g) == self.G and all(isinstance(s, Sample) for s in g)
                                                    for g in samples):
            raise ValueError(f"data_source.add_samples takes a list of groups, each a list of n_samples_per_prompt={self.G} "
                             "Samples")
        self.source.add_to_buffer(samples)

    def get_buffer_length(self) -> int:
        return len(self.source.buffer)


def make_data_source(path: str, source: DataSource, n_samples_per_prompt: int, global_dataset: bool, args: Any):
    """data_source_path -> the data source a rollout function gets: ours for the reference's built-in names, else the user's
    class built with ``args`` (it must have the reference's DataSource methods)."""
    if path in REFERENCE_DATA_SOURCES:
        return RolloutDataSourceWithBuffer(source, n_samples_per_prompt, global_dataset=global_dataset,
                                           read_only=REFERENCE_DATA_SOURCES[path])
    cls = resolve_data_source(path)
    made = cls(args)
    missing = [m for m in SOURCE_METHODS if not callable(getattr(made, m, None))]
    if missing:
        raise ValueError(f"data_source_path {path!r}: its object has no {', '.join(missing)} (the reference's DataSource: "
                         f"{', '.join(SOURCE_METHODS)})")
    return made


def resolve_data_source(path: str) -> type:
    cls = resolve(path, what="data_source_path")
    if not inspect.isclass(cls):
        raise ValueError(f"data_source_path {path!r} must name a class built with (args), got {type(cls).__name__}")
    missing = [m for m in SOURCE_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ValueError(f"data_source_path {path!r}: the class has no {', '.join(missing)} (the reference's DataSource: "
                         f"{', '.join(SOURCE_METHODS)})")
    return cls


def resolve_rollout_function(path: str) -> Callable[..., Any]:
    """rollout_function_path -> a class (the reference's class form) or fn(args, rollout_id, data_source, evaluation=...);
    ValueError naming the path otherwise (at load)."""
    fn = resolve(path, what="rollout_function_path")
    if inspect.isclass(fn):
        return fn
    params = inspect.signature(fn).parameters
    positional = [p for p in params.values() if p.kind <= p.POSITIONAL_OR_KEYWORD]
    if len(positional) < 3 or "evaluation" not in params and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        raise ValueError(f"rollout_function_path {path!r}: expected the reference's (args, rollout_id, data_source, "
                         f"evaluation=False), got ({', '.join(params)})")
    return fn


class RolloutFunction:
    """A loaded rollout function: ``call(rollout_id, weight_version)`` -> its output as the function returned it."""

    def __init__(self, path: str, args: Any, data_source: Any):
        self.path, self.args, self.data_source = path, args, data_source
        fn = resolve_rollout_function(path)
        if inspect.isclass(fn):
            made = fn(RolloutFnConstructorInput(args=args, data_source=data_source))
            self._call = lambda rid, version: made(RolloutFnTrainInput(rollout_id=rid, weight_version=version))
        else:
            self._call = lambda rid, version: fn(args, rid, data_source, evaluation=False)

    def call(self, rollout_id: int, weight_version: int) -> Any:
        if isinstance(self.data_source, RolloutDataSourceWithBuffer):
            self.data_source.rollout_id = rollout_id
        out = self._call(rollout_id, weight_version)
        return asyncio.run(out) if inspect.iscoroutine(out) else out


def checked_rollout(path: str, out: Any, rollout_batch_size: int, G: int) -> tuple[list[list[Sample]], dict[str, float]]:
    """The function's output -> (groups, metrics); ValueError naming the function when it breaks the contract."""
    where = f"rollout_function_path {path!r}"
    samples, metrics = (out.samples, out.metrics) if hasattr(out, "samples") else (out, None)
    if not isinstance(samples, list) or not all(isinstance(g, list) for g in samples):
        raise ValueError(f"{where} returned {type(samples).__name__}, expected list[list[Sample]] or RolloutFnTrainOutput")
    if len(samples) != rollout_batch_size or any(len(g) != G for g in samples):
        raise ValueError(f"{where} returned {len(samples)} groups of sizes {sorted({len(g) for g in samples})}; the trainer takes "
                         f"rollout_batch_size={rollout_batch_size} groups of n_samples_per_prompt={G} (the batch invariant)")
    for s in (s for g in samples for s in g):
        if not isinstance(s, Sample):
            raise ValueError(f"{where} returned a {type(s).__name__} in a group, expected Sample (miles_core.data.Sample)")
        n = s.response_length
        if s.status == Status.PENDING or not 0 < n <= len(s.tokens):
            raise ValueError(f"{where}: sample {s.index} came back with status {s.status.value} and response_length {n} of "
                             f"{len(s.tokens)} tokens; set tokens (prompt + response), response_length and the status")
        for name in ("loss_mask", "rollout_log_probs"):
            if len(getattr(s, name)) != n:
                raise ValueError(f"{where}: sample {s.index} has {len(getattr(s, name))} {name} values, expected "
                                 f"response_length={n}")
    if metrics is not None and not (isinstance(metrics, dict) and all(isinstance(v, (int, float)) for v in metrics.values())):
        raise ValueError(f"{where}: metrics must be a dict of numbers, got {metrics!r:.200}")
    return samples, {k: float(v) for k, v in (metrics or {}).items()}


def run_rollout_function(rf: RolloutFunction, engine, tokenizer, spec, rewards, rollout_id: int, weight_version: int, decode):
    """One training rollout by the user's function -> a Rollout (generate.py's result): the endpoint open while it runs,
    its groups checked, samples without a reward scored by the run's reward, the engine's version filled in where a
    sample has none."""
    from miles_core.rewards import batched_async_rm

    from .generate import Rollout
    from .multi_turn.front import GenerateFront

    with GenerateFront(engine, tokenizer) as front:
        rf.args.sglang_router_ip, rf.args.sglang_router_port = front.host, front.port
        out = rf.call(rollout_id, weight_version)
    groups, metrics = checked_rollout(rf.path, out, spec.rollout_batch_size, spec.n_samples_per_prompt)
    samples = [s for g in groups for s in g]
    version = engine.get_weight_version()
    for s in samples:
        s.rollout_id = rollout_id
        s.weight_versions = s.weight_versions or [version]
        s.response = s.response or decode(s.response_tokens)
    unscored = [s for s in samples if s.reward is None]
    for s, r in zip(unscored, asyncio.run(batched_async_rm(unscored, rewards))):
        s.reward = r
    return Rollout(rollout_id, samples, metrics)
