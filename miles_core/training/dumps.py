"""The trainer's tensor dumps (dumper_enable, dumper_fwd_only, dumper_fwd_bwd): SGLang's dumper layout
(miles_core/rollout/dumper.py) around the RL step's passes, as the reference's DumperMegatronUtil
(miles/utils/dumper_utils.py) does around its forward_only and train.

One phase scope per pass, on the module the engine names for the role (``TrainEngine.dump_module``):

    fwd_only/<prefix>rollout_<id>/   a forward-only pass: prefix "" (old policy), "ref_", "teacher_", "critic_" (values)
    fwd_bwd/<prefix>rollout_<id>/    an optimizer step's forward + backward: "" (actor), "critic_"

On entry: the dumper reset to the phase's options (dir cfg.dumper_root, exp_name as above, the phase's key=value
pairs), the phase dir wiped at its first use in this process and the exp dir before every scope (a later step of
the same rollout replaces the earlier one's, as the reference's), the non-intrusive hooks on the module, and a
step per micro-batch: step 0 is the first micro-batch's forward, step k the (k+1)-th (a pre-hook on the model and on
its ``base_model``, counted once when nested). On exit, with the hooks removed: the parameters (enable_model_value)
and, in fwd_bwd, their gradients before clipping (enable_model_grad; ``.grad``, else Megatron's ``main_grad``) at
step 0, as the reference's finalize. Only the rank the engine names writes (data-parallel rank 0).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from miles_core.rollout.dumper import Dumper, phase_options, remove_dir

from .source_patch import SourcePatches


class TrainDumps:
    """The dumps of one trainer process: ``rank`` / ``world_size`` / ``parallel_info`` name and tag its files."""

    def __init__(self, cfg, rank: int = 0, world_size: int = 1, parallel_info: dict | None = None):
        self.cfg = cfg
        self.dumper = Dumper(rank=rank, world_size=world_size, parallel_info=parallel_info)
        self._wiped: set[str] = set()
        patch_file = cfg.misc.dumper_source_patcher_config_train  # the functions it edits dump into this dumper
        self.patches = SourcePatches(patch_file, self.dumper) if patch_file else None

    @contextlib.contextmanager
    def phase(self, phase: str, module: torch.nn.Module | None, rollout_id: int, prefix: str = ""):
        """The dumps of one pass of ``module`` (None: nothing, e.g. a rank that writes no dumps) as described above."""
        options = None if module is None else phase_options(self.cfg, phase, f"{phase}/{prefix}rollout_{rollout_id}")
        if options is None:
            yield
            return
        d = self.dumper
        d.reset()
        d.options = options
        root = Path(options.dir)
        if phase not in self._wiped:  # the reference wipes the phase dir at rollout 0; here once per process
            remove_dir(root / phase)
            self._wiped.add(phase)
        remove_dir(root / options.exp_name)
        ticks = _MicroBatches(d, module)
        d.hook(module)
        try:
            yield
        finally:
            ticks.remove()
            d.reset()  # parameters and gradients: once per pass, at step 0
            d.configure(cleanup_previous=False)
            d.dump_model(module, get_grad=_grad if phase == "fwd_bwd" else _no_grad)
            d.configure(enable=False)


def _grad(param: torch.Tensor) -> torch.Tensor | None:
    return param.grad if param.grad is not None else getattr(param, "main_grad", None)


def _no_grad(param: torch.Tensor) -> None:
    """A forward-only pass computes no gradient: what .grad holds is the previous step's."""
    return None


class _MicroBatches:
    """dumper.step() before each micro-batch's forward but the first: a forward pre-hook on the model and its
    ``base_model`` (the torch engine's packed rows call the base model and the LM head themselves), counted once
    when one runs inside the other."""

    def __init__(self, dumper: Dumper, module: torch.nn.Module):
        self.dumper, self.first, self.depth = dumper, True, 0
        inner = getattr(module, "base_model", None)
        targets = [module] + ([inner] if isinstance(inner, torch.nn.Module) and inner is not module else [])
        self.handles = [h for m in targets for h in (m.register_forward_pre_hook(self._enter),
                                                     m.register_forward_hook(self._leave, always_call=True))]

    def _enter(self, *_):
        if self.depth == 0:
            if not self.first:
                self.dumper.step()
            self.first = False
        self.depth += 1

    def _leave(self, *_):
        self.depth -= 1

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
