"""Typed configuration loaded from params.yaml.

params.yaml is the one configuration of a run and also DVC's params file, so every stage reads its
own section from here. Unknown keys and wrong types are errors: a typo must never silently fall back
to a default.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from protege.bench.items import BENCHMARKS
from protege.stage_names import STAGES


class ConfigError(ValueError):
    """A params file that cannot be used; the message is one line naming the key."""


# ------------------------------------------------------------------------------------ reading YAML


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML with two rules a config needs: a key given twice is an error (PyYAML keeps the last one
    silently), and only true / false are booleans (YAML 1.1 also reads yes / no / on / off as booleans,
    which an int field would then take as 1 / 0)."""


_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                    list("tTfF"))


class _DuplicateKey(Exception):
    def __init__(self, key, line: int, first_line: int):
        super().__init__(key)
        self.key, self.line, self.first_line = key, line, first_line


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: merged keys may be overridden
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            continue  # PyYAML reports unhashable keys itself
        if key in seen:
            raise _DuplicateKey(key, key_node.start_mark.line + 1, seen[key])
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml_file(path: str | Path, what: str = "params file") -> tuple[object, str]:
    """(the parsed document, its text). ConfigError, one line naming the file and line, for a folder, a
    missing or unreadable file, bytes that are not UTF-8, a YAML syntax error, a duplicate key or an
    empty document."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder; expected a {what} (YAML)")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                          f"save the {what} as UTF-8") from None
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as exc:
        raise ConfigError(f"{path}:{exc.line}: duplicate key '{exc.key}' (first given at line {exc.first_line}); "
                          "give each key once") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if doc is None:
        raise ConfigError(f"{path}: the {what} is empty; write at least one section (copy the repository's "
                          "params.yaml to start)")
    return doc, text


def key_line(text: str, loc: tuple) -> int | None:
    """The line (1-based) of the key at `loc` (e.g. ('rl', 'lr')) in a YAML text, or of its deepest
    existing parent; None when the text cannot be composed."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            line, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


# ------------------------------------------------------------------------------------ the sections

_INT_CEILING = 2**31 - 1  # any int above this in a params file is a typo


def _allows_bool(annotation) -> bool:
    if annotation is bool:
        return True
    return any(_allows_bool(a) for a in get_args(annotation))


# What a setting can change, declared once on the field (`Field(..., **affects(...))`); unmarked: RESULTS.
# Resume fingerprints keep only RESULTS (`result_params`), dvc.yaml's params and the MLflow params leave out
# NOTHING (`tracked_params`, `stage_deps`).
RESULTS = "results"  # the trained weights (and what is measured on them)
LENGTH = "length"    # how far a run goes: the LR is constant, so a longer run continues a finished shorter one
OUTPUTS = "outputs"  # which files are written or measured around the same weights (save cadence, final eval)
NOTHING = "nothing"  # speed, memory, logging, where stages run
EFFECTS = (RESULTS, LENGTH, OUTPUTS, NOTHING)


_NO_NEUTRAL = object()


def affects(effect: str, neutral=_NO_NEUTRAL) -> dict:
    """`neutral`: for a setting added to a section after runs saved resume states, the value at which it does
    what the code did before it existed; a resume state's identity leaves it out at that value, so those states
    still resume (`result_params`)."""
    assert effect in EFFECTS, effect
    return {"json_schema_extra": {"affects": effect, **({} if neutral is _NO_NEUTRAL else {"neutral": neutral})}}


def effect_of(section: type[BaseModel], name: str) -> str:
    extra = section.model_fields[name].json_schema_extra
    return extra.get("affects", RESULTS) if isinstance(extra, dict) else RESULTS


def _dump(section: BaseModel, keep: tuple[str, ...], skip_neutral: bool = False) -> dict:
    out = {}
    for name, field in type(section).model_fields.items():
        if effect_of(type(section), name) not in keep:
            continue
        value = getattr(section, name)
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if skip_neutral and "neutral" in extra and value == extra["neutral"]:
            continue
        out[name] = (_dump(value, keep, skip_neutral) if isinstance(value, BaseModel)
                     else section.model_dump(include={name})[name])
    return out


def result_params(section: BaseModel) -> dict:
    """The section's settings that change the trained weights (a resume state's identity), sub-sections too;
    a setting at its `neutral` value (see `affects`) is left out."""
    return _dump(section, (RESULTS,), skip_neutral=True)


def tracked_params(section: BaseModel) -> dict:
    """The section's settings that change anything a stage writes (what DVC and MLflow record)."""
    return _dump(section, (RESULTS, LENGTH, OUTPUTS))


