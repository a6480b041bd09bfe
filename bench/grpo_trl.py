"""One GRPO step of miles next to TRL's GRPOTrainer, alternating in one process.

Same work on both sides: the same model (the builtin tiny Qwen2 ``builtin://tiny-qwen2``, or with ``--model
smollm2-135m`` the pretrained SmolLM2-135M, whose answers run ~30 tokens: the real-model shape), the builtin ``arith``
prompts (plain text, no chat template), the ``math`` reward (``miles_core.rewards.score``), B prompts
x G samples x at most T new tokens (sampling stops at EOS on both sides), temperature 1, no top-k /
top-p, one AdamW step per generation batch (lr, betas, eps, weight decay, grad clip from the miles
config; constant lr; no KL term: TRL ``beta=0``), PPO-clip 0.2, per-sequence token-mean loss
(TRL ``loss_type="grpo"`` = miles' default reducer), group-normalized advantages, micro-batches of
``micro_batch_size`` (TRL: ``per_device_train_batch_size`` x ``gradient_accumulation_steps``).

One RL step = generation + reward + update (+ miles' weight sync into its engine, which TRL does
not need since it samples from the training model). miles runs through its library:
``Runtime.generate(i)``, ``.train(i)``, ``.sync_weights()`` with a config from
``load_config("tiny", overrides)``.

``--compile``: both sides' models go through ``torch.compile`` (inductor, on this CPU: C++ kernels), each
the way its users switch it on: miles with ``torch_compile: true`` (its trainer's decoder layers, for the
training forward and backward; the engine is not compiled), TRL with ``torch_compile=True`` (the Trainer
compiles the model, which TRL also samples from). The compiles happen in the warm-up steps; their cost is reported
(``warmup_seconds``), not counted in the step figures.

Limits, measured in the same run (the fp32 matmul peak and the memory bandwidth before and after the pair run, the
best of each): the miles trainer's MFU = the model FLOPs of each step as the packed trainer computes them
(bench/flops.py ``packed_train_flops``: a group's prompt once, the LM head at response tokens, an old-policy pass only
when the trainer runs one) / its train seconds / the peak; and the engine's time against its floor: every decode step
t of the rollout (t = 0 .. the longest response - 1, the rows still generating, their context) must read the matmul
weights and the K/V cache (bandwidth floor) and do the step's FLOPs (compute floor), the higher of the two each step
(bench/bandwidth.py), plus the prefill's FLOPs (each group's prompt once) over the peak; the ratio is engine
seconds / the sum.

Alternation: TRL's ``Trainer.train()`` owns its loop, so miles' step runs inside a TRL callback
at each ``on_step_end``; a TRL step is the wall time between two callbacks minus the miles step in
between. Pairs (TRL step k, miles step k) run back to back, so slow phases of the shared machine hit
both; the first ``warmup`` pairs are dropped. Reward: mean raw reward of each step's samples; the
learning check compares the mean over the last ``tail`` steps of each side.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .common import TMP, Result, fmt_stat, paired_ratio, summarize, table


@dataclass(frozen=True)
class Shape:
    prompts: int
    samples: int
    new_tokens: int
    micro_batch_size: int = 32

    @classmethod
    def parse(cls, s: str) -> "Shape":
        b, g, t = (int(x) for x in s.lower().split("x"))
        return cls(b, g, t, micro_batch_size=min(32, b * g))

    @property
    def n(self) -> int:
        return self.prompts * self.samples

    def __str__(self) -> str:
        return f"{self.prompts}x{self.samples}x{self.new_tokens}"


@dataclass
class Trace:
    """Per-step measurements of one side."""

    seconds: list[float] = field(default_factory=list)
    reward: list[float] = field(default_factory=list)
    completion_len: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)

    def add_parts(self, **parts: float) -> None:
        for k, v in parts.items():
            self.parts.setdefault(k, []).append(v)


def miles_overrides(shape: Shape, run_dir: str, seed: int, extra: dict | None = None) -> dict:
    return {
        "run_dir": run_dir, "rollout_batch_size": shape.prompts, "n_samples_per_prompt": shape.samples,
        "rollout_max_response_len": shape.new_tokens, "micro_batch_size": shape.micro_batch_size,
        "num_steps_per_rollout": 1, "num_rollout": 10_000, "eval_prompt_data": None, "seed": seed, **(extra or {}),
    }


class MilesSide:
    """The local Runtime driven stage by stage, as the train flow does (without Prefect)."""

    def __init__(self, shape: Shape, seed: int, extra: dict | None = None, tag: str = "miles"):
        from flows.recipes import load_config
        from miles_core.runtime.placement import build_runtime

        run_dir = TMP / "grpo_trl" / tag
        shutil.rmtree(run_dir, ignore_errors=True)
        self.cfg = load_config("tiny", miles_overrides(shape, str(run_dir), seed, extra))
        self.rt = build_runtime(self.cfg)
        self.rt.sync_weights()  # version 1 before rollout 0 (REFERENCE §1)
        self.i = 0
        self.trace = Trace()
        self.work: list[dict] = []  # per step: the rollout's groups (limits)
        self._engine_s = 0.0
        engine_generate = self.rt.engine.generate

        def timed(*args, **kwargs):  # the engine's share of the generate stage (the rest: reward, rollout file)
            t = time.perf_counter()
            out = engine_generate(*args, **kwargs)
            self._engine_s += time.perf_counter() - t
            return out

        self.rt.engine.generate = timed

    def step(self) -> None:
        self._engine_s = 0.0
        t0 = time.perf_counter()
        m = self.rt.generate(self.i)
        t1 = time.perf_counter()
        self.rt.train(self.i)
        t2 = time.perf_counter()
        self.rt.sync_weights()
        t3 = time.perf_counter()
        self.trace.seconds.append(t3 - t0)
        self.trace.reward.append(m["rollout/raw_reward"])
        self.trace.completion_len.append(m["rollout/response_len/mean"])
        self.trace.add_parts(generate_reward=t1 - t0, engine=self._engine_s, train=t2 - t1, sync=t3 - t2)
        self.work.append(self._work(self.i))
        self.i += 1

    def _work(self, rollout_id: int) -> dict:
        """The rollout's shape for the limits: (prompt length, response lengths) per group (bench/smollm2.py's count)."""
        from .smollm2 import _token_counts

        return {"groups": _token_counts(self.rt, rollout_id)["groups"]}

    def limits(self, warmup: int, peak: float, bandwidth: float) -> dict:
        """Trainer MFU and engine time / its floor per measured step (module docstring), medians."""
        from .flops import packed_train_flops

        model = self.rt.trainer.engine.model
        old_pass = not getattr(self.rt.trainer, "on_policy", False) and not self.cfg.algo.use_rollout_logprobs
        mfu, gen = [], []
        for work, train_s, engine_s in zip(self.work[warmup:], self.trace.parts["train"][warmup:], self.trace.parts["engine"][warmup:]):
            mfu.append(packed_train_flops(model, work["groups"], old_pass) / train_s / peak)
            gen.append(engine_s / engine_floor_s(model, work["groups"], peak, bandwidth))
        return {"trainer_mfu": summarize(mfu), "engine_over_floor": summarize(gen), "old_policy_pass": old_pass,
                "peak_flops_per_s": peak, "bandwidth_bytes_per_s": bandwidth}


def engine_floor_s(model, groups: list[tuple[int, list[int]]], peak: float, bandwidth: float) -> float:
    """The least time an engine can generate ``groups`` (prompt length, response lengths) in: each group's prompt
    prefilled once (its FLOPs without the LM head over ``peak``), then per decode step t the rows still generating
    at their mean context, the higher of their bytes over ``bandwidth`` and their FLOPs over ``peak``."""
    from .bandwidth import decode_bytes, decode_flops
    from .flops import packed_train_flops

    floor = sum(packed_train_flops(model, [(p, [])], False) / 3 for p, _ in groups) / peak
    rows = [(p, r) for p, rs in groups for r in rs]
    for t in range(max((r for _, r in rows), default=0)):
        live = [p + t for p, r in rows if r > t]
        ctx = sum(live) // len(live)
        floor += max(decode_bytes(model, len(live), ctx) / bandwidth, decode_flops(model, len(live), ctx) / peak)
    return floor


def arith_rows(n: int | None = None, chat: bool = False) -> list[dict]:
    """The builtin arith prompts; ``chat``: as one user message each (TRL's conversational format: it applies the
    tokenizer's chat template, as miles' apply_chat_template does)."""
    from miles_core.data.tasks import BUILTIN_TASKS

    rows = BUILTIN_TASKS["arith"].rows()
    return [{"prompt": [{"role": "user", "content": r["input"]}] if chat else r["input"], "label": r["label"]} for r in rows[:n]]


def math_reward(completions, label, **_) -> list[float]:
    """A conversational completion is a list of messages: its last one's content is scored."""
    from miles_core.rewards import reward_value, score

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [float(reward_value(score("math", c, lab), None)) for c, lab in zip(texts, label)]


