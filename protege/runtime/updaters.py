"""How a model's parameters get updated: plain torch, or DeepSpeed ZeRO-2/3 (CPU or CUDA).

One update is any number of `backward(loss)` calls (micro-batches; their gradients add up) and one `step()`
(clip, optimizer step, LR schedule, gradients cleared); `update(loss)` is both for one micro-batch.
DeepSpeed averages gradients across ranks, so each rank's loss must be its share of the global batch's
loss (see distributed.global_mean_share; Dr.GRPO's per-rank normalisation is already such a share).
On CPU, DeepSpeed runs with DS_ACCELERATOR=cpu and the gloo backend (no oneCCL needed).

An optional `lr_lambda` (factor on lr per step, as torch's LambdaLR) makes the LR schedule part of the
updater, so that it is saved and restored with the optimizer (state.OptimizerState).

bf16 weights (`model.dtype: bfloat16`) are trained through fp32 master weights under both backends: AdamW
steps fp32 copies and the model gets them back rounded to bf16, so an update smaller than bf16's half-ulp
(most updates at lr 1e-5: bf16 keeps 8 significant bits) adds up in the master instead of vanishing.
TorchUpdater keeps a master copy of each trainable parameter that is not fp32 (an fp32 parameter beside it,
a LoRA adapter or a value head, is stepped in place); each `backward` moves the new bf16 gradients onto the
masters, where micro-batches add up in fp32. The forward is untouched: the model still holds bf16 weights and
computes under precision.py's autocast, so its memory for weights and activations stays bf16's; the cost is
4 bytes per trainable bf16 parameter for the master, and its gradient held in fp32. Keeping the trainable parameters
themselves in fp32 and computing in bf16 through autocast alone was not chosen: where the device has no
native bf16 the forward runs without autocast and would then compute in fp32, and the model would no longer
hold the bf16 weights the rest of the project (generation, scoring, saving) reads.
Under DeepSpeed the ZeRO optimizer already steps fp32 partitions of bf16 weights (master_weights_and_grads
dtype float32) with gradients accumulated and reduced in fp32 while the config leaves bf16 off; turning it on
would make DeepSpeed cast every parameter, fp32 adapters and heads included, to bf16, so it stays off.
Either way the masters are optimizer state: `master_weights()` gives them to state.OptimizerState, which saves
and restores them, since re-deriving them from the bf16 weights would lose what the rounding dropped.
"""
from __future__ import annotations

import contextlib
import os
import socket
import sys
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


def _low_precision(p: torch.Tensor) -> bool:
    return p.dtype in (torch.bfloat16, torch.float16)


class TorchUpdater:
    partitioned = False  # one process holds the whole optimizer state

    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], lr: float, clip: float = 1.0,
                 weight_decay: float = 0.0, lr_lambda: Callable[[int], float] | None = None):
        self.model, self.params, self.clip = model, params, clip
        # what AdamW steps, one per parameter: an fp32 copy of a bf16 parameter, an fp32 parameter itself
        self.masters = [p.detach().float().requires_grad_(True) if _low_precision(p) else p for p in params]
        self._copies = [(p, m) for p, m in zip(params, self.masters) if m is not p]
        self.optimizer = torch.optim.AdamW(self.masters, lr=lr, weight_decay=weight_decay)
        self.scheduler = _schedule(self.optimizer, lr_lambda)

    def _gradients_to_masters(self) -> None:
        """Adds each bf16 gradient the backward left on the model to its master's fp32 gradient."""
        for p, m in self._copies:
            if p.grad is not None:
                g = p.grad.float()
                m.grad = g if m.grad is None else m.grad.add_(g)
                p.grad = None

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
        self._gradients_to_masters()  # micro-batches add up in fp32, not in bf16

    def step(self) -> float:
        """Applies the gradients of the backward calls since the last step; returns their norm before clipping."""
        self._gradients_to_masters()
        norm = torch.nn.utils.clip_grad_norm_(self.masters, self.clip) if self.clip else torch.tensor(float("nan"))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._masters_to_model()
        if self.scheduler is not None:
            self.scheduler.step()
        return float(norm)

    @torch.no_grad()
    def _masters_to_model(self) -> None:
        for p, m in self._copies:
            p.copy_(m)  # rounded to the parameter's dtype; the master keeps what the rounding drops

    def update(self, loss: torch.Tensor) -> float:
        self.backward(loss)
        return self.step()

    def master_weights(self) -> list[torch.Tensor]:
        """The fp32 copies AdamW steps in place of bf16 parameters (none for an fp32 model): optimizer state
        that the bf16 weights do not determine, so a resume needs them saved (state.OptimizerState)."""
        return [m for _, m in self._copies]

    def gathered(self, modifier_rank: int | None = None):
        return contextlib.nullcontext()

    def weights_of(self, module: torch.nn.Module):
        """A module trained beside the model, as state.Weights reads and loads it: itself (one process holds it
        whole, and AdamW steps an fp32 parameter in place)."""
        return module

    def optimizer_view(self):
        """The optimizer, for saving and loading its state (see DeepSpeedUpdater.optimizer_view)."""
        return contextlib.nullcontext(self.optimizer)

    def to(self, device: torch.device) -> None:
        self.model.to(device)
        for _, m in self._copies:  # .data: the optimizer keys its state by these very tensors
            m.data = m.data.to(device)
            if m.grad is not None:
                m.grad = m.grad.to(device)
        move_optimizer_state(self.optimizer, device)

    def full_state_dict(self, skip: set[str] = frozenset()) -> dict[str, torch.Tensor]:
        """The model's tensors on the CPU, except those named in `skip` (frozen ones: never copied)."""
        return {k: v.detach().cpu().contiguous() for k, v in self.model.state_dict().items() if k not in skip}

    @torch.no_grad()
    def load_weights(self, state: dict[str, torch.Tensor], keep: set[str] = frozenset()) -> None:
        """`state` may leave out the parameters in `keep` (frozen: they stay as loaded from the checkpoint)."""
        from protege.runtime.state import check_loaded

        check_loaded(self.model.load_state_dict(state, strict=False), keep)
        # masters from the loaded weights; a resume then restores the saved masters (state.OptimizerState)
        for p, m in self._copies:
            m.copy_(p)