def untracked_keys(section: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted names of the settings under `section` that change nothing a stage writes."""
    out = set()
    for name, field in section.model_fields.items():
        ann = field.annotation
        if effect_of(section, name) == NOTHING:
            out.add(prefix + name)
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= untracked_keys(ann, f"{prefix}{name}.")
    return out


def _processes_field():
    """Ranks the stage starts itself (`protege stage` launches them: gloo on the CPU, NCCL on GPUs); more than one
    needs backend: deepspeed. auto: one per visible GPU under DeepSpeed, else one."""
    return Field("auto", **affects(NOTHING))


def _collective_timeout_field():
    """Seconds a rank waits in a collective (a barrier, a gradient all-reduce) for the others before the stage
    fails: a rank that died or hangs stops the stage instead of holding every GPU. Long enough for rank 0 to
    save a 7B checkpoint or start its vLLM engine while the others wait."""
    return Field(1800, ge=10, le=86_400, **affects(NOTHING))


def _nodes_field():
    """Machines the stage spans, each running `protege stage NAME` with its node rank (`--node-rank`); more
    than one needs backend: deepspeed and a rendezvous endpoint."""
    return Field(1, ge=1, le=4096, **affects(NOTHING))


def _endpoint_field():
    """HOST:PORT of the c10d rendezvous every node reaches (node 0 hosts it); null: one node."""
    return Field(None, min_length=3, max_length=300, pattern=r"^\S+:\d{1,5}$", **affects(NOTHING))


def _restarts_field():
    """Times the elastic agent restarts the stage's ranks after one dies; each resumes from its last saved
    training state, so a dead rank costs at most save_every steps."""
    return Field(0, ge=0, le=1000, **affects(NOTHING))


Processes = Literal["auto"] | Annotated[int, Field(ge=1, le=4096)]


def _micro_batch_field():
    """Tokens (rows x padded width) per forward of a training or scoring pass; a step's batch is split into
    micro-batches of at most this many and their gradients add up. null: derived from the model's shape and the
    device's memory (protege/runtime/micro.py). Memory only: the loss is the same whatever the split."""
    return Field(None, ge=1, le=_INT_CEILING, **affects(NOTHING))


class Section(BaseModel):
    # allow_inf_nan: an infinite or NaN number is never a setting
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value, info: ValidationInfo):
        field = cls.model_fields[info.field_name]
        if isinstance(value, bool) and not _allows_bool(field.annotation):
            raise ValueError(f"expects {_type_name(field.annotation)}, got the boolean {str(value).lower()}")
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _INT_CEILING:
            raise ValueError(f"{value} is out of range (at most {_INT_CEILING})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _declared_defaults(cls, data):
        """A sub-section given in part keeps the defaults its parent declares for it: `tool: {rl: {steps: 5}}`
        still has tool.rl's algorithm gtpo, not the class's grpo, so a key missing from a params file always
        takes the default `Config()` (and docs/configuration.md) shows."""
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, field in cls.model_fields.items():
            if isinstance(field.default, BaseModel) and isinstance(out.get(name), dict):
                out[name] = _under(field.default, out[name])
        return out


def _under(default: BaseModel, given: dict) -> dict:
    """`given` over the settings `default` was built with explicitly (its parent's declared defaults), deeply."""
    out: dict = {k: getattr(default, k) for k in default.model_fields_set}
    for key, value in given.items():
        below = out.get(key)
        out[key] = _under(below, value) if isinstance(below, BaseModel) and isinstance(value, dict) else value
    return out


class WorldConfig(Section):
    # the sizes are the demo's (9 question kinds, dealt evenly): large enough that RL cannot memorise its pool
    seed: int = 1234
    n_train: int = Field(5400, ge=8, le=10_000_000)   # the SFT pool
    n_rl: int = Field(4608, ge=4, le=10_000_000)      # questions for RL (curated from this pool)
    n_val: int = Field(216, ge=4, le=10_000_000)      # held-out slice for learning curves during RL
    n_test: int = Field(1080, ge=4, le=10_000_000)    # held-out test split: 120 questions of each kind
    image_size: int = Field(64, ge=16, le=4096)
    # the locally trained byte-level BPE tokenizer's size (the world's text fills ~760)
    vocab_size: int = Field(1024, ge=300, le=1_000_000)
    # benchmark prompt formats the SFT pool never uses (the RL pool and the test split do): the formats
    # post-training must teach, e.g. [mmstar, mmvet]
    sft_held_out_formats: list[str] = []
    # the scripted teachers and the SFT targets give a short grounded account of the image before the marked
    # final answer ("I see 3 red circles. Answer: 3."); the judge reads only the final answer. false: the
    # answer alone
    accounts: bool = True
    # the SFT targets come from a weaker source than the teachers (whose accounts are wrong only with their
    # answers, at teachers.error_rate), so the SFT student differs from them in content, not style; its final
    # answer stays the reference. How often its account leaves what the answer rests on unstated ("some red
    # circles. Answer: 3") ...
    sft_account_vague: float = Field(0.4, ge=0, le=1)
    # ... and how often it otherwise misreports one of the facts it states (a count, a colour, a bar, ...)
    sft_account_error: float = Field(0.2, ge=0, le=1)

    @model_validator(mode="after")
    def _account_shares(self) -> "WorldConfig":
        if self.sft_account_vague + self.sft_account_error > 1:
            raise ValueError(f"world.sft_account_vague + world.sft_account_error is "
                             f"{self.sft_account_vague + self.sft_account_error:g}; they are shares of the SFT "
                             "targets' accounts and add up to at most 1")
        return self

    @model_validator(mode="after")
    def _known_formats(self) -> "WorldConfig":
        unknown = sorted(set(self.sft_held_out_formats) - set(BENCHMARKS))
        if unknown:
            raise ValueError(f"world.sft_held_out_formats: unknown format(s) {unknown}; expected benchmark names "
                             f"from {', '.join(BENCHMARKS)}")
        return self


DATA_FIELDS = ("id", "question", "answer", "target", "image", "options", "kind")
SplitFiles = str | list[str]


class DataConfig(Section):
    """Where the question data comes from. `world`: the embedded world's generated splits. `files`: your
    own files, one file, a folder or a list of them per split (absolute, or relative to the project), read
    as they come: LLaVA conversation JSON / JSONL, parquet tables (Hugging Face `datasets` exports, verl /
    EasyR1 RL tables) or flat JSON / JSONL records; `protege dag` (run by `protege pipeline` itself)
    rewrites dvc.yaml with a `data` stage that imports them in place of `world`."""
    source: Literal["world", "files"] = "world"
    train: SplitFiles | None = None   # the SFT pool
    rl: SplitFiles | None = None      # the RL question pool (curated by `curate`)
    val: SplitFiles | None = None     # learning curves during RL; null: no curve
    test: SplitFiles | None = None    # the held-out split the evaluation report leads with
    # our field -> your column, where a file names it differently from what the readers look for, e.g.
    # {question: problem, image: images}; fields: id, question, answer, target, image, options, kind
    columns: dict[str, str] = {}
    images: str | None = None         # the folder relative image paths resolve in (default: each file's folder)
    allow_outside_images: bool = False  # let image paths lead outside that folder (absolute paths, ../)
    images_in_place: bool = False  # tables name your image files where they are, not a copy under data/imported
    # processes per machine decoding the next batches' images while the model works (split between a stage's
    # ranks); 2 keeps a GPU step fed from JPEGs of a few hundred pixels and costs two small processes; 0: in-process
    workers: int = Field(2, ge=0, le=256, **affects(NOTHING))

    @model_validator(mode="after")
    def _files_named(self) -> "DataConfig":
        unknown = sorted(set(self.columns) - set(DATA_FIELDS))
        if unknown:
            raise ValueError(f"data.columns: unknown field(s) {unknown}; expected some of {', '.join(DATA_FIELDS)} "
                             "mapped to your column names")
        for split in ("train", "rl", "val", "test"):
            files = getattr(self, split)
            if isinstance(files, list) and (not files or not all(isinstance(f, str) and f for f in files)):
                raise ValueError(f"data.{split}: expected a file or folder, or a non-empty list of them")
        if self.source == "files":
            missing = [s for s in ("train", "rl", "test") if getattr(self, s) is None]
            if missing:
                raise ValueError(f"data.source is files: set data.{', data.'.join(missing)} (a file, a folder or a "
                                 "list of them); data.val may stay null")
        return self

    def split_files(self) -> dict[str, list[str]]:
        """The splits given, each as its list of files or folders."""
        return {s: ([f] if isinstance(f, str) else list(f)) for s in ("train", "rl", "val", "test")
                if (f := getattr(self, s)) is not None}


class LoraSettings(Section):
    """peft LoRA for `trainable: lora` (docs/own-model.md lists the defaults per family)."""
    rank: int = Field(16, ge=1, le=4096)
    alpha: float = Field(32.0, gt=0, le=100_000)
    dropout: float = Field(0.05, ge=0, lt=1)
    # auto: every linear layer of the text decoder's layers (q/k/v/o and gate/up/down projections in the
    # families tested); or module names, each matching the modules whose name ends with it
    target_modules: Literal["auto"] | list[str] = "auto"


class ModelConfig(Section):
    # your own student: a Hugging Face checkpoint folder (absolute, or relative to the project) read with
    # AutoModelForImageTextToText and its own processor; null: the embedded world's tiny Qwen2-VL, built by
    # the world stage from the sizes below
    path: str | None = None
    # the folder's content digest, written by `protege model pin` (and by `protege pipeline`): DVC re-runs
    # what depends on the model when it changes, and a stage refuses a folder whose files no longer match it
    digest: str | None = None
    trust_remote_code: bool = False   # families that ship their own code run it only when this is set
    dtype: Literal["float32", "bfloat16"] = "float32"  # weights; bfloat16 also autocasts where supported
    gradient_checkpointing: bool = False  # policy and discriminator recompute activations in backward: less memory, ~30% slower
    lora: LoraSettings = LoraSettings()   # used where a stage's trainable is `lora`
    hidden_size: int = Field(64, ge=8, le=65_536)
    num_layers: int = Field(2, ge=1, le=1024)
    num_heads: int = Field(2, ge=1, le=1024)
    num_kv_heads: int = Field(1, ge=1, le=1024)
    intermediate_size: int = Field(256, ge=8, le=262_144)
    vision_depth: int = Field(2, ge=1, le=1024)
    vision_embed_dim: int = Field(32, ge=8, le=65_536)
    vision_heads: int = Field(2, ge=1, le=1024)
    patch_size: int = Field(8, ge=2, le=1024)
    merge_size: int = Field(2, ge=1, le=64)
    initializer_range: float = Field(0.12, gt=0, le=100)

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
    max_tokens: int = Field(128, ge=8, le=1_000_000)           # prompt + image + answer tokens; longer rows are dropped
    max_teacher_tokens: int = Field(48, ge=4, le=1_000_000)  # longer teacher answers leave the training view
    # questions kept for RL after log-prob sampling; the demo's 384 per kind of world.n_rl (a demo value: your
    # own pool wants its own number)
    select: int = Field(3456, ge=1, le=10_000_000)
    rule: Literal["softmax", "stratified", "lowest"] = "softmax"
    tau: float = Field(0.5, gt=0, le=1000)                # softmax temperature over -logprob
    buckets: int = Field(4, ge=1, le=1000)                # stratified: log-prob quantile buckets
    balance: bool = True                         # sample within (kind, answer) strata: answers stay balanced
    batch_size: int = Field(64, ge=1, le=1_000_000)


class TeacherSpec(Section):
    """One teacher. `scripted` needs nothing; `transformers`/`vllm` need `model` (a local path);
    `openai` needs `model` (the served name) and `base_url` (…/v1), and reads its key from `api_key_env`."""
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    backend: Literal["scripted", "transformers", "vllm", "openai"] = "scripted"
    style: Literal["concise", "verbose"] | None = None  # scripted only; defaults to the name
    model: str | None = None
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    concurrency: int = Field(32, ge=1, le=4096)
    timeout_s: float = Field(60.0, gt=0, le=86_400)
    max_retries: int = Field(5, ge=0, le=100)
    temperature: float = Field(1.0, ge=0, le=100)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(128, ge=1, le=1_000_000)
    batch_size: int = Field(32, ge=1, le=1_000_000)
    # vllm: the engine's context, prompt (its images included) + max_tokens; a longer request fails with vLLM's
    # message. Sized for the work, never the model's native context (128k: a KV cache that would not fit)
    max_model_len: int = Field(8192, ge=16, le=10_000_000, **affects(NOTHING))

    @model_validator(mode="after")
    def _backend_needs(self) -> "TeacherSpec":
        if self.backend == "scripted" and (self.style or self.name) not in ("concise", "verbose"):
            raise ValueError(f"teacher '{self.name}': a scripted teacher needs style 'concise' or 'verbose'")
        if self.backend != "scripted" and not self.model:
            raise ValueError(f"teacher '{self.name}': backend '{self.backend}' needs 'model'")
        if self.backend == "openai" and not self.base_url:
            raise ValueError(f"teacher '{self.name}': backend 'openai' needs 'base_url' (e.g. http://host:8000/v1)")
        return self


class JudgeSpec(TeacherSpec):
    """The evaluation's LLM judge: a teacher spec, plus how many unusable replies a run tolerates."""
    # share of a benchmark's judge prompts whose reply may be blank or failed before the run stops (each is
    # scored as the harness scores it); judged over at least 1 / max_unusable prompts
    max_unusable: float = Field(0.05, ge=0, le=1)


class TeachersConfig(Section):
    pool: list[TeacherSpec] = [TeacherSpec(name="concise"), TeacherSpec(name="verbose")]
    answers_per_question: int = Field(4, ge=1, le=1024)
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
    trainable: Literal["all", "lora"] = "all"   # lora: adapters (model.lora); the checkpoint holds both forms
    # the demo's length on the tiny world: the student perceives every kind but leaves headroom for RL
    steps: int = Field(1500, ge=1, le=10_000_000)
    batch_size: int = Field(32, ge=1, le=1_000_000)
    lr: float = Field(2e-3, gt=0, le=10)
    weight_decay: float = Field(0.0, ge=0, le=100)
    schedule: Literal["constant", "cosine"] = "cosine"  # cosine: decays to 10% of lr by the last step
    warmup_steps: int = Field(50, ge=0, le=10_000_000)
    log_every: int = Field(100, ge=1, le=10_000_000, **affects(NOTHING))
    # the training runtime (protege/runtime), as for rl
    backend: Literal["torch", "deepspeed"] = "torch"  # deepspeed: ZeRO, and several processes under torchrun
    zero_stage: Literal[2, 3] = 2
    micro_batch_tokens: int | None = _micro_batch_field()
    processes: Processes = _processes_field()
    collective_timeout_s: int = _collective_timeout_field()
    nodes: int = _nodes_field()
    rdzv_endpoint: str | None = _endpoint_field()
    max_restarts: int = _restarts_field()
    device: Literal["auto", "cpu", "cuda"] = "auto"    # auto: cuda when available
    # steps between training states (exact resume after a kill)
    save_every: int = Field(100, ge=1, le=10_000_000, **affects(OUTPUTS))
    # the checkpoint SFT starts from, a folder inside the project; dvc.yaml lists it as a dependency by
    # this value. Retraining sets it to models/champion (the registry's champion, exported and DVC-tracked).
    init: str = "models/base"

    @field_validator("init")
    @classmethod
    def _init_inside_project(cls, v: str) -> str:
        p = Path(v)
        if not v or p.is_absolute() or ".." in p.parts or not re.fullmatch(r"[A-Za-z0-9_./-]+", v):
            raise ValueError(f"sft.init {v!r}: expected a checkpoint folder relative to the project, "
                             "such as models/base or models/champion")
        return p.as_posix()


class SamplingConfig(Section):
    temperature: float = Field(1.0, gt=0, le=100)
    top_p: float = Field(0.95, gt=0, le=1)
    top_k: int = Field(50, ge=0, le=1_000_000)
    max_new_tokens: int = Field(16, ge=1, le=1_000_000)
    # who samples: the student itself (transformers), or a vLLM engine holding a copy of its weights (synced
    # after every RL update); vllm needs the `gpu` extra, and the VLM student a CUDA machine
    generation: Literal["transformers", "vllm"] = "transformers"
    # vllm on CUDA: GPU memory fraction for the engine (rest: training)
    vllm_memory: float = Field(0.3, gt=0, lt=1, **affects(NOTHING))
    # vllm: the engine's context (prompt + answer tokens); null: the curated questions' cap (curate.max_tokens)
    # plus max_new_tokens, so a model's native 128k context never sizes the KV cache
    vllm_max_model_len: int | None = Field(None, ge=16, le=10_000_000, **affects(NOTHING))


class RolloutsConfig(SamplingConfig):
    samples_per_question: int = Field(4, ge=1, le=1024)


class DiscPretrainConfig(Section):
    steps: int = Field(200, ge=1, le=10_000_000)  # reaches the style ceiling on the world (held-out accuracy ~0.75)
    batch_size: int = Field(32, ge=2, le=1_000_000)
    lr: float = Field(1e-3, gt=0, le=10)
    holdout_fraction: float = Field(0.2, gt=0, lt=1)
    backend: Literal["torch", "deepspeed"] = "torch"  # the training runtime, as sft's
    zero_stage: Literal[2, 3] = 2
    micro_batch_tokens: int | None = _micro_batch_field()
    processes: Processes = _processes_field()
    collective_timeout_s: int = _collective_timeout_field()
    nodes: int = _nodes_field()
    rdzv_endpoint: str | None = _endpoint_field()
    max_restarts: int = _restarts_field()
    device: Literal["auto", "cpu", "cuda"] = "auto"
    save_every: int = Field(50, ge=1, le=10_000_000, **affects(OUTPUTS))
    # lora: adapters on the backbone (model.lora) + the head; the saved discriminator holds merged weights;
    # auto: lora on your own model (model.path set: a second full copy of a 7B model with its own AdamW state
    # would not fit beside the student), all on the embedded tiny student
    trainable: Literal["auto", "all", "lora"] = "auto"


ADVANTAGE = r"^[a-z][a-z0-9_]*$"  # a module of protege/rl/estimators, checked against it when the stage starts


class KLConfig(Section):
    """The KL term to the reference (rl.kl_beta its coefficient)."""
    estimator: Literal["k1", "k2", "k3", "low_var"] = "k3"
    placement: Literal["loss", "reward"] = "loss"


class OverlongConfig(Section):
    """DAPO's overlong shaping of answers that reach max_new_tokens."""
    filter: bool = False
    penalty_window: int = Field(0, ge=0, le=1_000_000)
    penalty: float = Field(1.0, ge=0, le=1000)


class DynamicSamplingConfig(Section):
    """DAPO's dynamic sampling: groups whose answers all score the same are replaced by fresh questions."""
    max_draws: int = Field(0, ge=0, le=1000)


class RewardSpec(Section):
    """One term of rl.rewards: weight x a function's reward for each answer."""
    # a NaN or infinite weight is reported by RLConfig, naming the entry
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=True)
    function: str     # "package.module:function", or judge (rl.judge's verdict)
    weight: float = 1.0


