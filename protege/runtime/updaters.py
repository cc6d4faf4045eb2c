"""How a model's parameters get updated: plain torch, or DeepSpeed ZeRO-2/3 (CPU or CUDA).

One update is any number of `backward(loss)` calls (micro-batches; their gradients add up) and one `step()`
(clip, optimizer step, LR schedule, gradients cleared); `update(loss)` is both for one micro-batch.
DeepSpeed averages gradients across ranks, so each rank's loss must be its share of the global batch's
loss (see distributed.global_mean_share; Dr.GRPO's per-rank normalisation is already such a share).
On CPU, DeepSpeed runs with DS_ACCELERATOR=cpu and the gloo backend (no oneCCL needed).

An optional `lr_lambda` (factor on lr per step, as torch's LambdaLR) makes the LR schedule part of the
updater, so that it is saved and restored with the optimizer (state.OptimizerState).
"""
from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable

import torch

from protege.errors import UserFacingError
from protege.runtime.distributed import world


def move_optimizer_state(opt: torch.optim.Optimizer, device: torch.device) -> None:
    """Moves moment buffers along with an offloaded model; AdamW keeps its `step` counter on the CPU."""
    for state in opt.state.values():
        for k, v in state.items():
            if torch.is_tensor(v) and k != "step":
                state[k] = v.to(device)


def _schedule(optimizer: torch.optim.Optimizer, lr_lambda: Callable[[int], float] | None):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda) if lr_lambda is not None else None


class TorchUpdater:
    partitioned = False  # one process holds the whole optimizer state

    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], lr: float, clip: float = 1.0,
                 weight_decay: float = 0.0, lr_lambda: Callable[[int], float] | None = None):
        self.model, self.params, self.clip = model, params, clip
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        self.scheduler = _schedule(self.optimizer, lr_lambda)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> float:
        """Applies the gradients of the backward calls since the last step; returns their norm before clipping."""
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.clip) if self.clip else torch.tensor(float("nan"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.scheduler is not None:
            self.scheduler.step()
        return float(norm)

    def update(self, loss: torch.Tensor) -> float:
        self.backward(loss)
        return self.step()

    def gathered(self, modifier_rank: int | None = None):
        return contextlib.nullcontext()

    def to(self, device: torch.device) -> None:
        self.model.to(device)
        move_optimizer_state(self.optimizer, device)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items()}

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


class DeepSpeedUpdater:
    partitioned = True  # under ZeRO each rank holds only its partition of the optimizer state

    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], lr: float, zero_stage: int,
                 clip: float = 1.0, device: torch.device | None = None, weight_decay: float = 0.0,
                 lr_lambda: Callable[[int], float] | None = None, key: str = "backend"):
        accel = "cuda" if (device.type == "cuda" if device is not None else torch.cuda.is_available()) else "cpu"
        os.environ.setdefault("DS_ACCELERATOR", accel)
        try:
            import deepspeed
        except ImportError as exc:
            raise UserFacingError(f"{key} 'deepspeed' needs DeepSpeed: pip install deepspeed") from exc
        if not torch.distributed.is_initialized():
            # a process no launcher started is rank 0 of 1: its group needs only a port nobody else holds (a
            # fixed one would collide with another such run on the machine)
            alone = "RANK" not in os.environ and "MASTER_PORT" not in os.environ
            for k, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                             ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", _free_port() if alone else "29511")):
                os.environ.setdefault(k, value)
            deepspeed.init_distributed(dist_backend="nccl" if accel == "cuda" else "gloo")
        self.zero_stage = zero_stage
        # managed_gradient_accumulation off: DeepSpeed's own count of micro-batches per step would fix their
        # number in the config; here each step() applies whatever backward() calls came before it
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "managed_gradient_accumulation": False,
                  "gradient_clipping": clip, "zero_optimization": {"stage": zero_stage},
                  "bf16": {"enabled": False}, "fp16": {"enabled": False}, "steps_per_print": 1 << 30}
        # ZeRO swaps this optimizer's param groups for its flat fp32 partitions (the group dicts stay, so the
        # LR schedule below still sets their lr); its state is then this rank's partition of the moments,
        # which is exactly what a resume has to bring back
        self.optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=self.optimizer, config=config,
                                                    model_parameters=params)
        self.scheduler = _schedule(self.optimizer, lr_lambda)  # stepped here, not by the engine
        self.model = self.engine.module

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the caller's loss is already the right share

    def step(self) -> float:
        self.engine.step()
        if self.scheduler is not None:
            self.scheduler.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def update(self, loss: torch.Tensor) -> float:
        self.backward(loss)
        return self.step()

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


def make_updater(backend: str, model, params, lr: float, zero_stage: int, device: torch.device | None = None, *,
                 key: str = "rl.backend", weight_decay: float = 0.0, clip: float = 1.0,
                 lr_lambda: Callable[[int], float] | None = None):
    """`key` names the config setting (e.g. "sft.backend") in errors."""
    if backend == "torch":
        if world()[1] > 1:  # each process would train alone on its slice of every batch
            raise UserFacingError(f"{key} 'torch' trains in one process, but this one was launched as one of "
                                  f"{world()[1]} (WORLD_SIZE); set {key}: deepspeed for a multi-process run")
        return TorchUpdater(model, params, lr, clip=clip, weight_decay=weight_decay, lr_lambda=lr_lambda)
    if backend == "deepspeed":
        return DeepSpeedUpdater(model, params, lr, zero_stage, clip=clip, device=device, weight_decay=weight_decay,
                                lr_lambda=lr_lambda, key=key)
    raise UserFacingError(f"{key} is {backend!r}; expected 'torch' or 'deepspeed'")