class _Beside(torch.nn.Module):
    """The model and the modules trained beside it (PPO's value head), as the one module a DeepSpeed engine
    holds: ZeRO then partitions, reduces and clips all of them together. Never called itself: the loops call
    the model and the modules directly, as they do without it."""

    def __init__(self, model: torch.nn.Module, beside: dict[str, torch.nn.Module]):
        super().__init__()
        self.model = model
        self.beside = torch.nn.ModuleDict(beside)

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)


class BesideWeights:
    """One module trained beside the model in a DeepSpeed engine, as a weights source for state.Weights: read
    whole (gathered under ZeRO-3) and loaded so that the engine's fp32 partitions follow the loaded weights."""

    def __init__(self, updater: "DeepSpeedUpdater", module: torch.nn.Module):
        self.updater, self.model, self.zero_stage = updater, module, updater.zero_stage

    def full_state_dict(self, skip: set[str] = frozenset()) -> dict[str, torch.Tensor]:
        with self.updater.gathered():  # collective under ZeRO-3: every rank calls this
            return {k: v.detach().cpu().clone().contiguous() for k, v in self.model.state_dict().items()
                    if k not in skip}

    def load_weights(self, state: dict[str, torch.Tensor], keep: set[str] = frozenset()) -> None:
        from protege.runtime.state import check_loaded

        with self.updater.gathered(modifier_rank=0), torch.no_grad():
            check_loaded(self.model.load_state_dict(state, strict=False), keep)
        # restore_state loads these weights before the optimizer part, which then brings back saved fp32
        # masters of bf16 weights: this refresh is exact for fp32 weights and overwritten for bf16 ones
        self.updater.engine.optimizer.refresh_fp32_params()


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


