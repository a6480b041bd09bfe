"""LoRA in the Megatron trainer: adapters on megatron-core's parallel linear layers, PEFT's math per HF module.

A targeted layer's HF module (q_proj, ..., down_proj) gets A [r, in] and B [out, r], and the layer computes

    y = x W^T + s * x A^T B^T        s = lora_alpha / lora_rank, B zero at the start (PEFT's LoraLayer)

as PEFT computes it. Megatron fuses HF modules: ``linear_qkv`` holds q/k/v (rows per query group [q heads; k; v]),
``linear_fc1`` [gate; up] (under TP each rank [gate_r; up_r]). The reference's ``lora_type`` says how the adapters
meet the fusion (Megatron-Bridge's LoRA and CanonicalLoRA):
    lora            one adapter per fused layer: A [r, in] shared by the HF modules it fuses, B [fused rows, r]
    canonical_lora  one adapter per HF module (q, k, v, gate, up each their A and B), their outputs laid out in the
                    fused layer's rows: the torch trainer's PEFT adapters, so the two trainers train the same ones
In PEFT's names a fused adapter is each HF module's (A, its rows of B), the A repeated, so exports, the merged
weights and lora_adapter_path are one format for both (a PEFT dir whose A differ within a fused layer is a
canonical_lora adapter, refused under lora).

Tensor parallel (the same layout as the weights, weights.py):
    column-parallel (linear_qkv, linear_fc1): x is whole on every rank; A whole (replicated), B this rank's rows.
        h = x A^T is entered into the TP region (``copy_to_tensor_model_parallel_region``: its gradient summed
        over TP), so A's gradient and x's are the whole model's on every rank.
    row-parallel (linear_proj, linear_fc2): x is this rank's columns; A this rank's columns, B whole.
        h = sum over TP of x_r A_r^T (``reduce_from_tensor_model_parallel_region``), then h B^T.
The replicated tensors carry megatron's default TP attributes, so the grad norm counts them once.

The adapters' names are PEFT's (``model.layers.<i>.self_attn.q_proj`` -> its A and B, the whole tensors): the
initial adapters (a seeded kaiming-uniform A, as nn.Linear's and PEFT's init, or lora_adapter_path), the gathered
ones (export, the merged weights of weight sync) and the comparisons with the torch trainer all use them.

Built on the local layer spec (Transformer Engine's folds the norm into linear_qkv / linear_fc1, which would hide
the adapters' input), dense layers only, no dropout, no sequence parallelism: the engine refuses the rest by name.
"""

from __future__ import annotations

import math
import re

import torch

from miles_core.training.lora import LoraAdapters, is_adapter

HF_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# megatron's layer (under decoder.layers.<i>.) -> (HF block, the HF modules it fuses, column-parallel)
FUSED = {
    "self_attention.linear_qkv": ("self_attn", ("q_proj", "k_proj", "v_proj"), True),
    "self_attention.linear_proj": ("self_attn", ("o_proj",), False),
    "mlp.linear_fc1": ("mlp", ("gate_proj", "up_proj"), True),
    "mlp.linear_fc2": ("mlp", ("down_proj",), False),
}
LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")