REWARD_FUNCTION = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")


LOSS_AGGREGATIONS = ("auto", "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "dr_grpo")


class RLConfig(SamplingConfig):
    algorithm: Literal["dr_grpo", "grpo", "ril"] = "ril"  # ril needs the teachers and disc_pretrain stages' outputs
    # the advantage estimator (protege/rl/estimators); null: the algorithm's own (ril: dr_grpo over its 2G group)
    advantage: str | None = Field(None, pattern=ADVANTAGE)
    steps: int = Field(100, ge=1, le=10_000_000, **affects(LENGTH))
    questions_per_step: int = Field(8, ge=1, le=1_000_000)
    group_size: int = Field(4, ge=2, le=1024)
    lr: float = Field(3e-4, gt=0, le=10)  # the tiny student's rate (a demo value: a 7B model wants ~1e-5)
    clip_eps: float = Field(0.2, gt=0, lt=1)
    # DAPO's clip-higher: the ratio's clip range [1 - clip_eps_low, 1 + clip_eps_high]; null: clip_eps
    clip_eps_low: float | None = Field(None, gt=0, lt=1, **affects(RESULTS, neutral=None))
    clip_eps_high: float | None = Field(None, gt=0, le=10, **affects(RESULTS, neutral=None))
    # how the per-token loss is averaged; auto: the algorithm's own (grpo: seq_mean_token_mean; dr_grpo, ril:
    # dr_grpo)
    loss_aggregation: Literal[LOSS_AGGREGATIONS] = Field("auto", **affects(RESULTS, neutral="auto"))
    kl_beta: float = Field(0.04, ge=0, le=1000)
    kl: KLConfig = Field(KLConfig(), **affects(RESULTS, neutral=KLConfig()))
    entropy_coef: float = Field(0.0, ge=0, le=1000, **affects(RESULTS, neutral=0.0))
    # passes over each step's answers, and the optimizer steps each pass takes (its answers shuffled into this
    # many mini-batches); pi_old is the policy that sampled, scored once before the first
    ppo_epochs: int = Field(1, ge=1, le=1000, **affects(RESULTS, neutral=1))
    mini_batches: int = Field(1, ge=1, le=1_000_000, **affects(RESULTS, neutral=1))
    overlong: OverlongConfig = Field(OverlongConfig(), **affects(RESULTS, neutral=OverlongConfig()))
    dynamic_sampling: DynamicSamplingConfig = Field(DynamicSamplingConfig(),
                                                    **affects(RESULTS, neutral=DynamicSamplingConfig()))
    repetition_penalty: float = Field(1.05, gt=0, le=100)
    # the world's answers (account + final answer) are at most 15 tokens with the end of turn, and Dr.GRPO
    # divides by this length (a demo value: it truncates a real model's answers; set it to what yours need)
    max_new_tokens: int = Field(16, ge=1, le=1_000_000)
    # lora: fresh adapters (model.lora) on the SFT weights; the KL reference is that model with adapters off
    trainable: Literal["attention+embeddings+head", "all", "attention", "lora"] = "attention+embeddings+head"
    save_every: int = Field(10, ge=1, le=10_000_000, **affects(OUTPUTS))
    # a checkpoint folder (the whole merged weights the merge stage and evaluation read, ~15 GB at 7B) every
    # this many saves and at the last; the training state (what trains, for resume) at every save
    checkpoint_every: int = Field(1, ge=1, le=10_000_000, **affects(OUTPUTS))
    # RIL (algorithm: ril) and its ablations
    w_sim: float = Field(1.0, ge=0, le=1000)               # weight of the discriminator similarity reward
    w_answer: float = Field(1.0, ge=0, le=1000)            # weight of the judge's correctness reward
    similarity: str = Field("binary", pattern=r"^(binary|continuous|levels:[0-9]+)$")
    discriminator: Literal["updated", "fixed"] = "updated"
    disc_updates: int = Field(1, ge=0, le=1000)            # mu_d: discriminator updates per step
    # null: the policy's rl.lr, as RIL trains the student and the discriminator at one static rate (its App. C)
    disc_lr: float | None = Field(None, gt=0, le=10)
    # lora: fresh adapters (model.lora) on the loaded discriminator; auto: lora with model.path set, else all
    disc_trainable: Literal["auto", "all", "lora"] = "auto"
    teachers: str = Field("both", min_length=1)   # "both" (every teacher) or one teacher's name
    teacher_in_group: bool = True                 # off: teacher answers train D but are not in the group
    judge: Literal["rule", "llm"] = "rule"
    judge_model: TeacherSpec | None = None        # judge: llm -> a text backend (openai or vllm)
    max_missing_fraction: float = Field(0.1, ge=0, le=1)  # questions without teacher answers: skip, or fail above this
    # the answer reward as a weighted sum of functions (protege/rewards/functions.py); empty: the judge alone
    rewards: list[RewardSpec] = Field([], max_length=64, **affects(RESULTS, neutral=[]))
    # generation: vllm samples in bf16 what the policy scores in its own precision: tis weights each sampled
    # token's surrogate by min(pi_old / pi_vllm, tis_cap) (truncated importance sampling); none trusts the engine
    rollout_correction: Literal["none", "tis"] = "tis"
    tis_cap: float = Field(2.0, ge=1, le=1000)
    vllm_sleep: bool = Field(True, **affects(NOTHING))  # vllm on CUDA: release the engine's memory during updates
    backend: Literal["torch", "deepspeed"] = "torch"     # deepspeed: ZeRO for the policy and discriminator updates
    zero_stage: Literal[2, 3] = 2
    micro_batch_tokens: int | None = _micro_batch_field()  # policy, reference and discriminator forwards
    processes: Processes = _processes_field()
    collective_timeout_s: int = _collective_timeout_field()
    nodes: int = _nodes_field()
    rdzv_endpoint: str | None = _endpoint_field()
    max_restarts: int = _restarts_field()
    device: Literal["auto", "cpu", "cuda"] = "auto"  # auto: cuda when available
    offload_idle: bool = Field(True, **affects(NOTHING))  # reference model / discriminator on the device only while used
    # learning curve: greedy accuracy on the world's val split at step 0, every eval_every steps and at the end
    eval_every: int = Field(20, ge=0, le=10_000_000)             # 0: no learning curve
    eval_items: int = Field(216, ge=1, le=10_000_000)  # val rows used (the first ones; the demo's whole val split)
    # the rl_baseline stage: the same run (seed, steps, lr, group size, ...) with this algorithm; null: none
    baseline: Literal["dr_grpo", "grpo", "ril"] | None = Field("dr_grpo", **affects(OUTPUTS))

    @field_validator("baseline", mode="before")
    @classmethod
    def _none_means_no_baseline(cls, v):
        return None if isinstance(v, str) and v.lower() == "none" else v

    @field_validator("rewards", mode="before")
    @classmethod
    def _rewards_are_entries(cls, v):
        # checked here, before pydantic's own errors, whose locations (rl.rewards.0.x) the one-line report
        # cannot name
        if not isinstance(v, (list, tuple)):
            return v
        for i, entry in enumerate(v):
            if isinstance(entry, RewardSpec):
                continue
            if not isinstance(entry, dict):
                raise ValueError(f"rl.rewards[{i}]: expected {{function: package.module:function, weight: 1.0}}, "
                                 f"got {entry!r}")
            unknown = sorted(set(entry) - {"function", "weight"})
            if unknown or not isinstance(entry.get("function"), str):
                raise ValueError(f"rl.rewards[{i}]: " + (f"unknown key(s) {unknown}" if unknown else
                                 "expects a function name (package.module:function, or judge)"))
            weight = entry.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ValueError(f"rl.rewards[{i}]: weight expects a number, got {weight!r}")
        return v

    @model_validator(mode="after")
    def _rewards_are_named(self) -> "RLConfig":
        seen: dict[str, int] = {}
        for i, spec in enumerate(self.rewards):
            if spec.function != "judge" and not REWARD_FUNCTION.match(spec.function):
                raise ValueError(f"rl.rewards[{i}]: function {spec.function!r}: expected package.module:function "
                                 "(a module importable from the project folder) or judge")
            if not math.isfinite(spec.weight):
                raise ValueError(f"rl.rewards[{i}]: weight {spec.weight} of {spec.function} is not finite")
            if spec.function in seen:
                raise ValueError(f"rl.rewards[{i}]: {spec.function} is already rl.rewards[{seen[spec.function]}] "
                                 "(give it one entry and its summed weight)")
            seen[spec.function] = i
        return self

    @model_validator(mode="after")
    def _judge_needs_model(self) -> "RLConfig":
        if self.judge == "llm" and (self.judge_model is None or self.judge_model.backend not in ("openai", "vllm")):
            raise ValueError("rl.judge 'llm' needs rl.judge_model with backend openai or vllm")
        return self

    @model_validator(mode="after")
    def _dapo_settings_fit(self) -> "RLConfig":
        window = self.overlong.penalty_window
        if window and window >= self.max_new_tokens:
            raise ValueError(f"rl.overlong.penalty_window ({window}) must be below rl.max_new_tokens "
                             f"({self.max_new_tokens}): the penalty grows over the last penalty_window tokens "
                             "before the cap")
        rows = self.questions_per_step * self.group_size
        if self.mini_batches > rows:
            raise ValueError(f"rl.mini_batches ({self.mini_batches}) must be at most the answers of a step "
                             f"(questions_per_step x group_size = {rows})")
        return self


MERGE_METHODS = ("uniform", "linear", "task_arithmetic", "ties", "dare_linear", "dare_ties", "breadcrumbs",
                 "breadcrumbs_ties", "model_stock", "slerp")


class MergeConfig(Section):
    """The merge stage's soup of the RL run's checkpoints (protege.merging, mergekit's semantics). Methods with
    a base (task_arithmetic, ties, dare_*, breadcrumbs*, model_stock, slerp) take the SFT checkpoint as
    base_model; slerp goes from it towards the last checkpoint only."""
    method: Literal[MERGE_METHODS] = "uniform"  # uniform: linear with equal weights
    parameters: dict[str, float | bool] = {}   # mergekit parameters (weight, density, lambda, t, gamma, ...)
    config: str | None = None                  # a mergekit YAML in the project: its merge_method, parameters,
    #                                            dtype and out_dtype are used, its models / base_model replaced
    seed: int = 0                               # random methods (dare_*)

    @field_validator("config")
    @classmethod
    def _config_inside_project(cls, v: str | None) -> str | None:
        if v is None:
            return v
        p = Path(v)
        if not v or p.is_absolute() or ".." in p.parts:
            raise ValueError(f"merge.config {v!r}: expected a YAML file relative to the project, such as "
                             "merge/ties.yaml")
        return p.as_posix()


class GridEnvConfig(Section):
    """The visual agent game (protege/world/envs/grid.py)."""
    size: int = Field(4, ge=2, le=64)
    walls: int = Field(4, ge=0, le=4094)
    max_turns: int = Field(8, ge=1, le=1000)
    legal_reward: float = Field(0.05, ge=-1000, le=1000)
    illegal_reward: float = Field(-0.5, ge=-1000, le=1000)
    success_reward: float = Field(1.0, ge=-1000, le=1000)


class Points24EnvConfig(Section):
    """The card game Points24 (protege/world/envs/points24.py, RL4VLM's gym-cards as GTR-Turbo plays it): make the
    target from the cards in the image, one formula token per turn; face cards count 10."""
    cards: Literal[4, 2] = 4                         # 4: + - * / ( ), target 24 | 2: + * only, target 12 (EZPoints)
    target: int | None = Field(None, ge=1, le=1_000_000)  # null: the setting's own (24 with 4 cards, 12 with 2)
    # tokens per episode, `=` included: at least the longest formula and `=` (12 with 4 cards, 4 with 2)
    max_turns: int = Field(15, ge=4, le=1000)
    correct_reward: float = Field(10.0, ge=-1000, le=1000)  # on `=` when the formula makes the target with every card
    wrong_reward: float = Field(-1.0, ge=-1000, le=1000)    # a wrong `=`, an illegal token, no `=` by max_turns

    @model_validator(mode="after")
    def _formula_fits(self) -> "Points24EnvConfig":
        need = {4: 12, 2: 4}[self.cards]
        if self.max_turns < need:
            raise ValueError(f"max_turns must be at least {need} with {self.cards} cards (the longest formula the "
                             f"solver writes, and =), got {self.max_turns}")
        return self


class AgentSFTConfig(Section):
    """Warm start on the scripted solver's episodes (train seeds)."""
    episodes: int = Field(1500, ge=1, le=10_000_000)
    steps: int = Field(1200, ge=1, le=10_000_000)
    batch_size: int = Field(32, ge=1, le=1_000_000)   # rows: turns under context "current", else episodes
    micro_batch_tokens: int | None = _micro_batch_field()
    lr: float = Field(2e-3, gt=0, le=10)
    log_every: int = Field(25, ge=1, le=10_000_000, **affects(NOTHING))
    # steps between training states: a re-run resumes
    save_every: int = Field(200, ge=1, le=10_000_000, **affects(OUTPUTS))


class GTRConfig(Section):
    """GTR-Turbo: the merge of the running job's checkpoints as a free teacher."""
    guidance: Literal["none", "sft", "kl"] = "none"
    # cumulative average | EMA | TIES over every task vector | TIES of the last merge and the new checkpoint with
    # weights (k-1)/k and 1/k (GTR-Turbo's code as it intends; see rl/merged_teacher.py)
    merge: Literal["average", "ema", "ties", "ties_running"] = "ties_running"
    # a checkpoint joins the merge after every PPO epoch (GTR-Turbo's code saves one per epoch) or every update
    merge_every: Literal["epoch", "update"] = "epoch"
    # control arms: running (the merge goes on) | init (the teacher stays the warm start: a KL anchor to it) |
    # first (the teacher stops after the first update's merge, which is what the code's teacher does as written)
    teacher: Literal["running", "init", "first"] = "running"
    ema_alpha: float = Field(0.1, gt=0, le=1)
    ties_density: float = Field(0.8, gt=0, le=1)
    sft_coef: float = Field(1.0, ge=0, le=1000)      # weight of the CE on the merged model's thoughts
    sft_contexts: int = Field(16, ge=1, le=1_000_000)  # observations per step the merged model writes thoughts for
    # how the merged model samples the thoughts it teaches (GTR-Turbo's code: temperature 0.2, top-k 5)
    teacher_temperature: float = Field(0.2, gt=0, le=100)
    teacher_top_k: int = Field(5, ge=0, le=1_000_000)
    # each turn pays kl_coef * mean over its thought tokens of clamp(log pi - log pi_merged, 0, kl_clamp), in the
    # reward's units: the code's coefficient 1 against a +10 success is 0.1 against the grid game's 1.0
    kl_coef: float = Field(0.1, ge=0, le=1000)
    kl_clamp: float = Field(10.0, gt=0, le=1000)
    # return: taken off that turn's return after the advantages are estimated (GTR-Turbo's code: it moves that
    # turn's advantage and value target, no earlier turn's) | reward: off the turn's reward before estimation
    kl_target: Literal["return", "reward"] = "return"
    # what a turn whose output does not split into a thought and an action pays instead of its KL (times kl_coef):
    # there is no thought to compare, and GTR-Turbo's code charges 100, ten times its clamp; null: the clamped
    # KL over all the turn's tokens
    kl_unparsed: float | None = Field(100.0, ge=0, le=1e6)
    # GTR-Turbo's format reward while guidance is on (sft or kl; plain PPO has none, as RL4VLM's code): each turn's
    # return gains format_reward when its output splits into a thought and an action, else format_penalty, after
    # the advantages are estimated. The code's +3 / -2 against its +10 success; 0.3 / -0.2 against the grid's 1.0
    format_reward: float = Field(0.3, ge=-1e6, le=1e6)
    format_penalty: float = Field(-0.2, ge=-1e6, le=1e6)


class GTPOConfig(Section):
    """GTPO (arXiv 2511.14846): turn-level discounted returns and code-similarity shaping of failed episodes."""
    gamma: float = Field(0.9, ge=0, le=1)             # R_ij = sum_{m>=j} gamma^(m-j) r_im
    # which returns a turn's is normalised against: the group's at the same turn index (turn j across the G
    # episodes; the paper's text does not say, see docs/gtpo.md), the group's (all turns), or the batch's
    scope: Literal["group", "batch", "turn"] = "turn"
    shaping_alpha: float = Field(0.5, ge=0, le=100)   # failed episode's final reward += alpha * mean cos to successes
    embedder: str | None = None                       # a local sentence-embedding model folder; null: hashing vectoriser


class PPOConfig(Section):
    """PPO over turns (GTR-Turbo's base, as RL4VLM): a value head on the policy, GAE, several epochs per batch."""
    gamma: float = Field(0.9, ge=0, le=1)
    lam: float = Field(0.95, ge=0, le=1)
    clip_eps: float = Field(0.1, gt=0, lt=1)          # PPO's ratio clip (agent.rl.clip_eps is the GRPO family's)
    epochs: int = Field(4, ge=1, le=1000)             # passes over each step's episodes
    value_coef: float = Field(0.5, ge=0, le=1000)     # loss += value_coef * 0.5 * mean (V - GAE target)^2
    # RL4VLM's clipped value loss: V moves at most value_clip from its value at play time per update (the code's
    # clip_param, 0.1); null: the plain squared error
    value_clip: float | None = Field(0.1, gt=0, le=1000)
    max_grad_norm: float = Field(0.01, gt=0, le=1e6)  # the update's gradient norm clip (RL4VLM's and GTR-Turbo's: 0.01)
    # the first value_warmup_steps RL steps train the value head alone on the frozen policy's features (verl's
    # critic_warmup): the policy's first updates then follow advantages from a fitted V, not from V = 0
    value_warmup_steps: int = Field(0, ge=0, le=10_000_000, **affects(RESULTS, neutral=0))
    # token: a ratio per token at temperature 1 | rl4vlm (RL4VLM's and GTR-Turbo's code): one ratio per output (turn)
    # from thought_weight * its thought tokens' log-prob + its other tokens', at the sampling temperature
    objective: Literal["token", "rl4vlm"] = "token"
    thought_weight: float = Field(0.5, ge=0, le=100)


class AgentRLConfig(SamplingConfig):
    # grpo | dr_grpo: one advantage per episode on all its tokens; gtpo: one per turn, from discounted returns;
    # ppo: one per turn, from GAE with a value head on the policy (ppo section)
    algorithm: Literal["grpo", "dr_grpo", "gtpo", "ppo"] = "grpo"
    advantage: str | None = Field(None, pattern=ADVANTAGE)  # the advantage estimator; null: the algorithm's own
    steps: int = Field(40, ge=1, le=10_000_000, **affects(LENGTH))
    seeds_per_step: int = Field(4, ge=1, le=1_000_000)   # layouts per step; each is played group_size times
    group_size: int = Field(4, ge=2, le=1024)
    lr: float = Field(1e-4, gt=0, le=10)
    # constant, or cosine to 10% of lr by the last step (GTR-Turbo's code anneals its rate)
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0, le=10_000_000)
    clip_eps: float = Field(0.2, gt=0, lt=1)
    kl_beta: float = Field(0.0, ge=0, le=1000)           # k3 KL to the SFT policy
    # lora: fresh adapters (model.lora); the merged teacher merges the adapted weights W + scale * B A
    trainable: Literal["attention+embeddings+head", "all", "attention", "lora"] = "all"
    save_every: int = Field(10, ge=1, le=10_000_000, **affects(OUTPUTS))
    # a checkpoint folder (the whole merged weights the merge stage and evaluation read, ~15 GB at 7B) every
    # this many saves and at the last; the training state (what trains, for resume) at every save
    checkpoint_every: int = Field(1, ge=1, le=10_000_000, **affects(OUTPUTS))
    # held-out curve: every eval_every steps (and the last) the policy and GTR-Turbo's merged teacher play the first
    # eval_episodes held-out layouts greedily (eval_success, teacher_eval_success); 0: no curve
    eval_every: int = Field(0, ge=0, le=10_000_000, **affects(OUTPUTS))
    eval_episodes: int = Field(32, ge=1, le=1_000_000, **affects(OUTPUTS))
    max_new_tokens: int = Field(48, ge=1, le=1_000_000)
    repetition_penalty: float = Field(1.0, gt=0, le=100)  # RL4VLM's and GTR-Turbo's code sample with 1.2
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # deepspeed: ZeRO for the policy's update, in one process (episodes are played by one process)
    backend: Literal["torch", "deepspeed"] = "torch"
    zero_stage: Literal[2, 3] = 2
    micro_batch_tokens: int | None = _micro_batch_field()
    processes: Processes = _processes_field()
    collective_timeout_s: int = _collective_timeout_field()
    nodes: int = _nodes_field()
    rdzv_endpoint: str | None = _endpoint_field()
    max_restarts: int = _restarts_field()
    gtr: GTRConfig = GTRConfig()
    gtpo: GTPOConfig = GTPOConfig()
    ppo: PPOConfig = PPOConfig()

    @model_validator(mode="after")
    def _rl4vlm_objective(self):
        if self.ppo.objective == "rl4vlm" and self.algorithm != "ppo":
            raise ValueError("ppo.objective rl4vlm is PPO's objective: set algorithm: ppo")
        if self.ppo.objective == "rl4vlm" and self.kl_beta > 0:
            raise ValueError("ppo.objective rl4vlm has no KL term to the warm start (RL4VLM's code has none): "
                             "set kl_beta: 0, or objective: token")
        return self

    @model_validator(mode="after")
    def _policy_updated(self):
        if self.algorithm == "ppo" and self.ppo.value_warmup_steps >= self.steps:
            raise ValueError(f"ppo.value_warmup_steps ({self.ppo.value_warmup_steps}) must be below steps "
                             f"({self.steps}): the warm-up steps train the value head alone, so the policy would "
                             "never be updated")
        return self

    @field_validator("generation")
    @classmethod
    def _transformers_only(cls, v: str) -> str:
        if v != "transformers":  # refused, not ignored: the setting would otherwise enter fingerprints unused
            raise ValueError("is vllm, but the multi-turn loop samples with transformers only (one batched generate per "
                             "turn, protege/rollout/episodes.py); use transformers")
        return v


