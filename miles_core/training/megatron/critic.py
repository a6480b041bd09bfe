"""The PPO critic of the Megatron trainer (`advantage_estimator: ppo`), the torch critic's math
(miles_core/training/critic.py) on megatron-core.

Model: the policy's GPTModel (same shape, TP / PP / EP layout, body weights) whose output layer is a
1-wide value head, Linear(hidden, 1) with a bias like the torch critic's `score`, starting at zero (V = 0
before the first update). Embeddings are never tied to it. The head is replicated over TP: its input,
the final norm's output, is whole on every TP rank, so each rank computes the same values and gradients
(counted once in the grad norm, as any TP-duplicate parameter).

V_t of response token t is read at the position whose output predicts token t, as the log-probs are.
`values(batch)` in the forward-only phase gives V_old [N, T] (float32, last pipeline stage); each
optimizer step takes a critic step (training/rl_step.py, the same for every backend): algorithms.value_loss
with the actor's Reducer, megatron's forward-backward schedule over this data-parallel rank's
micro-batches (the engine's backward), grad-norm clip `clip_grad`,
AdamW with `critic_lr` (default `lr`) and the actor's warm-up (megatron's DistributedOptimizer
with use_distributed_optimizer, as the policy's). Metrics: critic-value_loss,
critic-value_clipfrac, critic-grad_norm, critic-lr-pg_0 (train/ prefix added by the trainer).
Checkpoints hold it beside the policy, under the `critic.` prefix (checkpoint.py).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from . import batching, model, optim, weights


class ValueHead(nn.Module):
    """GPTModel's output layer as a value head: hidden [S, b, H] -> (V [S, b, 1], no bias output)."""

    sequence_parallel = False  # read by GPTModel's inference path

    def __init__(self, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, hidden_size, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(1, dtype=dtype))

    def forward(self, hidden: torch.Tensor, weight=None, runtime_gather_output=None):
        return F.linear(hidden, self.weight, self.bias), None


class MegatronCritic:
    """The value stage (DDP-wrapped) and its optimizer (see the module docstring)."""

    def __init__(self, trainer, hf_state: dict[str, torch.Tensor]):
        self.algo, self.p, self.micro_batch_size = trainer.algo, trainer.p, trainer.algo.micro_batch_size
        self.lr = self.algo.critic_lr or self.algo.lr
        args = trainer.args
        self.tconfig = model.transformer_config(args, self.p, trainer.dtype, cpu=trainer.device_type == "cpu")
        self.workload, self.share_prompts = trainer.workload, trainer.share_prompts
        self.tconfig.calculate_per_token_loss = True
        stage = model.build_stage(dataclasses.replace(args, untie_embeddings_and_output_weights=True), self.tconfig,
                                  trainer.spec.use_transformer_engine)
        if stage.post_process:
            stage.output_layer = ValueHead(args.hidden_size, trainer.dtype)
        head = {"output_layer.weight": torch.zeros(1, args.hidden_size), "output_layer.bias": torch.zeros(1)}
        model.to_params_dtype(stage, trainer.dtype)
        local = weights.shard({**weights.hf_to_full(hf_state, args), **head}, stage)
        stage.load_state_dict({k: v.to(trainer.dtype) for k, v in local.items()}, strict=False)
        self.distributed = self.p.use_distributed_optimizer
        self.module = optim.wrap_ddp(self.tconfig, stage, distributed_optimizer=self.distributed)
        self.params = [p for p in self.module.parameters() if p.requires_grad]
        self.optimizer = optim.build(self.module, self.params, self.algo, self.lr, trainer.dtype, self.distributed, trainer.device_type)

    @staticmethod
    def response_values(mb: batching.MicroBatch, out: torch.Tensor) -> torch.Tensor:
        """out [b, S, 1] -> V [n, T] (float32) at the positions predicting mb's response tokens."""
        return out.reshape(-1)[mb.flat_index].float()

    def _plan(self, batch, rows: list[int], forward_only: bool) -> list[batching.MicroBatch]:
        p = self.p
        max_tokens = ((p.log_probs_max_tokens_per_gpu or p.max_tokens_per_gpu) if forward_only else p.max_tokens_per_gpu) \
            if p.use_dynamic_batch_size else None
        return batching.plan(batch, rows, self.micro_batch_size, max_tokens, p.qkv_format,
                             p.tensor_model_parallel_size * p.data_pad_size_multiplier, self.workload,
                             share_prompts=self.share_prompts)

    def values(self, batch) -> torch.Tensor | None:
        """V_old [N, T] on the last pipeline stage (None on the others), no grad."""
        return batching.forward_only(self.module, batch, self._plan(batch, list(range(len(batch))), True), self.response_values)
