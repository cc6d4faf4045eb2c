"""How a model's parameters get updated: plain torch, or DeepSpeed ZeRO-2/3 (CPU or CUDA).

Both take a scalar loss per step. DeepSpeed averages gradients across ranks; with Dr.GRPO each rank's
loss is normalised by its own sequences x L_max, so the average equals the loss of the whole batch.
On CPU, DeepSpeed runs with DS_ACCELERATOR=cpu and the gloo backend (no oneCCL needed).

Both also save and restore what an exact resume needs, in the no-pickle format of checkpoint.py:
full weights (written by rank 0) and optimizer state (one file set per rank, since under ZeRO each rank
holds only its partition of the optimizer state).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from protege.rl.checkpoint import optimizer_from_files, optimizer_to_files


def world() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) when not launched distributed."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized() and world()[1] > 1:
        torch.distributed.barrier()


def move_optimizer_state(opt: torch.optim.Optimizer, device: torch.device) -> None:
    """Moves moment buffers along with an offloaded model; AdamW keeps its `step` counter on the CPU."""
    for state in opt.state.values():
        for k, v in state.items():
            if torch.is_tensor(v) and k != "step":
                state[k] = v.to(device)


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

    def to(self, device: torch.device) -> None:
        self.model.to(device)
        move_optimizer_state(self.optimizer, device)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def save_optimizer(self, folder: Path, name: str, rank: int) -> None:
        optimizer_to_files(self.optimizer, folder, name)

    def load_optimizer(self, folder: Path, name: str, rank: int) -> None:
        optimizer_from_files(self.optimizer, folder, name)


class DeepSpeedUpdater:
    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], lr: float, zero_stage: int,
                 clip: float = 1.0, device: torch.device | None = None):
        accel = "cuda" if (device.type == "cuda" if device is not None else torch.cuda.is_available()) else "cpu"
        os.environ.setdefault("DS_ACCELERATOR", accel)
        try:
            import deepspeed
        except ImportError as exc:
            raise RuntimeError("rl.backend 'deepspeed' needs DeepSpeed: pip install deepspeed") from exc
        if not torch.distributed.is_initialized():
            for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                               ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29511")):
                os.environ.setdefault(key, value)
            deepspeed.init_distributed(dist_backend="nccl" if accel == "cuda" else "gloo")
        self.zero_stage = zero_stage
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "gradient_clipping": clip, "zero_optimization": {"stage": zero_stage},
                  "bf16": {"enabled": False}, "fp16": {"enabled": False}, "steps_per_print": 1 << 30}
        # ZeRO swaps this optimizer's param groups for its flat fp32 partitions; its state is then this
        # rank's partition of the moments, which is exactly what a resume has to bring back
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=self.optimizer, config=config,
                                                    model_parameters=params)
        self.model = self.engine.module

    def step(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)
        self.engine.step()

    def gathered(self, modifier_rank: int | None = None):
        """ZeRO-3 partitions weights across ranks: generation and saving need them whole for a while."""
        if self.zero_stage < 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(list(self.model.parameters()), modifier_rank=modifier_rank)

    def to(self, device: torch.device) -> None:
        """No-op: the engine owns the placement of its flat buffers, so a DeepSpeed model is never offloaded."""

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        with self.gathered():  # collective under ZeRO-3: every rank calls this
            return {k: v.detach().cpu().clone().contiguous() for k, v in self.model.state_dict().items()}

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        # ZeRO-3: every rank loads the same file; on leaving the context rank 0's values are re-partitioned
        with self.gathered(modifier_rank=0), torch.no_grad():
            self.model.load_state_dict(state)
        # the fp32 master partitions the optimizer steps on are separate copies of the weights; training
        # is fp32 here, so refreshing them from the loaded weights is exact
        self.engine.optimizer.refresh_fp32_params()

    def save_optimizer(self, folder: Path, name: str, rank: int) -> None:
        optimizer_to_files(self.optimizer, folder, f"{name}-rank{rank}")

    def load_optimizer(self, folder: Path, name: str, rank: int) -> None:
        optimizer_from_files(self.optimizer, folder, f"{name}-rank{rank}")


def make_updater(backend: str, model, params, lr: float, zero_stage: int, device: torch.device | None = None):
    if backend == "torch":
        return TorchUpdater(model, params, lr)
    if backend == "deepspeed":
        return DeepSpeedUpdater(model, params, lr, zero_stage, device=device)
    raise ValueError(f"unknown rl.backend {backend!r}; expected 'torch' or 'deepspeed'")
