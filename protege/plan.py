"""The memory plan: what each training stage holds on one rank's device, estimated from the configured model's
config (parameters counted on the meta device, vocabulary, layers, hidden size, KV heads) and the stage's
settings (dtype, full / LoRA / a parameter group, torch or DeepSpeed ZeRO, processes, micro-batch budget,
gradient checkpointing, sequence lengths, generation by transformers or vLLM).

Within an update, "activations" are what the forward keeps for the backward and "backward" what the backward
adds at its peak: the LM head's chunk of float32 logits, or later one layer recomputed (or the gradients of its
activations), whichever is larger. Host memory and local disk per rank and node (`host_plan`) and the
Kubernetes job variables they call for (`job_variables`) come from the same shapes; `device_type` cpu plans
a CPU process's resident memory instead (the runtime's baseline added, no vLLM).

A stage's steps pass through phases that do not overlap (sampling, the reference's pass, the discriminator's
update, the policy's update); the stage's peak is the largest phase. `protege plan` prints the table; a stage
on a GPU checks its own plan before any compute and refuses, naming the setting to change, what cannot fit.

Activations come from the family's own decoder layer traced on the meta device for what trains
(protege.models.activations; benchmarks/plan_calibration.py measures them against the CPU allocator for three
families at their released widths). The vision tower's activations are left out; the GPU check
(benchmarks/gpu_check.sh) prints measured peaks beside the plan.
"""
from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from protege.config import Config, discriminator_trainable
from protege.errors import UserFacingError
from protege.models.logprobs import LOGIT_CHUNK_BYTES
from protege.models.activations import ActivationProfile, LoraSpec, activation_profile, in_layer_name
from protege.runtime.micro import ACTIVATION_SHARE_GPU, fallback_profile, text_shape

GiB = 1 << 30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
ADAM_DEEPSPEED = 12  # bytes per trainable parameter: fp32 master partition + two fp32 moments

PARTS = ("weights", "gradients", "optimizer", "activations", "backward", "logits", "kv_cache", "reference",
         "discriminator", "vllm", "checkpoint", "runtime")
# a CPU stage's process before any model: Python, torch, transformers, protege's stage imports, the allocator's
# arenas (measured RSS 0.45-0.7 GiB; tests/stages/test_cpu_plan.py checks the whole prediction)
RUNTIME_BASELINE_CPU = 700 << 20


@dataclass
class ModelShape:
    params: int                  # every parameter
    head: int                    # the LM head's (the discriminator replaces it with a d -> 1 head)
    groups: dict[str, int]       # trainable group -> parameters it trains (all, attention, ..., lora)
    vocab: int
    hidden: int
    layers: int
    kv_bytes_per_token: int      # one token's keys and values over all layers, per byte of dtype
    config: object
    layer_groups: dict[str, frozenset[str]] = field(default_factory=dict)  # group -> in-layer names it trains
    lora_modules: tuple[str, ...] = ()  # in-layer module names model.lora.target_modules picks


@dataclass
class StagePlan:
    stage: str
    parts: dict[str, int]                     # component -> bytes per rank at the stage's peak phase
    phase: str                                # which phase is the peak
    hints: dict[str, str] = field(default_factory=dict)  # component -> the setting that shrinks it

    @property
    def peak(self) -> int:
        return sum(self.parts.values())

    def refusal(self, device_bytes: int) -> str:
        big = max(self.parts, key=self.parts.get)
        return (f"{self.stage}: needs about {self.peak / GiB:.1f} GiB per rank ({self.phase}), the device has "
                f"{device_bytes / GiB:.1f} GiB; the largest part is {big} ({self.parts[big] / GiB:.1f} GiB): "
                f"{self.hints.get(big, 'reduce it')} (see `protege plan`)")


def _meta_model(config, trust_remote_code: bool):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    with torch.device("meta"):
        try:
            return AutoModelForImageTextToText.from_config(config, trust_remote_code=trust_remote_code)
        except ValueError:  # a text-only family
            return AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)