class AgentConfig(Section):
    """Multi-turn visual agent RL (GTR-Turbo): a game (grid navigation or the Points24 card game), warm start,
    RL, success-rate evaluation."""
    # the game: its settings are the section of the same name below
    env: Literal["grid", "points24"] = "grid"
    # what the policy sees each turn: the current observation only (a Markov policy, as in GTR-Turbo's games)
    # or the whole conversation so far
    context: Literal["current", "full"] = "current"
    grid: GridEnvConfig = GridEnvConfig()
    points24: Points24EnvConfig = Points24EnvConfig()
    sft: AgentSFTConfig = AgentSFTConfig()
    # PPO, GTR-Turbo's base, with its KL guidance to the merge of the run's checkpoints, the rate annealed as
    # GTR-Turbo's code anneals it. A sub-section given in part keeps these (see Section._declared_defaults).
    # The value head fits alone for 5 steps first (not in GTR-Turbo's code, docs/deviations.md).
    rl: AgentRLConfig = AgentRLConfig(algorithm="ppo", schedule="cosine", gtr=GTRConfig(guidance="kl"),
                                      ppo=PPOConfig(value_warmup_steps=5))
    eval_episodes: int = Field(200, ge=1, le=1_000_000, **affects(OUTPUTS))  # held-out seeds: the success rate
    eval_batch: int = Field(64, ge=1, le=1_000_000, **affects(OUTPUTS))


