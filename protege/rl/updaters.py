"""How a model's parameters get updated: plain torch, or DeepSpeed ZeRO-2/3 (CPU or CUDA).

Both take a scalar loss per step. DeepSpeed averages gradients across ranks; with Dr.GRPO each rank's
loss is normalised by its own sequences x L_max, so the average equals the loss of the whole batch.
On CPU, DeepSpeed runs with DS_ACCELERATOR=cpu and the gloo backend (no oneCCL needed).
"""
from __future__ import annotations

import contextlib
import os

import torch


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) when not launched distributed."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class TorchUpdater:
    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], lr: float, clip: float = 1.0):
        self.model, self.params, self.clip = model, params, clip
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    def step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.optimizer.step()

    def gathered(self):
        return contextlib.nullcontext()


class DeepSpeedUpdater:
    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], lr: float, zero_stage: int,
                 clip: float = 1.0):
        os.environ.setdefault("DS_ACCELERATOR", "cpu" if not torch.cuda.is_available() else "cuda")
        try:
            import deepspeed
        except ImportError as exc:
            raise RuntimeError("rl.backend 'deepspeed' needs DeepSpeed: pip install deepspeed") from exc
        if not torch.distributed.is_initialized():
            for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                               ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")):
                os.environ.setdefault(key, value)
            deepspeed.init_distributed(dist_backend="nccl" if torch.cuda.is_available() else "gloo")
        self.zero_stage = zero_stage
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "gradient_clipping": clip, "zero_optimization": {"stage": zero_stage},
                  "bf16": {"enabled": False}, "fp16": {"enabled": False}, "steps_per_print": 1 << 30}
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=self.optimizer, config=config,
                                                    model_parameters=params)
        self.model = self.engine.module

    def step(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)
        self.engine.step()

    def gathered(self):
        """ZeRO-3 partitions weights across ranks: generation needs them whole for a while."""
        if self.zero_stage < 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.model.parameters()))


def make_updater(backend: str, model, params, lr: float, zero_stage: int):
    if backend == "torch":
        return TorchUpdater(model, params, lr)
    if backend == "deepspeed":
        return DeepSpeedUpdater(model, params, lr, zero_stage)
    raise ValueError(f"unknown rl.backend {backend!r}; expected 'torch' or 'deepspeed'")