def build_trl(shape: Shape, seed: int, cfg, steps: int, callbacks: list, torch_compile: bool = False):
    """GRPOTrainer on a fresh copy of the miles config's model (its hf_checkpoint), settings taken from that config."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from miles_core.env import cache_dir
    from miles_core.models import resolve_model_path

    path = resolve_model_path(cfg.checkpoint.hf_checkpoint, cache_dir())
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    a, r = cfg.algo, cfg.rollout
    accum = shape.n // shape.micro_batch_size
    out = TMP / "grpo_trl" / "trl"
    shutil.rmtree(out, ignore_errors=True)
    args = GRPOConfig(
        output_dir=str(out), use_cpu=True, bf16=False, fp16=False, seed=seed, data_seed=seed,
        per_device_train_batch_size=shape.micro_batch_size, gradient_accumulation_steps=accum, num_generations=shape.samples,
        max_completion_length=shape.new_tokens, temperature=r.rollout_temperature, top_p=r.rollout_top_p, top_k=0,
        learning_rate=a.lr, adam_beta1=a.adam_beta1, adam_beta2=a.adam_beta2, adam_epsilon=a.adam_eps,
        weight_decay=a.weight_decay, max_grad_norm=a.clip_grad, lr_scheduler_type="constant", warmup_steps=0,
        beta=0.0, epsilon=a.eps_clip, loss_type="grpo", scale_rewards="group", num_iterations=1,
        max_steps=steps, logging_steps=10**9, save_strategy="no", report_to="none", disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False, torch_compile=torch_compile,
    )
    return GRPOTrainer(model=model, reward_funcs=[math_reward], args=args, train_dataset=Dataset.from_list(arith_rows(chat=cfg.data.apply_chat_template)),
                       processing_class=tok, callbacks=callbacks)


def _trl_callback(trl: Trace, on_pair):
    """A TrainerCallback timing TRL's steps and running ``on_pair`` (the miles step) after each."""
    from transformers import TrainerCallback

    class Alternate(TrainerCallback):
        mark = None

        def on_train_begin(self, args, state, control, **kw):
            self.mark = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            trl.seconds.append(time.perf_counter() - self.mark)
            gen = trl.parts.get("generate_reward", [0.0])[-1]
            trl.add_parts(train=trl.seconds[-1] - gen)
            on_pair()
            self.mark = time.perf_counter()

    return Alternate()


