"""Typed configuration loaded from params.yaml.

params.yaml is the one configuration of a run and also DVC's params file, so every stage reads its
own section from here. Unknown keys and wrong types are errors: a typo must never silently fall back
to a default.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A params file that cannot be used; the message is one line naming the key."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorldConfig(Section):
    seed: int = 1234
    n_train: int = Field(2400, ge=8)
    n_rl: int = Field(320, ge=4)
    n_val: int = Field(160, ge=4)      # held-out slice for learning curves during RL
    n_test: int = Field(400, ge=4)
    image_size: int = Field(64, ge=16)
    vocab_size: int = Field(512, ge=300)
    # benchmark prompt formats the SFT pool never uses (the RL pool and the test split do): the formats
    # post-training must teach, e.g. [mmstar, mmvet]
    sft_held_out_formats: list[str] = []

    @model_validator(mode="after")
    def _known_formats(self) -> "WorldConfig":
        from protege.eval.items import BENCHMARKS

        unknown = sorted(set(self.sft_held_out_formats) - set(BENCHMARKS))
        if unknown:
            raise ValueError(f"world.sft_held_out_formats: unknown format(s) {unknown}; expected benchmark names "
                             f"from {', '.join(BENCHMARKS)}")
        return self


class ModelConfig(Section):
    hidden_size: int = Field(64, ge=8)
    num_layers: int = Field(2, ge=1)
    num_heads: int = Field(2, ge=1)
    num_kv_heads: int = Field(1, ge=1)
    intermediate_size: int = Field(256, ge=8)
    vision_depth: int = Field(2, ge=1)
    vision_embed_dim: int = Field(32, ge=8)
    vision_heads: int = Field(2, ge=1)
    patch_size: int = Field(8, ge=2)
    merge_size: int = Field(2, ge=1)
    initializer_range: float = Field(0.12, gt=0)

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.hidden_size % self.num_heads:
            raise ValueError("model.hidden_size must be divisible by model.num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("model.num_heads must be divisible by model.num_kv_heads")
        if (self.hidden_size // self.num_heads) % 2:
            raise ValueError("model.hidden_size / model.num_heads (head_dim) must be even")
        return self


class CurateConfig(Section):
    max_tokens: int = Field(96, ge=8)            # prompt + image + answer tokens; longer rows are dropped
    max_teacher_tokens: int = Field(48, ge=4)    # teacher answers longer than this leave the training view
    select: int = Field(256, ge=1)               # questions kept for RL after log-prob sampling
    rule: Literal["softmax", "stratified", "lowest"] = "softmax"
    tau: float = Field(0.5, gt=0)                # softmax temperature over -logprob
    buckets: int = Field(4, ge=1)                # stratified: log-prob quantile buckets
    balance: bool = True                         # sample within (kind, answer) strata: answers stay balanced
    batch_size: int = Field(64, ge=1)


class TeacherSpec(Section):
    """One teacher. `scripted` needs nothing; `transformers`/`vllm` need `model` (a local path);
    `openai` needs `model` (the served name) and `base_url` (…/v1), and reads its key from `api_key_env`."""
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    backend: Literal["scripted", "transformers", "vllm", "openai"] = "scripted"
    style: Literal["concise", "verbose"] | None = None  # scripted only; defaults to the name
    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = Field(32, ge=1)
    timeout_s: float = Field(60.0, gt=0)
    max_retries: int = Field(5, ge=0)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(128, ge=1)
    batch_size: int = Field(32, ge=1)

    @model_validator(mode="after")
    def _backend_needs(self) -> "TeacherSpec":
        if self.backend == "scripted" and (self.style or self.name) not in ("concise", "verbose"):
            raise ValueError(f"teacher '{self.name}': a scripted teacher needs style 'concise' or 'verbose'")
        if self.backend != "scripted" and not self.model:
            raise ValueError(f"teacher '{self.name}': backend '{self.backend}' needs 'model'")
        if self.backend == "openai" and not self.base_url:
            raise ValueError(f"teacher '{self.name}': backend 'openai' needs 'base_url' (e.g. http://host:8000/v1)")
        return self


class TeachersConfig(Section):
    pool: list[TeacherSpec] = [TeacherSpec(name="concise"), TeacherSpec(name="verbose")]
    answers_per_question: int = Field(4, ge=1)
    error_rate: float = Field(0.1, ge=0, le=1)  # scripted teachers only

    @model_validator(mode="after")
    def _unique_names(self) -> "TeachersConfig":
        names = [t.name for t in self.pool]
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"teachers.pool needs at least one teacher and unique names (got {names})")
        return self

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.pool]


class SFTConfig(Section):
    steps: int = Field(300, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(2e-3, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    schedule: Literal["constant", "cosine"] = "cosine"  # cosine: decays to 10% of lr by the last step
    warmup_steps: int = Field(0, ge=0)
    log_every: int = Field(20, ge=1)


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(50, ge=0)
    max_new_tokens: int = Field(16, ge=1)


class RolloutsConfig(SamplingConfig):
    samples_per_question: int = Field(4, ge=1)


class DiscPretrainConfig(Section):
    steps: int = Field(60, ge=1)
    batch_size: int = Field(32, ge=2)
    lr: float = Field(1e-3, gt=0)
    holdout_fraction: float = Field(0.2, gt=0, lt=1)


class RLConfig(SamplingConfig):
    algorithm: Literal["dr_grpo", "grpo", "ril"] = "dr_grpo"
    steps: int = Field(40, ge=1)
    questions_per_step: int = Field(8, ge=1)
    group_size: int = Field(4, ge=2)
    lr: float = Field(5e-5, gt=0)
    clip_eps: float = Field(0.2, gt=0, lt=1)
    kl_beta: float = Field(0.04, ge=0)
    repetition_penalty: float = Field(1.05, gt=0)
    trainable: Literal["attention+embeddings+head", "all", "attention"] = "attention+embeddings+head"
    save_every: int = Field(10, ge=1)
    # RIL (algorithm: ril) and its ablations
    w_sim: float = Field(1.0, ge=0)               # weight of the discriminator similarity reward
    w_answer: float = Field(1.0, ge=0)            # weight of the judge's correctness reward
    similarity: str = Field("binary", pattern=r"^(binary|continuous|levels:[0-9]+)$")
    discriminator: Literal["updated", "fixed"] = "updated"
    disc_updates: int = Field(1, ge=0)            # mu_d: discriminator updates per step
    disc_lr: float = Field(1e-4, gt=0)
    teachers: str = Field("both", min_length=1)   # "both" (every teacher) or one teacher's name
    teacher_in_group: bool = True                 # off: teacher answers train D but are not in the group
    judge: Literal["rule", "llm"] = "rule"
    judge_model: TeacherSpec | None = None        # judge: llm -> a text backend (openai or vllm)
    max_missing_fraction: float = Field(0.1, ge=0, le=1)  # questions without teacher answers: skip, or fail above this
    backend: Literal["torch", "deepspeed"] = "torch"     # deepspeed: ZeRO for the policy and discriminator updates
    zero_stage: Literal[2, 3] = 2
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when available
    offload_idle: bool = True                     # reference model / discriminator on the device only while used
    # learning curve: greedy accuracy on the world's val split at step 0, every eval_every steps and at the end
    eval_every: int = Field(10, ge=0)             # 0: no learning curve
    eval_items: int = Field(160, ge=1)            # val rows used (the first ones)
    # the rl_baseline stage: the same run (seed, steps, lr, group size, ...) with this algorithm; null: none
    baseline: Literal["dr_grpo", "grpo", "ril"] | None = "dr_grpo"

    @field_validator("baseline", mode="before")
    @classmethod
    def _none_means_no_baseline(cls, v):
        return None if isinstance(v, str) and v.lower() == "none" else v

    @model_validator(mode="after")
    def _judge_needs_model(self) -> "RLConfig":
        if self.judge == "llm" and (self.judge_model is None or self.judge_model.backend not in ("openai", "vllm")):
            raise ValueError("rl.judge 'llm' needs rl.judge_model with backend openai or vllm")
        return self


class MergeConfig(Section):
    method: Literal["uniform"] = "uniform"


class EvaluateConfig(Section):
    """`benchmarks: mini` evaluates on the world's 14 mini benchmarks; a map NAME: PATH reads real files
    (VLMEvalKit .tsv, lmms-eval .parquet, MM-Vet .json) from those paths instead; nothing is downloaded."""
    batch_size: int = Field(64, ge=1)
    max_new_tokens: int = Field(16, ge=1)
    benchmarks: Literal["mini"] | dict[str, str] = "mini"
    mini_items: int = Field(24, ge=4)          # items per mini benchmark (MMBench: / 4 questions x 4 copies)
    protocol: Literal["lmms-eval", "lenient", "vlmevalkit"] = "lmms-eval"  # lenient: our generous reading;
    #                                                                         vlmevalkit: its multiple-choice matching
    judge: TeacherSpec | None = None           # MM-Vet grader + extraction fallback (openai/vllm); null: rules
    bootstrap: int = Field(1000, ge=100)       # resamples for the 95% confidence intervals
    mmvet_grader_prompt: str | None = None     # a text file replacing the grader prompt (default: the protocol's own)

    @model_validator(mode="after")
    def _known_benchmarks(self) -> "EvaluateConfig":
        from protege.eval.items import BENCHMARKS

        if isinstance(self.benchmarks, dict):
            unknown = sorted(set(self.benchmarks) - set(BENCHMARKS))
            if unknown or not self.benchmarks:
                raise ValueError(f"evaluate.benchmarks: unknown benchmark(s) {unknown}; expected names from "
                                 f"{', '.join(BENCHMARKS)}")
        if self.judge is not None and self.judge.backend not in ("openai", "vllm"):
            raise ValueError("evaluate.judge needs a text backend: openai or vllm")
        return self


class PromoteConfig(Section):
    model_name: str = Field("protege-student", min_length=1)
    margin: float = Field(0.0, ge=0)           # points of the benchmark average the candidate must gain


class Config(Section):
    seed: int = 0
    threads: int = Field(1, ge=0)  # torch threads per stage process; 0: torch's default (all cores)
    world: WorldConfig = WorldConfig()
    model: ModelConfig = ModelConfig()
    curate: CurateConfig = CurateConfig()
    teachers: TeachersConfig = TeachersConfig()
    sft: SFTConfig = SFTConfig()
    rollouts: RolloutsConfig = RolloutsConfig()
    disc_pretrain: DiscPretrainConfig = DiscPretrainConfig()
    rl: RLConfig = RLConfig()
    merge: MergeConfig = MergeConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    promote: PromoteConfig = PromoteConfig()

    @model_validator(mode="after")
    def _rl_teachers_exist(self) -> "Config":
        if self.rl.teachers != "both" and self.rl.teachers not in self.teachers.names:
            raise ValueError(f"rl.teachers is {self.rl.teachers!r}: expected 'both' or one of teachers.pool "
                             f"{self.teachers.names}")
        return self


def _type_name(annotation) -> str:
    name = getattr(annotation, "__name__", None)
    return name if name else str(annotation).replace("typing.", "")


def _expected(model: type[BaseModel], loc: tuple) -> str:
    """The declared type at a location, e.g. 'float' for ('rl', 'lr')."""
    current: type[BaseModel] | None = model
    field = None
    for part in loc:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            break
        field = current.model_fields[part]
        ann = field.annotation
        current = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    return _type_name(field.annotation) if field is not None else "?"


def _one_line(path: Path, err: ValidationError) -> str:
    first = err.errors()[0]
    loc = tuple(first["loc"])
    key = ".".join(str(p) for p in loc) or "<root>"
    if first["type"] == "extra_forbidden":
        parent = Config
        for part in loc[:-1]:
            parent = parent.model_fields[part].annotation
        allowed = ", ".join(parent.model_fields)
        msg = f"{path}: unknown key '{key}' (allowed here: {allowed})"
    elif first["type"] in {"value_error", "assertion_error"}:
        msg = f"{path}: {first['msg'].removeprefix('Value error, ')}"
    else:
        got = first.get("input")
        msg = (f"{path}: key '{key}' expects {_expected(Config, loc)}: {first['msg']}"
               f" (got {got!r})")
    more = len(err.errors()) - 1
    return msg + (f" [and {more} more problem(s)]" if more else "")


def load_config(path: str | Path = "params.yaml") -> Config:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: no such params file (run from the project root or pass --params)")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_one_line(path, err)) from None