class ToolTaskConfig(Section):
    """The tool-use environment (protege/world/envs/tool.py): questions about an image that need exact
    computation, answered with python tool calls and a final \\boxed{} answer."""
    kinds: list[Literal["arithmetic", "chart", "count"]] = Field(default_factory=lambda: ["arithmetic", "chart", "count"],
                                                                min_length=1)
    max_tool_calls: int = Field(2, ge=0, le=100)
    correct_reward: float = Field(1.0, ge=-1000, le=1000)
    # GTPO's format term: -0.1 for a turn with a format error (neither code nor a boxed answer) or no tool call
    format_penalty: float = Field(-0.1, ge=-1000, le=1000)
    no_tool_penalty: float = Field(-0.1, ge=-1000, le=1000)      # on a final answer no tool call came before
    # on the turn whose code failed; GTPO has none (0), -0.2 was this project's own earlier default
    tool_error_penalty: float = Field(0.0, ge=-1000, le=1000)
    tool_output_chars: int = Field(200, ge=1, le=1_000_000)      # tool output the model reads back


class SandboxConfig(Section):
    """Limits of one execution of model-written code (protege/tools/sandbox.py)."""
    timeout_s: float = Field(5.0, gt=0, le=3600)
    cpu_s: int = Field(5, ge=1, le=3600)
    memory_mb: int = Field(512, ge=32, le=1_000_000)
    nproc: int = Field(16, ge=1, le=100_000)
    output_bytes: int = Field(4096, ge=1, le=100_000_000)
    file_mb: int = Field(16, ge=0, le=1_000_000)      # the largest file it can write
    disk_mb: int = Field(64, ge=1, le=1_000_000)      # all it can write (its folder is a tmpfs of this size)
    # true runs model code WITHOUT isolation (rlimits and a temp dir only) where bubblewrap is missing
    unsafe: bool = False