class LoraLinear(torch.nn.Module):
    """A megatron parallel linear (``base_layer``, frozen) plus the adapters of the HF modules it fuses.

    ``pieces``: (adapter name, its output rows in this rank's share) in the fused order: the HF modules the layer fuses
    (canonical_lora), or one piece named after the fused layer (lora); the adapted ones have ``lora_A[name]`` /
    ``lora_B[name]``. ``qkv``: (query groups on this rank, q rows per group, kv rows per group) for canonical_lora's
    linear_qkv, whose output interleaves q/k/v per group."""

    def __init__(self, base_layer, pieces: list[tuple[str, int]], adapted: list[str], rank: int, scaling: float,
                 column: bool, qkv: tuple[int, int, int] | None = None):
        from megatron.core.tensor_parallel.layers import set_defaults_if_not_set_tensor_model_parallel_attributes
        from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

        super().__init__()
        self.base_layer, self.pieces, self.scaling, self.column, self.qkv = base_layer, pieces, scaling, column, qkv
        weight = base_layer.weight
        in_local = weight.shape[1]
        self.lora_A, self.lora_B = torch.nn.ParameterDict(), torch.nn.ParameterDict()
        for name, rows in pieces:
            if name not in adapted:
                continue
            a = torch.nn.Parameter(torch.zeros(rank, in_local, dtype=weight.dtype, device=weight.device))
            b = torch.nn.Parameter(torch.zeros(rows, rank, dtype=weight.dtype, device=weight.device))
            if column:  # A whole on every rank, B this rank's rows
                set_defaults_if_not_set_tensor_model_parallel_attributes(a)
                set_tensor_model_parallel_attributes(b, True, 0, 1)
            else:  # A this rank's columns, B whole
                set_tensor_model_parallel_attributes(a, True, 1, 1)
                set_defaults_if_not_set_tensor_model_parallel_attributes(b)
            self.lora_A[name], self.lora_B[name] = a, b

    def forward(self, x, *args, **kwargs):
        from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region
        from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

        out, bias = self.base_layer(x, *args, **kwargs)
        names = list(self.lora_A)
        a = torch.cat([self.lora_A[n] for n in names])  # [k r, in_local]
        h = x.to(a.dtype) @ a.t()
        h = copy_to_tensor_model_parallel_region(h) if self.column else reduce_from_tensor_model_parallel_region(h)
        hs = dict(zip(names, h.split(self.lora_A[names[0]].shape[0], dim=-1)))
        parts = [(hs[n] @ self.lora_B[n].t()) * self.scaling if n in hs else h.new_zeros(*h.shape[:-1], rows)
                 for n, rows in self.pieces]
        return out + self._fused(parts).to(out.dtype), bias

    def _fused(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """The pieces' outputs in the fused layer's row order (linear_qkv: per query group [q; k; v])."""
        if self.qkv is None:
            return torch.cat(parts, dim=-1)
        groups, q_rows, kv_rows = self.qkv
        q, k, v = (p.reshape(*p.shape[:-1], groups, n) for p, n in zip(parts, (q_rows, kv_rows, kv_rows)))
        fused = torch.cat([q, k, v], dim=-1)
        return fused.reshape(*fused.shape[:-2], -1)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets=(), metadata=None):
        """The adapters' shards under ``<prefix>lora_{A,B}.<module>`` (B split along rows on a column-parallel layer, A
        along columns on a row-parallel one), and the base layer's under ``<prefix>base_layer.``."""
        from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group, make_sharded_tensors_for_checkpoint

        metadata = ensure_metadata_has_dp_cp_group(metadata)
        out = dict(self.base_layer.sharded_state_dict(f"{prefix}base_layer.", sharded_offsets, metadata))
        tensors = {f"lora_{ab}.{n}": t for ab, d in (("A", self.lora_A), ("B", self.lora_B)) for n, t in d.items()}
        axes = {k: (0 if self.column else 1) for k in tensors if k.startswith("lora_B." if self.column else "lora_A.")}
        out |= make_sharded_tensors_for_checkpoint(tensors, prefix, axes, sharded_offsets,
                                                   tp_group=getattr(self.base_layer, "tp_group", None),
                                                   dp_cp_group=metadata["dp_cp_group"])
        return out


def hf_module(layer_number: int, fused: str, name: str) -> str:
    """The HF module an adapter belongs to, e.g. (0, "self_attention.linear_qkv", "q_proj") -> model.layers.0.self_attn.q_proj."""
    return f"model.layers.{layer_number}.{FUSED[fused][0]}.{name}"