class DeepSpeedUpdater:
    partitioned = True  # under ZeRO each rank holds only its partition of the optimizer state

    def __init__(self, model: torch.nn.Module, params: list[torch.nn.Parameter], lr: float, zero_stage: int,
                 clip: float = 1.0, device: torch.device | None = None, weight_decay: float = 0.0,
                 lr_lambda: Callable[[int], float] | None = None, key: str = "backend",
                 beside: dict[str, torch.nn.Module] | None = None):
        """`beside`: modules outside `model` whose parameters are among `params` (PPO's value head), by name.
        They join the engine with the model (one module, see _Beside) rather than getting an optimizer of their
        own whose gradients would be averaged by hand: one optimizer, one LR schedule and one gradient-norm clip
        over the model and the head together, as TorchUpdater clips them (RL4VLM's max_grad_norm is over both),
        ZeRO-2 and ZeRO-3 partition, reduce and save the head's moments like any weight's, and ZeRO-3 gathers
        the head for its forward through the hooks it puts on every module of the engine."""
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in params})
        if zero_stage == 3 and len(dtypes) > 1:  # ZeRO-3 flattens every trained partition into one buffer
            stage_key = key.rsplit(".", 1)[0] + ".zero_stage" if "." in key else "zero_stage"
            raise UserFacingError(f"{key} 'deepspeed' at ZeRO-3 trains parameters of one dtype, but these are "
                                  f"{' and '.join(dtypes)} (on a bf16 backbone the discriminator's head and PPO's "
                                  f"value head stay float32); set {stage_key}: 2, or model.dtype: float32")
        accel = "cuda" if (device.type == "cuda" if device is not None else torch.cuda.is_available()) else "cpu"
        os.environ.setdefault("DS_ACCELERATOR", accel)
        try:
            import deepspeed
        except ImportError as exc:
            raise UserFacingError(f"{key} 'deepspeed' needs DeepSpeed: pip install deepspeed") from exc
        if accel == "cuda":  # NCCL stages on the current device: this rank's GPU, before any collective
            from protege.runtime.placement import bind_gpu

            bind_gpu()
        if not torch.distributed.is_initialized():
            # a process no launcher started is rank 0 of 1: its group needs only a port nobody else holds (a
            # fixed one would collide with another such run on the machine)
            alone = "RANK" not in os.environ and "MASTER_PORT" not in os.environ
            for k, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0"),
                             ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", _free_port() if alone else "29511")):
                os.environ.setdefault(k, value)
            deepspeed.init_distributed(dist_backend="nccl" if accel == "cuda" else "gloo")
        self.zero_stage, self.params = zero_stage, params
        # managed_gradient_accumulation off: DeepSpeed's own count of micro-batches per step would fix their
        # number in the config; here each step() applies whatever backward() calls came before it
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "managed_gradient_accumulation": False,
                  "gradient_clipping": clip, "zero_optimization": {"stage": zero_stage},
                  # bf16 off even for bf16 weights: ZeRO steps fp32 partitions of them all the same, with fp32
                  # gradients, while bf16 on would cast the fp32 parameters (adapters, heads) to bf16 too
                  "bf16": {"enabled": False}, "fp16": {"enabled": False}, "steps_per_print": 1 << 30}
        # ZeRO swaps this optimizer's param groups for its flat fp32 partitions (the group dicts stay, so the
        # LR schedule below still sets their lr); its state is then this rank's partition of the moments,
        # which is exactly what a resume has to bring back
        # one param group per dtype: ZeRO flattens each group into one buffer, whose dtype would otherwise be
        # forced on all of it (a bf16 backbone beside its fp32 head would turn fp32)
        by_dtype: dict[torch.dtype, list[torch.nn.Parameter]] = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        self.optimizer = torch.optim.AdamW([{"params": group} for group in by_dtype.values()], lr=lr,
                                           weight_decay=weight_decay)
        self.beside = dict(beside or {})
        held = _Beside(model, self.beside) if self.beside else model
        self.engine, _, _, _ = deepspeed.initialize(model=held, optimizer=self.optimizer, config=config,
                                                    model_parameters=params)
        self.scheduler = _schedule(self.optimizer, lr_lambda)  # stepped here, not by the engine
        self.model = self.engine.module.model if self.beside else self.engine.module
        if self.beside and zero_stage == 3:
            self._trace_from(model)

    def _trace_from(self, model: torch.nn.Module) -> None:
        """ZeRO-3 starts each pass of its parameter trace (what it records and prefetches) at a forward of the
        engine's module, which _Beside never runs: the model's own forwards (every pass starts there, the
        head reads its hidden states) start it instead, as they did with the model alone in the engine."""
        coordinator = self.engine.optimizer.parameter_offload.get_param_coordinator

        def start_of_forward(module, *args):
            coordinator().reset_step()

        model.register_forward_pre_hook(start_of_forward, prepend=True)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)  # the caller's loss is already the right share

    def step(self) -> float:
        self.engine.step()
        if self.zero_stage == 3:
            # ZeRO-3 keeps each parameter's reduced gradient partition from one step to the next and overwrites
            # (or adds to) it only when a backward reaches the parameter: one that no backward of an update reached
            # (the policy in the later epochs of PPO's value warm-up, after the SFT guidance's loss in the first)
            # would be stepped again on an earlier update's gradient. Cleared, it is stepped on zero, as ZeRO-2
            # steps it.
            buffer = getattr(self.engine.optimizer, "grad_partitions_flat_buffer", None)
            if buffer is not None:
                buffer.zero_()
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

        # the engine's whole module: the model and what trains beside it
        return deepspeed.zero.GatheredParameters(list(self.engine.module.parameters()), modifier_rank=modifier_rank)

    @contextlib.contextmanager
    def optimizer_view(self):
        """The optimizer with its param groups holding the fp32 partitions it steps, for saving and loading its
        state (torch keys the moments by them): ZeRO-3 puts them there only for the length of its step."""
        zero = self.engine.optimizer
        if self.zero_stage < 3:
            yield self.optimizer
            return
        zero._set_fp32_optimizer_param_groups()
        try:
            yield self.optimizer
        finally:
            zero._clear_fp32_optimizer_param_groups()

    def to(self, device: torch.device) -> None:
        """No-op: the engine owns the placement of its flat buffers, so a DeepSpeed model is never offloaded."""

    def full_state_dict(self, skip: set[str] = frozenset()) -> dict[str, torch.Tensor]:
        with self.gathered():  # collective under ZeRO-3: every rank calls this
            return {k: v.detach().cpu().clone().contiguous() for k, v in self.model.state_dict().items()
                    if k not in skip}

    def load_weights(self, state: dict[str, torch.Tensor], keep: set[str] = frozenset()) -> None:
        from protege.runtime.state import check_loaded

        # ZeRO-3: every rank loads the same file; on leaving the context rank 0's values are re-partitioned
        with self.gathered(modifier_rank=0), torch.no_grad():
            check_loaded(self.model.load_state_dict(state, strict=False), keep)
        # the fp32 master partitions the optimizer steps on are separate copies of the weights: refreshed from
        # fp32 weights they are exact; from bf16 ones they are rounded, and a resume then restores the saved
        # partitions (master_weights, state.OptimizerState)
        self.engine.optimizer.refresh_fp32_params()

    def weights_of(self, module: torch.nn.Module):
        """A module trained beside the model, as state.Weights reads and loads it (see BesideWeights)."""
        return BesideWeights(self, module) if any(m is module for m in self.beside.values()) else module

    def master_weights(self) -> list[torch.Tensor]:
        """This rank's fp32 partitions that ZeRO steps in place of bf16 weights (none when the weights are
        fp32: the partitions are then exact copies of them)."""
        if not any(_low_precision(p) for p in self.params):
            return []
        zero = self.engine.optimizer
        return list(zero.single_partition_of_fp32_groups if self.zero_stage < 3 else zero.fp32_partitioned_groups_flat)