class ToolConfig(Section):
    """Multi-turn tool-integrated reasoning (GTPO) on the tool environment: tool_sft -> tool_rl."""
    env: Literal["tool"] = "tool"
    # the whole conversation: a tool turn has no image and no question, so a Markov policy would lose the task
    context: Literal["full"] = "full"
    task: ToolTaskConfig = ToolTaskConfig()
    sandbox: SandboxConfig = SandboxConfig()
    sft: AgentSFTConfig = AgentSFTConfig(steps=800)
    # share of the solver's product episodes whose first program forgets `import math` and is fixed in the
    # next tool call: runtime errors in the warm start that RL can learn to avoid
    solver_slips: float = Field(0.5, ge=0, le=1)
    rl: AgentRLConfig = AgentRLConfig(algorithm="gtpo", max_new_tokens=64)  # the longest solver turn: 52 tokens
    eval_episodes: int = Field(200, ge=1, le=1_000_000, **affects(OUTPUTS))  # held-out questions (eval seeds)
    eval_batch: int = Field(64, ge=1, le=1_000_000, **affects(OUTPUTS))


class EvaluateConfig(Section):
    """`benchmarks: mini` evaluates on the world's 14 mini benchmarks; a map NAME: PATH reads real files
    (VLMEvalKit .tsv, lmms-eval .parquet, MM-Vet .json) from those paths instead; nothing is downloaded."""
    batch_size: int = Field(64, ge=1, le=1_000_000)
    max_new_tokens: int = Field(16, ge=1, le=1_000_000)
    generation: Literal["transformers", "vllm"] = "transformers"  # vllm: one engine per evaluated model (GPU)
    # vllm: the engine's context (prompt + answer tokens); null: the longest prompt of the benchmarks and the test
    # split, measured through the model's processor before the first engine starts, plus max_new_tokens
    vllm_max_model_len: int | None = Field(None, ge=16, le=10_000_000, **affects(NOTHING))
    benchmarks: Literal["mini"] | dict[str, str] = "mini"
    mini_items: int = Field(24, ge=4, le=1_000_000)  # items per mini benchmark (MMBench: / 4 questions x 4 copies)
    protocol: Literal["lmms-eval", "lenient", "vlmevalkit"] = "lmms-eval"  # lenient: our generous reading;
    #                                                                         vlmevalkit: its multiple-choice matching
    judge: JudgeSpec | None = None             # MM-Vet grader + extraction fallback (openai/vllm); null: rules
    bootstrap: int = Field(1000, ge=100, le=1_000_000)       # resamples for the 95% confidence intervals
    mmvet_grader_prompt: str | None = None     # a text file replacing the grader prompt (default: the protocol's own)

    @model_validator(mode="after")
    def _known_benchmarks(self) -> "EvaluateConfig":
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
    margin: float = Field(0.0, ge=0, le=100)           # points of the benchmark average the candidate must gain