def _trl_reward_tracker(trainer, trl: Trace) -> None:
    """Record each generation batch's mean reward, completion length and generate+score time as TRL computes them."""
    original = trainer._calculate_rewards
    generate_and_score = trainer._generate_and_score_completions

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        out = generate_and_score(*args, **kwargs)
        trl.add_parts(generate_reward=time.perf_counter() - t0)
        return out

    trainer._generate_and_score_completions = timed

    def wrapped(inputs, prompts, completions, completion_ids_list):
        out = original(inputs, prompts, completions, completion_ids_list)
        trl.reward.append(float(out.sum(dim=1).mean()))
        trl.completion_len.append(sum(len(c) for c in completion_ids_list) / len(completion_ids_list))
        return out

    trainer._calculate_rewards = wrapped


def run_pair(shape: Shape, steps: int, warmup: int, seed: int, miles_extra: dict | None = None,
             torch_compile: bool = False) -> tuple[Trace, Trace, dict, dict]:
    """-> (miles trace, TRL trace, miles config summary, miles' limits); both sides alternate step by step, the
    matmul peak and the memory bandwidth measured before and after them."""
    from .bandwidth import measure_bandwidth
    from .flops import measure_peak

    machine = [(measure_peak(repeats=5)["peak_flops_per_s"], measure_bandwidth(256, 5)["bytes_per_s"])]
    miles = MilesSide(shape, seed, {**(miles_extra or {}), **({"torch_compile": True} if torch_compile else {})})
    trl = Trace()
    trainer = build_trl(shape, seed, miles.cfg, warmup + steps, [_trl_callback(trl, miles.step)], torch_compile=torch_compile)
    _trl_reward_tracker(trainer, trl)
    trainer.train()
    machine.append((measure_peak(repeats=5)["peak_flops_per_s"], measure_bandwidth(256, 5)["bytes_per_s"]))
    limits = miles.limits(warmup, max(p for p, _ in machine), max(b for _, b in machine))
    limits["peak_and_bandwidth_before_after"] = machine
    cfg = {"lr": miles.cfg.algo.lr, "adam_betas": [miles.cfg.algo.adam_beta1, miles.cfg.algo.adam_beta2],
           "eps_clip": miles.cfg.algo.eps_clip, "clip_grad": miles.cfg.algo.clip_grad, "micro_batch_size": shape.micro_batch_size,
           "miles_overrides": miles_extra or {}, "torch_compile": torch_compile}
    return miles.trace, trl, cfg, limits