def zero3_lora_warning(model, zero_stage: int, key: str) -> str | None:
    """Why ZeRO-3 is the wrong stage for a LoRA model, or None. ZeRO-3 partitions every parameter, the frozen base
    included: each forward gathers the base's layers again, and the LM head again for every log-prob chunk, while
    what trains (the adapters and their optimizer state) is small enough for ZeRO-2 to keep whole on each rank."""
    from protege.models.lora import is_lora

    if zero_stage != 3 or not is_lora(model):
        return None
    zero_key = key.rsplit(".", 1)[0] + ".zero_stage"
    return (f"{zero_key} is 3 with LoRA adapters: ZeRO-3 partitions the frozen base too, so every forward gathers it "
            f"again (and the LM head for each log-prob chunk); the adapters and their optimizer state are small, and "
            f"ZeRO-2 keeps the base whole on each rank without these gathers. Set {zero_key}: 2 unless the base "
            f"alone does not fit on one device")


def make_updater(backend: str, model, params, lr: float, zero_stage: int, device: torch.device | None = None, *,
                 key: str = "rl.backend", weight_decay: float = 0.0, clip: float = 1.0,
                 lr_lambda: Callable[[int], float] | None = None, beside: dict[str, torch.nn.Module] | None = None):
    """`key` names the config setting (e.g. "sft.backend") in errors; `beside`: the modules outside `model` whose
    parameters are among `params` (PPO's value head), trained with it by the same optimizer."""
    if backend == "torch":
        if world()[1] > 1:  # each process would train alone on its slice of every batch
            raise UserFacingError(f"{key} 'torch' trains in one process, but this one was launched as one of "
                                  f"{world()[1]} (WORLD_SIZE); set {key}: deepspeed for a multi-process run")
        return TorchUpdater(model, params, lr, clip=clip, weight_decay=weight_decay, lr_lambda=lr_lambda)
    if backend == "deepspeed":
        warning = zero3_lora_warning(model, zero_stage, key)
        if warning and world()[0] == 0:
            print(f"warning: {warning}", file=sys.stderr, flush=True)
        return DeepSpeedUpdater(model, params, lr, zero_stage, clip=clip, device=device, weight_decay=weight_decay,
                                lr_lambda=lr_lambda, key=key, beside=beside)
    raise UserFacingError(f"{key} is {backend!r}; expected 'torch' or 'deepspeed'")


def even_forwards(updater) -> bool:
    """Whether every rank must run as many forwards (and backwards): ZeRO-3 over several ranks gathers each
    layer's weights in every forward, and ZeRO-2 (as ZeRO-3) reduces the gradients of every backward when it
    ends, whatever `managed_gradient_accumulation` (DeepSpeed's allreduce_gradients: stage >= 2 communicates
    between boundaries too). Both are collectives, so a rank with one more waits for the others forever, or
    pairs its reduce with another rank's other collective."""
    from protege.runtime.distributed import world

    return getattr(updater, "zero_stage", 0) in (2, 3) and world()[1] > 1