GPU_STAGES = ("sft", "rollouts", "rl", "rl_baseline", "agent_sft", "agent_rl", "tool_sft", "tool_rl", "evaluate")


class OrchestrationConfig(Section):
    """Where each stage runs when a deployment dispatches stages to work pools (flows/pipeline.py with
    dispatch 'pools'): a logical pool name per stage, `default_pool` for the rest. Each logical pool is
    served by the deployment `protege-stage/stage-<pool>` (prefect.yaml), which names the real work pool;
    `make serve` points every one at its single local process pool. Not a DVC param: it moves work, it
    does not change results."""
    default_pool: str = Field("cpu", pattern=r"^[a-z0-9-]+$", **affects(NOTHING))
    stage_pools: dict[str, str] = Field(default_factory=lambda: {s: "gpu" for s in GPU_STAGES}, **affects(NOTHING))
    # inline runs (`protege pipeline`, `make demo`): stages of independent branches at once (the question
    # chain beside the agent and tool games); 1 runs them one by one (a single GPU one stage fills)
    jobs: int = Field(2, ge=1, le=64, **affects(NOTHING))

    @field_validator("stage_pools")
    @classmethod
    def _known_stages(cls, v: dict[str, str]) -> dict[str, str]:
        for stage, pool in v.items():
            if stage not in STAGES:
                raise ValueError(f"orchestration.stage_pools: unknown stage {stage!r}; expected one of "
                                 f"{', '.join(STAGES)}")
            if not re.fullmatch(r"[a-z0-9-]+", str(pool)):
                raise ValueError(f"orchestration.stage_pools.{stage}: pool name {pool!r}: use a-z, 0-9 and '-'")
        return v

    def pool_of(self, stage: str) -> str:
        return self.stage_pools.get(stage, self.default_pool)