def _side_figures(t: Trace, shape: Shape, warmup: int, tail: int) -> dict:
    secs = t.seconds[warmup:]
    s = summarize(secs)
    rewards = t.reward
    return {
        "seconds_per_step": s, "samples_per_s": shape.n / s["median"],
        "reward_first": sum(rewards[:tail]) / max(1, len(rewards[:tail])),
        "reward_last": sum(rewards[-tail:]) / max(1, len(rewards[-tail:])),
        "reward_curve": rewards, "completion_len_mean": sum(t.completion_len) / max(1, len(t.completion_len)),
        "parts_median_s": {k: summarize(v[warmup:])["median"] for k, v in t.parts.items()},
        "seconds_raw": t.seconds, "warmup_seconds": sum(t.seconds[:warmup]),
    }


def _miles_core_dir() -> str:
    """Which miles_core ran (the repository's, or a patched copy being measured)."""
    import miles_core

    return str(Path(miles_core.__file__).resolve().parent)


def _round(d: dict) -> dict:
    return {k: round(v, 4) for k, v in d.items()}


def bench(shapes: list[str], steps: int, warmup: int, seed: int, tail: int, miles_extra: dict | None = None,
          name: str = "grpo_vs_trl", torch_compile: bool = False, model: str = "tiny-qwen2") -> Result:
    miles_extra = {**(miles_extra or {}), **({} if model == "tiny-qwen2" else {"hf_checkpoint": f"builtin://{model}"})}
    res = Result(name, {"shapes": shapes, "steps": steps, "warmup": warmup, "seed": seed, "tail": tail, "torch_compile": torch_compile,
                        "model": f"builtin://{model}", "prompts": "builtin://arith", "reward": "math",
                        "miles_core": _miles_core_dir()},
                 extra_packages=("trl", "accelerate", "datasets"))
    rows = []
    for spec in shapes:
        shape = Shape.parse(spec)
        print(f"[grpo-trl] {shape}: {warmup} warm-up + {steps} alternating steps per side", flush=True)
        miles, trl, cfg, limits = run_pair(shape, steps, warmup, seed, miles_extra, torch_compile)
        fm, ft = _side_figures(miles, shape, warmup, tail), _side_figures(trl, shape, warmup, tail)
        # throughput ratio miles/TRL per back-to-back pair = TRL seconds / miles seconds
        ratio = paired_ratio(trl.seconds[warmup:], miles.seconds[warmup:])
        res.figures[str(shape)] = {"miles": fm, "trl": ft, "settings": cfg, "miles_limits": limits}
        res.ratios[f"{shape}/miles_trainer_mfu"] = limits["trainer_mfu"]["median"]
        res.ratios[f"{shape}/miles_engine_over_floor"] = limits["engine_over_floor"]["median"]
        res.ratios[f"{shape}/throughput_miles_over_trl"] = ratio["median"]
        res.ratios[f"{shape}/reward_last_miles_minus_trl"] = fm["reward_last"] - ft["reward_last"]
        res.noise[str(shape)] = {"miles_rel_iqr": fm["seconds_per_step"]["rel_iqr"], "trl_rel_iqr": ft["seconds_per_step"]["rel_iqr"],
                                 "ratio_p25": ratio["p25"], "ratio_p75": ratio["p75"]}
        rows.append([str(shape), fmt_stat(fm["seconds_per_step"], " s"), fmt_stat(ft["seconds_per_step"], " s"),
                     f"{fm['samples_per_s']:.1f}", f"{ft['samples_per_s']:.1f}",
                     f"{ratio['median']:.2f}x ({ratio['p25']:.2f}-{ratio['p75']:.2f})",
                     f"{fm['reward_first']:.2f} -> {fm['reward_last']:.2f}", f"{ft['reward_first']:.2f} -> {ft['reward_last']:.2f}",
                     f"{fm['completion_len_mean']:.1f} / {ft['completion_len_mean']:.1f}",
                     f"{100 * limits['trainer_mfu']['median']:.0f}%", f"{limits['engine_over_floor']['median']:.2f}x"])
        print(f"[grpo-trl] {shape}: miles {fm['seconds_per_step']['median']:.3f} s/step, TRL {ft['seconds_per_step']['median']:.3f} s/step, "
              f"throughput miles/TRL {ratio['median']:.2f}x; reward last-{tail} miles {fm['reward_last']:.3f} TRL {ft['reward_last']:.3f}", flush=True)
        print(f"[grpo-trl]   parts (median s): miles {_round(fm['parts_median_s'])} TRL {_round(ft['parts_median_s'])}", flush=True)
        if torch_compile:
            res.notes.append(f"{shape}: warm-up steps (compiling) took {fm['warmup_seconds']:.1f} s for miles, "
                             f"{ft['warmup_seconds']:.1f} s for TRL.")
    res.tables.append(table(
        ["B x G x T", "miles s/step (IQR)", "TRL s/step (IQR)", "miles samples/s", "TRL samples/s",
         "throughput miles/TRL (paired, IQR)", f"miles reward first/last {tail}", f"TRL reward first/last {tail}",
         "mean completion tokens miles / TRL", "miles trainer MFU", "miles engine / its floor"], rows))
    res.notes += [
        f"{steps} measured steps per side after {warmup} warm-up steps, alternating TRL step / miles step; medians; "
        "the ratio is the median over pairs of TRL seconds / miles seconds (each pair ran back to back).",
        "Both sides sample until EOS or T tokens; completion length is policy-dependent, so it is reported.",
        "miles trainer MFU: packed_train_flops of each step / its train seconds / the fp32 matmul peak; engine / its floor: "
        "the engine's seconds / (each group's prefill FLOPs / peak + per decode step the higher of weights and K/V bytes / "
        "bandwidth and FLOPs / peak); peak and bandwidth the best measured before and after the run (module docstring).",
        "One process: glibc's allocator keeps freed memory (miles_core/malloc.py, set up by miles' runtime) for both "
        "sides' steps, TRL's included.",
    ]
    return res