def model_shape(cfg: Config, root: Path, model_dir: Path | None = None) -> ModelShape:
    """The student's shape: model.path's config.json (the weights are not read), or the embedded student's
    folder models/base once the world stage wrote it."""
    from transformers import AutoConfig

    from protege.models.lora import lora_targets
    from protege.rl.trainable import GROUPS

    folder = model_dir or (Path(cfg.model.path) if cfg.model.path else root / "models" / "base")
    if not folder.is_absolute():
        folder = root / folder
    if not (folder / "config.json").exists():
        raise UserFacingError(f"{folder}: no config.json to plan from; set model.path (a folder with at least the "
                              "model's config.json) or run the world stage, which writes models/base")
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=cfg.model.trust_remote_code)
    model = _meta_model(config, cfg.model.trust_remote_code)
    named = dict(model.named_parameters())
    groups = {g: sum(p.numel() for n, p in named.items() if pick(n)) for g, pick in GROUPS.items()}
    layer_groups = {g: frozenset(i for i in (in_layer_name(n) for n in named if pick(n)) if i)
                    for g, pick in GROUPS.items()}
    r = cfg.model.lora.rank
    lora_modules: tuple[str, ...] = ()
    with contextlib.suppress(UserFacingError):
        targets = lora_targets(model, cfg.model.lora.target_modules)
        groups["lora"] = sum(r * (m.in_features + m.out_features) for m in (model.get_submodule(n) for n in targets))
        lora_modules = tuple(sorted({i[:-len(".weight")] for i in (in_layer_name(n + ".weight") for n in targets)
                                     if i}))
    head = model.get_output_embeddings()
    hidden, layers, vocab = text_shape(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(text, "num_attention_heads", 1)
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    head_dim = getattr(text, "head_dim", None) or hidden // heads
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    return ModelShape(params=sum(p.numel() for p in named.values()),
                      head=0 if head is None or tied else head.weight.numel(), groups=groups, vocab=vocab,
                      hidden=hidden, layers=layers, kv_bytes_per_token=layers * 2 * kv_heads * head_dim, config=config,
                      layer_groups=layer_groups, lora_modules=lora_modules)


def _trainable(shape: ModelShape, group: str) -> int:
    if group not in shape.groups:
        raise UserFacingError(f"trainable {group!r}: no such group for this model ({sorted(shape.groups)})")
    return shape.groups[group]


def _optimizer(n: int, dtype_bytes: int, backend: str, processes: int) -> int:
    """AdamW's state for n trained parameters: DeepSpeed's fp32 master and moments partitioned over the ranks;
    the torch updater's two fp32 moments, and an fp32 master of each bf16 parameter (runtime.updaters)."""
    if backend == "deepspeed":
        return n * ADAM_DEEPSPEED // processes
    return n * (8 + (4 if dtype_bytes < 4 else 0))


def _gradients(n: int, dtype_bytes: int, backend: str, shard: int) -> int:
    """The torch updater adds each bf16 gradient into its master's fp32 one after every backward: both at once."""
    if backend == "deepspeed":
        return n * dtype_bytes // shard
    return n * (4 + (dtype_bytes if dtype_bytes < 4 else 0))


def profile_for(shape: ModelShape, cfg: Config, trainable: str, dtype_bytes: int,
                device_type: str = "cuda") -> ActivationProfile:
    """The traced activation profile of the student for a stage's `trainable` (a group or lora)."""
    dtype = torch.bfloat16 if dtype_bytes == 2 else torch.float32
    try:
        if trainable == "lora":
            spec = LoraSpec(shape.lora_modules, cfg.model.lora.rank, cfg.model.lora.dropout)
            return activation_profile(shape.config, dtype, lora=spec, device_type=device_type)
        return activation_profile(shape.config, dtype, trains=shape.layer_groups.get(trainable),
                                  device_type=device_type)
    except Exception:  # noqa: BLE001 - a family the meta device cannot build: the fallback rule
        return fallback_profile(shape.config, dtype_bytes)


def activation_bytes(profile: ActivationProfile, tokens: int, *, recompute: bool, grad: bool = True) -> int:
    """Activations one forward over `tokens` tokens keeps for its backward (with `grad`), or its working set."""
    return tokens * (profile.kept(recompute) if grad else profile.inference())


def backward_peak(profile: ActivationProfile, tokens: int, vocab: int, recompute: bool) -> int:
    """What the backward pass adds to the kept activations at its peak: the LM head's chunk of float32 logits
    and their gradients (recomputed), or later one layer's transient (its activations' gradients, and under
    recompute the layer itself), whichever is larger: the two never coexist (benchmarks/plan_calibration.py)."""
    return max(logits_bytes(vocab, tokens), tokens * profile.transient(recompute))


def logits_bytes(vocab: int, tokens: int, grad: bool = True) -> int:
    """The LM head's float32 chunk of scored positions (models.logprobs) and its log-softmax, and in a backward
    pass the softmax's gradient too (benchmarks/plan_calibration.py: 2 and 3 chunks' worth at the peak)."""
    chunk = max(1, LOGIT_CHUNK_BYTES // (4 * vocab))  # positions per chunk
    return (3 if grad else 2) * min(chunk, tokens) * 4 * vocab


def forward_peak(profile: ActivationProfile, tokens: int, vocab: int) -> int:
    """A no-grad forward's peak (the reference's and the old policy's log-probs): a layer's working set, or
    later the LM head's chunk of float32 logits and their log-softmax, whichever is larger: the layer's is freed
    before the head runs (benchmarks/plan_calibration.py)."""
    return max(tokens * profile.inference(), logits_bytes(vocab, tokens, grad=False))


def _micro_tokens(profile: ActivationProfile, cfg: Config, tokens: int | None, batch_tokens: int,
                  device_bytes: int | None) -> int:
    """Tokens in one forward: the section's micro_batch_tokens, or the derived budget (runtime.micro.budget_tokens)
    for a device of this size, and never more than the batch."""
    if tokens is None:
        per_token = profile.training(cfg.model.gradient_checkpointing)
        tokens = (int(device_bytes * ACTIVATION_SHARE_GPU) if device_bytes else 2 * GiB) // max(per_token, 1)
    return min(tokens, batch_tokens)


def _activations(shape: ModelShape, cfg: Config, dtype_bytes: int, tokens: int | None, batch_tokens: int,
                 device_bytes: int | None, trainable: str, *, grad: bool = True, head: bool = False,
                 device_type: str = "cuda") -> int:
    """A forward's activations at the phase's peak: with `head` (the policy's log-probs) the kept ones alone,
    the backward's own peak going to the "backward" part (`_backward`); without (the discriminator) both."""
    profile = profile_for(shape, cfg, trainable, dtype_bytes, device_type)
    n = _micro_tokens(profile, cfg, tokens, batch_tokens, device_bytes)
    kept = activation_bytes(profile, n, recompute=cfg.model.gradient_checkpointing, grad=grad)
    return kept if head or not grad else kept + n * profile.transient(cfg.model.gradient_checkpointing)


def _backward(shape: ModelShape, cfg: Config, dtype_bytes: int, tokens: int | None, batch_tokens: int,
              device_bytes: int | None, trainable: str, device_type: str = "cuda") -> int:
    profile = profile_for(shape, cfg, trainable, dtype_bytes, device_type)
    return backward_peak(profile, _micro_tokens(profile, cfg, tokens, batch_tokens, device_bytes), shape.vocab,
                         cfg.model.gradient_checkpointing)


@dataclass
class Lengths:
    prompt: int = 1024   # tokens of the longest prompt (image tokens included)
    answer: int = 256    # tokens of the longest SFT target


def _policy_parts(shape, cfg, *, dtype_bytes, trainable, backend, zero_stage, processes, micro, batch_tokens,
                  device_bytes, section, device_type="cuda") -> tuple[dict[str, int], dict[str, str]]:
    n = _trainable(shape, trainable)
    shard_weights = processes if backend == "deepspeed" and zero_stage == 3 else 1
    shard_grads = processes if backend == "deepspeed" else 1
    parts = {"weights": shape.params * dtype_bytes // shard_weights,
             "gradients": _gradients(n, dtype_bytes, backend, shard_grads),
             "optimizer": _optimizer(n, dtype_bytes, backend, processes),
             "activations": _activations(shape, cfg, dtype_bytes, micro, batch_tokens, device_bytes, trainable,
                                         head=True, device_type=device_type),
             "backward": _backward(shape, cfg, dtype_bytes, micro, batch_tokens, device_bytes, trainable, device_type)}
    hints = {"weights": "set model.dtype: bfloat16, or run several processes with "
                        f"{section}.backend: deepspeed and {section}.zero_stage: 3",
             "gradients": f"set {section}.trainable: lora (or a smaller group), or {section}.backend: deepspeed",
             "optimizer": f"set {section}.trainable: lora, or {section}.backend: deepspeed with several processes",
             "activations": f"lower {section}.micro_batch_tokens, or set model.gradient_checkpointing: true",
             "backward": "the LM head's chunk of logits, or one layer recomputed (or its gradients) in the "
                         f"backward pass: lower {section}.micro_batch_tokens"}
    return parts, hints


def _kv(shape: ModelShape, rows: int, length: int, dtype_bytes: int) -> int:
    return rows * length * shape.kv_bytes_per_token * dtype_bytes


def plan_stages(cfg: Config, shape: ModelShape, *, processes: int = 1, device_bytes: int | None = None,
                lengths: Lengths = Lengths(), device_type: str = "cuda") -> list[StagePlan]:
    """Per-rank peaks of sft, disc_pretrain, rl (and rl_baseline, the same loop), agent_rl and tool_rl, on a GPU
    or (`device_type` cpu) in a CPU process's resident memory: the runtime's own baseline added, no vLLM."""
    plans = _device_plans(cfg, shape, processes, device_bytes, lengths, device_type)
    if device_type == "cpu":
        for p in plans:
            p.parts["runtime"] = RUNTIME_BASELINE_CPU
            p.hints["runtime"] = "the Python process with torch, transformers and protege loaded (fixed)"
    return plans


def _device_plans(cfg: Config, shape: ModelShape, processes: int, device_bytes: int | None, lengths: Lengths,
                  device_type: str) -> list[StagePlan]:
    b = DTYPE_BYTES[cfg.model.dtype]
    out = []
    cpu = device_type == "cpu"
    if cpu:  # the derived micro-batch budget on the CPU is ACTIVATION_BYTES_CPU, whatever the host's memory
        device_bytes = None

    # sft: the policy's update on batch_size rows of prompt + target
    s = cfg.sft
    rows = -(-s.batch_size // processes)
    parts, hints = _policy_parts(shape, cfg, dtype_bytes=b, trainable=s.trainable, backend=s.backend,
                                 zero_stage=s.zero_stage, processes=processes, micro=s.micro_batch_tokens,
                                 batch_tokens=rows * (lengths.prompt + lengths.answer), device_bytes=device_bytes,
                                 section="sft", device_type=device_type)
    out.append(StagePlan("sft", parts, "update", hints))

    # disc_pretrain: the discriminator alone (backbone + a d -> 1 head)
    d = cfg.disc_pretrain
    disc_group = "lora" if discriminator_trainable(d.trainable, cfg.model) == "lora" else "all"
    disc_params = shape.params - shape.head
    n = shape.groups.get("lora", 0) if disc_group == "lora" else disc_params
    rows = -(-d.batch_size // processes)
    parts = {"weights": disc_params * b, "gradients": _gradients(n, b, d.backend, processes),
             "optimizer": _optimizer(n, b, d.backend, processes),
             "activations": _activations(shape, cfg, b, d.micro_batch_tokens, rows * (lengths.prompt + lengths.answer),
                                         device_bytes, disc_group, device_type=device_type)}
    out.append(StagePlan("disc_pretrain", parts, "update", {
        "gradients": "set disc_pretrain.trainable: lora", "optimizer": "set disc_pretrain.trainable: lora",
        "weights": "set model.dtype: bfloat16",
        "activations": "lower disc_pretrain.micro_batch_tokens, or set model.gradient_checkpointing: true"}))

    # rl: sampling, the reference's pass, the discriminator's update (ril), the policy's update
    r = cfg.rl
    ril = r.algorithm == "ril" or r.baseline == "ril"
    per_q = r.group_size * (2 if ril and r.teacher_in_group else 1)
    rows = -(-r.questions_per_step * per_q // processes)
    seq = lengths.prompt + r.max_new_tokens
    policy, hints = _policy_parts(shape, cfg, dtype_bytes=b, trainable=r.trainable, backend=r.backend,
                                  zero_stage=r.zero_stage, processes=processes, micro=r.micro_batch_tokens,
                                  batch_tokens=rows * seq, device_bytes=device_bytes, section="rl",
                                  device_type=device_type)
    ref = shape.params * b if r.kl_beta > 0 and r.trainable != "lora" else 0
    disc_n = 0
    if ril:
        disc_n = shape.groups.get("lora", 0) if discriminator_trainable(r.disc_trainable, cfg.model) == "lora" \
            else disc_params
    disc_update = (disc_params * b + _gradients(disc_n, b, r.backend, processes)
                   + _optimizer(disc_n, b, r.backend, processes)) if ril else 0
    disc_idle = (disc_params * b + _optimizer(disc_n, b, r.backend, processes)) if ril else 0
    vllm = int(r.vllm_memory * device_bytes) if r.generation == "vllm" and device_bytes and not cpu else 0
    awake = 0 if r.vllm_sleep else vllm  # asleep (sleep mode) while the models update
    resident = 0 if r.offload_idle and r.backend == "torch" and not cpu else ref + disc_idle
    base = {"weights": policy["weights"] * (processes if r.backend == "deepspeed" and r.zero_stage == 3 else 1),
            "optimizer": policy["optimizer"], "vllm": awake}
    kv = 0 if r.generation == "vllm" else _kv(shape, -(-r.questions_per_step * r.group_size // processes), seq, b)
    phases = {
        "sampling": {**base, "vllm": vllm, "kv_cache": kv, "reference": ref if resident else 0,
                     "discriminator": disc_idle if resident else 0},
        "update": {**policy, "vllm": awake, "reference": ref if resident else 0,
                   "discriminator": disc_idle if resident else 0},
    }
    if ref and not resident:
        profile = profile_for(shape, cfg, r.trainable, b, device_type)
        phases["reference pass"] = {**base, "reference": ref, "logits": forward_peak(
            profile, _micro_tokens(profile, cfg, r.micro_batch_tokens, rows * seq, device_bytes), shape.vocab)}
    if cpu and r.trainable == "lora":  # a checkpoint's merged weights, a copy of the model, beside it (host = device)
        phases["checkpoint save"] = {**base, "checkpoint": shape.params * b, "reference": ref if resident else 0,
                                     "discriminator": disc_idle if resident else 0}
    if ril:
        disc_trains = "lora" if discriminator_trainable(r.disc_trainable, cfg.model) == "lora" else "all"
        phases["discriminator update"] = {**base, "discriminator": disc_update,
                                          "activations": _activations(shape, cfg, b, r.micro_batch_tokens,
                                                                      rows * seq, device_bytes, disc_trains,
                                                                      device_type=device_type),
                                          "reference": ref if resident else 0}
    phase = max(phases, key=lambda k: sum(phases[k].values()))
    hints.update({"reference": "set rl.trainable: lora (the reference is the policy with its adapters off) or "
                               "rl.offload_idle: true", "discriminator": "set rl.disc_trainable: lora",
                  "kv_cache": "lower rl.questions_per_step or rl.max_new_tokens, or set rl.generation: vllm",
                  "vllm": "lower rl.vllm_memory, or set rl.vllm_sleep: true",
                  "checkpoint": "a LoRA checkpoint's merged weights are a copy of the model: fewer with "
                                "rl.checkpoint_every",
                  "logits": "the reference pass's chunk of LM-head logits (or a layer's working set): lower "
                            "rl.micro_batch_tokens"})
    out.append(StagePlan("rl", {k: v for k, v in phases[phase].items() if v}, phase, hints))

    # agent_rl / tool_rl: episodes of max_turns turns (observation + answer each), a reference when kl_beta > 0
    for name, game in (("agent_rl", cfg.agent), ("tool_rl", cfg.tool)):
        a = game.rl
        turns = getattr(getattr(game, game.env, None), "max_turns", None) or getattr(game.task, "max_turns", 4)
        seq = lengths.prompt + turns * (a.max_new_tokens + 64)
        rows = -(-a.seeds_per_step * a.group_size // processes)
        policy, hints = _policy_parts(shape, cfg, dtype_bytes=b, trainable=a.trainable, backend=a.backend,
                                      zero_stage=a.zero_stage, processes=processes, micro=a.micro_batch_tokens,
                                      batch_tokens=rows * seq, device_bytes=device_bytes, section=f"{name[:-3]}.rl",
                                      device_type=device_type)
        extra = (shape.params * b if a.kl_beta > 0 and a.trainable != "lora" else 0) + (
            shape.params * b if a.gtr.guidance != "none" else 0)
        phases = {"sampling": {"weights": policy["weights"], "optimizer": policy["optimizer"],
                               "kv_cache": _kv(shape, rows, seq, b), "reference": extra},
                  "update": {**policy, "reference": extra}}
        phase = max(phases, key=lambda k: sum(phases[k].values()))
        hints["reference"] = f"set {name[:-3]}.rl.trainable: lora, {name[:-3]}.rl.kl_beta: 0 or gtr.guidance: none"
        hints["kv_cache"] = f"lower {name[:-3]}.rl.seeds_per_step or max_new_tokens"
        out.append(StagePlan(name, {k: v for k, v in phases[phase].items() if v}, phase, hints))
    return out


# a GPU rank's host process before any model: Python, torch with its CUDA and NCCL libraries, transformers,
# protege (an estimate: no GPU measured it here)
HOST_BASELINE_GPU = 4 * GiB


@dataclass
class HostPlan:
    """Host memory per rank and per node, and the node's local disk, at the training stages' worst moment."""
    rank: dict[str, int]       # component -> bytes every rank's process holds
    rank0: dict[str, int]      # component -> bytes rank 0 holds besides (the whole parts it alone writes)
    ranks_per_node: int
    disk: dict[str, int]       # component -> bytes on the node's local disk (ephemeral storage)

    @property
    def rank_peak(self) -> int:
        return sum(self.rank.values()) + sum(self.rank0.values())

    @property
    def node_peak(self) -> int:
        return sum(self.rank.values()) * self.ranks_per_node + sum(self.rank0.values())

    def shm(self) -> int:
        """/dev/shm for NCCL's intra-node buffers and the data loaders: 2 GiB a rank, 16 GiB at least."""
        return max(16 * GiB, 2 * GiB * self.ranks_per_node)


def host_plan(cfg: Config, shape: ModelShape, *, processes: int = 1, nodes: int = 1) -> HostPlan:
    """What a GPU run of the rl stage (the one holding the most) keeps in host memory and on local disk:
    - every rank: the runtime, the models that wait on the host between their turns (`rl.offload_idle` with
      the torch backend: the reference and the discriminator), and its own partition of a state save (ZeRO);
    - rank 0 besides: what it alone copies at a save, the trained weights and an unpartitioned optimizer state,
      and a checkpoint's merged weights (built on the host one tensor at a time);
    - local disk: the checkpoint each rank's vLLM engine starts from.
    The weights are read from their files straight onto each GPU, and a vLLM engine asleep drops its weights
    (they are synced again), so neither holds a copy on the host."""
    b = DTYPE_BYTES[cfg.model.dtype]
    r = cfg.rl
    ril = r.algorithm == "ril" or r.baseline == "ril"
    disc_params = shape.params - shape.head
    trained = _trainable(shape, r.trainable)
    optimizer = _optimizer(trained, b, r.backend, processes)
    offloaded = r.offload_idle and r.backend == "torch"
    ref = shape.params * b if r.kl_beta > 0 and r.trainable != "lora" else 0
    rank = {"runtime": HOST_BASELINE_GPU,
            "models waiting on the host": (ref + (disc_params * b if ril else 0)) if offloaded else 0,
            "state save (own partition)": optimizer if r.backend == "deepspeed" else 0}
    rank0 = {"state save (whole parts)": trained * b + (0 if r.backend == "deepspeed" else optimizer),
             "checkpoint (merged weights)": shape.params * b}
    per_node = -(-processes // nodes)
    disk = {"engine start files": shape.params * b * per_node if r.generation == "vllm" else 0}
    return HostPlan({k: v for k, v in rank.items() if v}, {k: v for k, v in rank0.items() if v}, per_node,
                    {k: v for k, v in disk.items() if v})


def host_table(host: HostPlan) -> str:
    lines = ["| host memory (GiB) | every rank | rank 0 adds | per node |", "|---|---:|---:|---:|"]
    for part, size in host.rank.items():
        lines.append(f"| {part} | {size / GiB:.1f} | - | {size * host.ranks_per_node / GiB:.1f} |")
    for part, size in host.rank0.items():
        lines.append(f"| {part} | - | {size / GiB:.1f} | {size / GiB:.1f} |")
    lines.append(f"| **peak** | **{sum(host.rank.values()) / GiB:.1f}** | **{sum(host.rank0.values()) / GiB:.1f}** "
                 f"| **{host.node_peak / GiB:.1f}** |")
    for part, size in host.disk.items():
        lines.append(f"| local disk: {part} | - | - | {size / GiB:.1f} |")
    return "\n".join(lines)


def job_variables(host: HostPlan) -> dict[str, object]:
    """The Kubernetes job variables deploy/k8s/gpu-base-job-template.json takes, from the host plan (with a
    fifth more memory and disk than planned: the allocator's arenas, logs, the datasets' cache)."""
    def gib(x: float) -> str:
        return f"{max(1, -(-int(x * 1.2) // GiB))}Gi"

    return {"gpus": host.ranks_per_node, "memory": gib(host.node_peak),
            "ephemeral_storage": gib(sum(host.disk.values()) + 10 * GiB), "shm_size": f"{host.shm() // GiB}Gi"}


def parse_memory(text: str) -> int:
    """'80GB', '80 GiB', '81920MiB' -> bytes (GB and GiB both count 2^30, as GPU memory is quoted)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(GB|GiB|G|MB|MiB|M|TB|TiB|T)?\s*", text, re.IGNORECASE)
    if not m:
        raise UserFacingError(f"--gpu-memory {text!r}: expected a size such as 80GB, 141GiB or 40960MiB")
    unit = (m.group(2) or "GB").upper()[0]
    return int(float(m.group(1)) * {"M": 1 << 20, "G": GiB, "T": 1 << 40}[unit])


def table(plans: list[StagePlan], device_bytes: int | None, processes: int) -> str:
    """The plan as a Markdown table: GiB per rank, one column per stage."""
    lines = ["| per rank (GiB) | " + " | ".join(p.stage for p in plans) + " |",
             "|---|" + "---:|" * len(plans)]
    for part in PARTS:
        if any(part in p.parts for p in plans):
            lines.append(f"| {part} | " + " | ".join(f"{p.parts[part] / GiB:.1f}" if part in p.parts else "-"
                                                    for p in plans) + " |")
    lines.append("| **peak** | " + " | ".join(f"**{p.peak / GiB:.1f}**" for p in plans) + " |")
    lines.append("| peak phase | " + " | ".join(p.phase for p in plans) + " |")
    if device_bytes:
        lines.append(f"| fits {device_bytes / GiB:.0f} GiB x {processes} | " +
                     " | ".join("yes" if p.peak <= device_bytes else "**no**" for p in plans) + " |")
    return "\n".join(lines)


STAGE_PLANS = {"sft": ("sft", "sft"), "disc_pretrain": ("disc_pretrain", "disc_pretrain"), "rl": ("rl", "rl"),
               "rl_baseline": ("rl", "rl"), "agent_rl": ("agent_rl", "agent.rl"), "tool_rl": ("tool_rl", "tool.rl")}


def _section(cfg: Config, dotted: str):
    out = cfg
    for part in dotted.split("."):
        out = getattr(out, part)
    return out


def check_stage_fits(cfg: Config, stage: str, root: Path, processes: int = 1) -> str | None:
    """Before any compute: a training stage bound for a GPU is refused (UserFacingError, naming the setting to
    change) when its plan exceeds the device's memory. Returns a line to print when no plan could be made."""
    if stage not in STAGE_PLANS:
        return None
    plan_name, section = STAGE_PLANS[stage]
    device = _section(cfg, section).device
    if device == "cpu" or not torch.cuda.is_available():
        return None
    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    try:
        shape = model_shape(cfg, root)
    except Exception as exc:  # a family the meta device cannot build: train without the check, and say so
        return f"memory plan skipped: {exc}"
    for p in plan_stages(cfg, shape, processes=processes, device_bytes=total):
        if p.stage == plan_name and p.peak > total:
            raise UserFacingError(p.refusal(total))
    return None