class TrackingConfig(Section):
    """Where stages record their params and metrics. MLflow is always on: it is the record of lineage (which
    run wrote which DVC output, the registered models), so a list without it is refused rather than quietly
    extended. wandb and TensorBoard get the same params and metrics beside it (optional extras)."""
    loggers: list[Literal["mlflow", "wandb", "tensorboard"]] = Field(default_factory=lambda: ["mlflow"],
                                                                      **affects(NOTHING))

    @field_validator("loggers")
    @classmethod
    def _mlflow_stays(cls, v: list[str]) -> list[str]:
        if "mlflow" not in v:
            raise ValueError(f"{v} leaves out mlflow: MLflow is always on (it records which run wrote which "
                             "output and holds the model registry); keep it in the list, e.g. [mlflow, tensorboard]")
        if len(set(v)) != len(v):
            raise ValueError(f"{v} names a logger twice")
        return v


class Config(Section):
    seed: int = 0
    # torch threads per stage process; 0: torch's default (all cores)
    threads: int = Field(1, ge=0, le=4096, **affects(NOTHING))
    data: DataConfig = DataConfig()
    world: WorldConfig = WorldConfig()
    model: ModelConfig = ModelConfig()
    curate: CurateConfig = CurateConfig()
    teachers: TeachersConfig = TeachersConfig()
    sft: SFTConfig = SFTConfig()
    rollouts: RolloutsConfig = RolloutsConfig()
    disc_pretrain: DiscPretrainConfig = DiscPretrainConfig()
    rl: RLConfig = RLConfig()
    merge: MergeConfig = MergeConfig()
    agent: AgentConfig = AgentConfig()
    tool: ToolConfig = ToolConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    promote: PromoteConfig = PromoteConfig()
    orchestration: OrchestrationConfig = OrchestrationConfig()
    tracking: TrackingConfig = TrackingConfig()

    @model_validator(mode="after")
    def _files_need_a_model(self) -> "Config":
        if self.data.source == "files" and self.model.path is None:
            raise ValueError("data.source is files: set model.path to your model's folder (the embedded tiny "
                             "student knows only the world's vocabulary)")
        return self

    @model_validator(mode="after")
    def _processes_need_deepspeed(self) -> "Config":
        for key, sec in (("sft", self.sft), ("disc_pretrain", self.disc_pretrain), ("rl", self.rl),
                         ("agent.rl", self.agent.rl), ("tool.rl", self.tool.rl)):
            if sec.processes != "auto" and sec.processes > 1 and sec.backend != "deepspeed":
                raise ValueError(f"{key}.processes is {sec.processes}: several processes need {key}.backend: "
                                 "deepspeed (the torch backend trains in one process)")
        return self

    @model_validator(mode="after")
    def _rl_teachers_exist(self) -> "Config":
        if self.rl.teachers != "both" and self.rl.teachers not in self.teachers.names:
            raise ValueError(f"rl.teachers is {self.rl.teachers!r}: expected 'both' or one of teachers.pool "
                             f"{self.teachers.names}")
        return self


def discriminator_trainable(setting: str, model: "ModelConfig") -> str:
    """`all` or `lora` for a discriminator setting that may be `auto` (lora on a user's own model)."""
    if setting != "auto":
        return setting
    return "lora" if model.path is not None else "all"


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


def _is_section(model: type[BaseModel], loc: tuple) -> bool:
    current = model
    for part in loc:
        field = current.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return False
        ann = field.annotation
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return False
        current = ann
    return True


def _one_line(path: Path, err: ValidationError, text: str = "") -> str:
    first = err.errors()[0]
    loc = tuple(first["loc"])
    key = ".".join(str(p) for p in loc) or "<root>"
    line = key_line(text, loc) if text else None
    if line is not None:
        path = f"{path}:{line}"
    if first["type"] == "extra_forbidden":
        parent = Config
        for part in loc[:-1]:
            parent = parent.model_fields[part].annotation
        allowed = ", ".join(parent.model_fields)
        msg = f"{path}: unknown key '{key}' (allowed here: {allowed})"
    elif first["type"] in {"value_error", "assertion_error"}:
        text_msg = first["msg"].removeprefix("Value error, ")
        leaf = _expected(Config, loc) not in ("?",) and loc and not _is_section(Config, loc)
        msg = f"{path}: key '{key}' {text_msg}" if leaf else f"{path}: {text_msg}"
    else:
        got = first.get("input")
        msg = (f"{path}: key '{key}' expects {_expected(Config, loc)}: {first['msg']}"
               f" (got {got!r})")
    more = len(err.errors()) - 1
    return msg + (f" [and {more} more problem(s)]" if more else "")


def read_params(path: str | Path) -> tuple[dict, str]:
    """(the params mapping, its text), read strictly (see `read_yaml_file`)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ConfigError(f"{path}: no such params file (run from the project root or pass --params)")
    raw, text = read_yaml_file(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:1: expected a mapping of sections (world:, sft:, rl:, ...) at the top level, "
                          f"got {type(raw).__name__}")
    return raw, text


def load_config(path: str | Path = "params.yaml") -> Config:
    path = Path(path)
    raw, text = read_params(path)
    try:
        return Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_one_line(path, err, text)) from None