class MegatronLora:
    """The adapters of one Megatron policy stage: which HF modules, injection, init, gather and merge."""

    def __init__(self, lora: LoraAdapters, args, tp_size: int):
        self.adapters, self.args, self.tp = lora, args, tp_size
        fields = lora.lora
        wanted = HF_MODULES if fields.targets == "all-linear" else tuple(fields.targets)
        unknown = [n for n in wanted if n not in HF_MODULES]
        if unknown:
            raise ValueError(f"target_modules {unknown} with train_backend megatron: its adapters go on the decoder's linear "
                             f"layers, {', '.join(HF_MODULES)} (or all-linear / linear_qkv, linear_proj, linear_fc1, linear_fc2)")
        self.modules = tuple(n for n in HF_MODULES if n in wanted and n not in fields.excluded)
        self.fused = fields.lora_type == "lora"
        for fused, (_, names, column) in FUSED.items():
            part = [n for n in names if n in self.modules]
            if self.fused and part and len(part) < len(names):
                raise ValueError(f"lora_type lora with train_backend megatron puts one adapter on the fused {fused.split('.')[1]} "
                                 f"({', '.join(names)}); target_modules adapts only {', '.join(part)} of it: target all of "
                                 "them, or set lora_type canonical_lora (one adapter per HF module)")

    def _pieces(self, fused: str) -> tuple[list[tuple[str, int]], tuple[int, int, int] | None]:
        pieces, qkv = self._module_pieces(fused)
        if self.fused and FUSED[fused][2]:  # lora: the column-parallel fused layer as one adapter
            return [(fused.split(".")[1], sum(rows for _, rows in pieces))], None
        return pieces, qkv

    def _module_pieces(self, fused: str) -> tuple[list[tuple[str, int]], tuple[int, int, int] | None]:
        a, tp = self.args, self.tp
        if fused == "self_attention.linear_qkv":
            groups, per = a.num_query_groups // tp, a.num_attention_heads // a.num_query_groups
            hd = a.kv_channels
            return [("q_proj", groups * per * hd), ("k_proj", groups * hd), ("v_proj", groups * hd)], (groups, per * hd, hd)
        if fused == "mlp.linear_fc1":
            return [("gate_proj", a.ffn_hidden_size // tp), ("up_proj", a.ffn_hidden_size // tp)], None
        return [(FUSED[fused][1][0], a.hidden_size)], None

    def inject(self, stage) -> None:
        """Every targeted parallel linear of ``stage`` wrapped in a LoraLinear; every base parameter frozen."""
        s = self.adapters.scaling
        for layer in stage.decoder.layers:
            for fused, (_, names, column) in FUSED.items():
                adapted = [n for n in names if n in self.modules]
                if not adapted:
                    continue
                parent_name, child = fused.split(".")
                parent = getattr(layer, parent_name)
                pieces, qkv = self._pieces(fused)
                if len(pieces) == 1:
                    adapted = [pieces[0][0]]
                setattr(parent, child, LoraLinear(getattr(parent, child), pieces, adapted, self.adapters.lora.lora_rank, s,
                                                  column, qkv))
        for name, p in stage.named_parameters():
            p.requires_grad_(is_adapter(name))

    # ---- whole (PEFT-named) adapters <-> this rank's ---------------------------------------------------------
    def _wrapped(self, stage):
        """(global layer number, fused name, LoraLinear) of every adapted layer of this stage."""
        for layer in stage.decoder.layers:
            for fused in FUSED:
                parent_name, child = fused.split(".")
                m = getattr(getattr(layer, parent_name), child)
                if isinstance(m, LoraLinear):
                    yield layer.layer_number - 1, fused, m

    def initial(self, seed: int) -> dict[str, torch.Tensor]:
        """The starting adapters, PEFT-named (``<module>.lora_A.weight`` / ``.lora_B.weight``, whole): A kaiming-uniform
        with a = sqrt(5) (nn.Linear's and PEFT's init) from a generator seeded by ``seed``, B zero."""
        g = torch.Generator().manual_seed(seed)
        out, drawn = {}, {}
        for module, (rows, cols) in sorted(self.shapes().items()):
            group = self._group(module)  # lora: one A per fused layer
            if group not in drawn:
                bound = 1.0 / math.sqrt(cols)  # kaiming_uniform_(a=sqrt(5)) on [r, in]: U(-1/sqrt(in), 1/sqrt(in))
                drawn[group] = (torch.rand(self.adapters.lora.lora_rank, cols, generator=g) * 2 - 1) * bound
            out[f"{module}.lora_A.weight"] = drawn[group].clone()
            out[f"{module}.lora_B.weight"] = torch.zeros(rows, self.adapters.lora.lora_rank)
        return out

    def _group(self, module: str) -> str:
        """The module whose A an HF module's adapter uses: the fused layer's first module under lora, else itself."""
        block, name = module.rsplit(".", 1)
        for _, names, column in FUSED.values():
            if self.fused and column and name in names:
                return f"{block}.{names[0]}"
        return module

    def shapes(self) -> dict[str, tuple[int, int]]:
        """HF module -> (out, in) of every adapted module of the whole model."""
        a = self.args
        hd, h, f = a.kv_channels, a.hidden_size, a.ffn_hidden_size
        shape = {"q_proj": (a.num_attention_heads * hd, h), "k_proj": (a.num_query_groups * hd, h),
                 "v_proj": (a.num_query_groups * hd, h), "o_proj": (h, a.num_attention_heads * hd),
                 "gate_proj": (f, h), "up_proj": (f, h), "down_proj": (h, f)}
        return {f"model.layers.{i}.{'self_attn' if n in HF_MODULES[:4] else 'mlp'}.{n}": shape[n]
                for i in range(a.num_layers) for n in self.modules}

    def load(self, stage, whole: dict[str, torch.Tensor]) -> None:
        """Whole PEFT-named adapters into this rank's shards (exactly the adapted modules of this stage)."""
        from megatron.core import parallel_state as ps

        rank = ps.get_tensor_model_parallel_rank()
        expected = set(self.initial_keys())
        if set(whole) != expected:
            missing, extra = sorted(expected - set(whole)), sorted(set(whole) - expected)
            raise ValueError(f"LoRA adapters: missing {missing[:3]}, unexpected {extra[:3]} for target_modules "
                             f"{self.adapters.lora.target_modules}")
        with torch.no_grad():
            for layer, fused, m in self._wrapped(stage):
                for name in m.lora_A:
                    module = hf_module(layer, fused, name)
                    if name in HF_MODULES:
                        a, b = whole[f"{module}.lora_A.weight"], whole[f"{module}.lora_B.weight"]
                        b = b.chunk(self.tp, dim=0)[rank] if m.column else b
                        a = a if m.column else a.chunk(self.tp, dim=1)[rank]
                    else:
                        a, b = self._fused_share(whole, layer, fused, rank)
                    for target, src, what in ((m.lora_A[name], a, "lora_A"), (m.lora_B[name], b, "lora_B")):
                        if tuple(src.shape) != tuple(target.shape):
                            raise ValueError(f"LoRA adapter {module}.{what}: shape {tuple(src.shape)}, this rank's share "
                                             f"{tuple(target.shape)} (lora_rank {self.adapters.lora.lora_rank})")
                        target.copy_(src.to(target.dtype))

    def _fused_share(self, whole: dict[str, torch.Tensor], layer: int, fused: str, rank: int):
        """lora: the PEFT-named adapters of a fused layer's HF modules -> (A, this rank's rows of the fused B)."""
        from .weights import _merge_qkv

        names = FUSED[fused][1]
        modules = [hf_module(layer, fused, n) for n in names]
        a_s = [whole[f"{m}.lora_A.weight"] for m in modules]
        if any(not torch.equal(a, a_s[0]) for a in a_s[1:]):
            raise ValueError(f"LoRA adapters of {', '.join(modules)}: their lora_A differ, an adapter of one A per HF module; "
                             "lora_type lora shares one A over the fused layer: set lora_type canonical_lora")
        b_s = [whole[f"{m}.lora_B.weight"] for m in modules]
        if len(names) == 3:  # linear_qkv: the fused rows per query group, TP ranks holding whole groups
            return a_s[0], _merge_qkv(*b_s, self.args).chunk(self.tp, dim=0)[rank]
        return a_s[0], torch.cat([b.chunk(self.tp, dim=0)[rank] for b in b_s])  # linear_fc1: [gate_r; up_r]

    def _fused_whole(self, a: torch.Tensor, b: torch.Tensor, layer: int, fused: str) -> dict[str, torch.Tensor]:
        """lora: a fused layer's A and whole fused B (TP shards concatenated) -> its HF modules' PEFT-named adapters."""
        from .weights import _split_qkv

        names = FUSED[fused][1]
        if len(names) == 3:
            parts = _split_qkv(b, self.args)
        else:  # [gate_0; up_0; gate_1; up_1; ...] -> gate, up
            halves = [p.chunk(2) for p in b.chunk(self.tp)]
            parts = (torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves]))
        out = {}
        for n, part in zip(names, parts):
            module = hf_module(layer, fused, n)
            out[f"{module}.lora_A.weight"], out[f"{module}.lora_B.weight"] = a.clone(), part.contiguous().clone()
        return out

    def initial_keys(self) -> list[str]:
        return [f"{m}.lora_{ab}.weight" for m in self.shapes() for ab in "AB"]

    def gather(self, stage) -> dict[str, torch.Tensor]:
        """The whole PEFT-named adapters on every rank (TP shards gathered, pipeline stages exchanged)."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        group = ps.get_tensor_model_parallel_group()
        mine = {}
        for layer, fused, m in self._wrapped(stage):
            for name in m.lora_A:
                a, b = m.lora_A[name].detach(), m.lora_B[name].detach()
                if self.tp > 1:
                    split, dim = (b, 0) if m.column else (a, 1)
                    parts = [torch.empty_like(split) for _ in range(self.tp)]
                    dist.all_gather(parts, split.contiguous(), group=group)
                    whole = torch.cat(parts, dim=dim)
                    a, b = (a, whole) if m.column else (whole, b)
                if name not in HF_MODULES:
                    mine |= self._fused_whole(a, b, layer, fused)
                    continue
                module = hf_module(layer, fused, name)
                mine[f"{module}.lora_A.weight"], mine[f"{module}.lora_B.weight"] = a.clone(), b.clone()
        if dist.get_world_size() == 1:
            return mine
        everyone: list[dict] = [None] * dist.get_world_size()  # type: ignore[list-item]
        dist.all_gather_object(everyone, mine)
        return {k: v for part in everyone for k, v in part.items()}

    def merged(self, hf: dict[str, torch.Tensor], adapters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The HF weights with W + s * B A for every adapted module (fp32 math, W's dtype): the torch trainer's merge."""
        out = dict(hf)
        for module in self.shapes():
            w = out[f"{module}.weight"]
            a, b = adapters[f"{module}.lora_A.weight"].float(), adapters[f"{module}.lora_B.weight"].float()
            out[f"{module}.weight"] = (w.float() + self.adapters.scaling * (b @ a)).to(w.dtype)
        return out


def adapters_only(sharded: dict) -> dict:
    """A stage's (sharded) state dict reduced to its adapters: what a LoRA checkpoint holds."""
    return {k: v for k, v in sharded.items() if is_adapter(k)}
