"""A study file: variants (overrides of the project's params.yaml) x seeds, a baseline variant, claims.

```yaml
name: ril_tables                 # default: the file's stem; outputs go to reports/study/<name>*
seeds: [1, 2, 3]                 # every trained variant runs once per seed (the top-level `seed` of params)
baseline: ril                    # every variant's paired difference is taken against this one
model: rl_final                  # the checkpoint the tables compare: rl_final (last RL step) | merged
common: {rl.algorithm: ril}      # overrides applied to every variant, before the variant's own
variants:
  sft: {train: false}            # evaluate the SFT checkpoint, no RL: runs once (greedy evaluation)
  ril: {}                        # params.yaml + common as they are
  dr_grpo: {rl.algorithm: dr_grpo}
  kl0: {rl: {kl_beta: 0}}        # dotted keys and nested mappings are the same thing
claims:
  - {name: "RIL beats Dr.GRPO", better: ril, than: dr_grpo, metric: benchmark_average}
services:                        # started by the study while a run's config points at them
  judge: {kind: loopback_judge, port: 18765}
```

`task: agent` compares multi-turn agent RL runs instead (the agent_rl stage from models/agent_sft):
variants may change `agent.rl.*` and the evaluation's `agent.eval_episodes` / `agent.eval_batch`; a
`train: false` variant evaluates the warm start; `model: rl_final` is the last RL checkpoint and
`model: merged` GTR-Turbo's merged teacher; claims compare `success`, `entropy` or `format_errors`.

`task: tool` is the same on the tool environment (the tool_rl recipe from models/tool_sft, e.g. GTPO vs
GRPO): variants may change `tool.rl.*`, `tool.eval_episodes` and `tool.eval_batch`; claims compare
`accuracy` (default), `runtime_errors` (episodes with at least one failed tool call), `tool_calls` (per
episode) or `entropy`. For `format_errors` and `runtime_errors` lower is better: a claim "A better than B"
on them is reproduced when A has fewer.

`warm_start_seeds: [0, 1]` gives the study warm starts of its own, one per seed listed, trained before the
runs into reports/study/<name>/warm_starts/seed-<w>/ (the one whose seed is params.yaml's `seed` is the
project's, linked): a game study's warm-start recipe (agent_sft / tool_sft); a qa study's sft, curate,
teachers, rollouts and disc_pretrain, whose outputs (models/sft, data/curated, data/teacher_answers.parquet,
data/rollouts, models/discriminator) its runs link in place of the project's. The i-th of `seeds` plays from
warm_start_seeds[i mod n]; a `train: false` variant then runs once per seed, so every difference stays paired.

`project_params: {agent.env: points24}` names settings params.yaml must already hold (what the shared warm start
was made with): the study refuses to load otherwise, rather than silently run another game.

`game: {agent.env: points24, agent.points24.cards: 2}` gives a game study (agent or tool) a game of its own
instead: settings of the game's section that its warm start is made with (`agent.env`, `agent.points24.*`,
`agent.grid.*`, `agent.context`, `agent.sft.*`; `tool.task.*`, `tool.sft.*`; not the RL section nor the
evaluation's size, which `common` and the variants set). They apply to params.yaml before `common` and every
variant, and to the warm starts, which the study then trains itself (`warm_start_seeds` is required): a warm
start's fingerprint holds the game it was made with, and params.yaml's own (models/<task>_sft) is linked for
its seed only when the game settings change nothing there, so a grid warm start never plays EZPoints.

A file with `parts:` holds several studies (each a body as above, under its own key; the file's `seeds`
and `bootstrap` are every part's unless it sets its own). `protege study` runs all their runs in one
queue and writes every part's claims in one table (`report:`, e.g. reports/results.md):

```yaml
name: headline
seeds: [1, 2, 3]
report: reports/results.md
parts:
  ril: {task: qa, baseline: ril, variants: {...}, claims: [...]}
  gtpo: {task: tool, baseline: grpo, variants: {...},
         claims: [{better: gtpo, than: grpo, metric: accuracy, margin: 1.0}]}   # "gtpo >= grpo" within 1 point
```

A study may declare `preconditions:` that its claims `requires:` (by name): what must hold in a variant's
runs before a claim is judged, each with its criterion fixed in the file. A claim whose preconditions are
not met reads "precondition not met", with the measurement, instead of a verdict (protege.study.preconditions):

```yaml
preconditions:
  - {name: collapses, variant: plain, metric: distinct_thoughts_per_state, kind: collapse, ratio: 0.5, window: 5}
  - {name: teacher_leads, variant: gtr_kl, metric: teacher_eval_success, than: eval_success,
     kind: at_least_part_of_run}
  - {name: disc_separates, variant: ril, metric: disc_pretrain.heldout_auroc, kind: above, threshold: 0.6}
  - {name: similarity_in_range, variant: ril, metric: similarity_reward_student, kind: between, lo: 0.3, hi: 0.7}
claims:
  - {better: gtr_kl, than: plain, requires: [collapses, teacher_leads]}
```

Every variant is validated by the same schema as params.yaml (`protege.config.Config`). Variants share
the project's upstream artifacts (world, SFT checkpoint, curated questions, teacher answers,
discriminator, mini benchmarks), so they may only change `rl.*`, `merge.*` and `evaluate.*` (not
`evaluate.mini_items`, which sizes the shared mini benchmarks); `seed` comes from `seeds`. Any problem
stops with one line naming the file and the key.
"""
from __future__ import annotations

import copy
import json
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from protege.config import Config, ConfigError, _expected, load_config, read_params, read_yaml_file
from protege.bench.items import BENCHMARKS

NAME = r"^[A-Za-z0-9_.-]+$"
VARIANT_SECTIONS = ("rl", "merge", "evaluate")
UPSTREAM_KEYS = {"evaluate.mini_items": "it sizes the shared mini benchmarks (data/benchmarks)"}
METRICS = ("world_test", "benchmark_average", *BENCHMARKS)
GAME_TASKS = ("agent", "tool")           # tasks that run the multi-turn recipe on the game of that name
GAME_METRICS = {"agent": ("success", "entropy", "format_errors"),
                "tool": ("accuracy", "runtime_errors", "tool_calls", "entropy")}  # the first is a claim's default
AGENT_METRICS = GAME_METRICS["agent"]
LOWER_IS_BETTER = ("format_errors", "runtime_errors")


def game_keys(task: str) -> tuple[str, ...]:
    """What a game study's variants may change: everything else feeds the shared warm start."""
    return (f"{task}.rl", f"{task}.eval_episodes", f"{task}.eval_batch")


AGENT_KEYS = game_keys("agent")
PRECONDITION_KINDS = ("collapse", "at_least_part_of_run", "above", "between")
KIND_FIELDS = {"collapse": ("direction", "ratio", "threshold", "window"), "at_least_part_of_run": ("than", "points"),
               "above": ("threshold", "at"), "between": ("lo", "hi", "at")}
# what a precondition may measure: a training curve's metric (per step, as the loop logs it) or a figure of an
# upstream stage the runs share (reports/stages/<stage>.json, recorded in each run's result)
GAME_CURVE_METRICS = ("success_rate", "format_error_rate", "turns_per_episode", "entropy", "reward", "return",
                      "kl_merged", "kl_penalty", "thought_entropy", "distinct_thoughts_per_state", "thought_self_bleu",
                      "thought_tokens", "eval_success", "teacher_eval_success", "accuracy", "runtime_error_rate",
                      "tool_calls_per_episode", "shaping_reward_mean")
CURVE_METRICS = {"qa": ("reward", "answer_reward_student", "answer_reward_teacher", "similarity_reward_student",
                        "similarity_reward_teacher", "disc_accuracy", "disc_auroc", "disc_score_student", "disc_score_teacher",
                        "entropy", "kl", "response_length"),
                 "agent": GAME_CURVE_METRICS, "tool": GAME_CURVE_METRICS}
UPSTREAM_METRICS = {"qa": ("disc_pretrain.heldout_auroc", "disc_pretrain.heldout_accuracy"), "agent": (), "tool": ()}
MODELS = ("rl_final", "merged")
STUDY_DIR = Path("reports/study")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClaimSpec(_Strict):
    better: str
    than: str
    name: str = ""
    metric: str | None = None              # world_test | benchmark_average (default) | one benchmark's name;
    #                                        an agent study: success (default) | entropy | format_errors;
    #                                        a tool study: accuracy (default) | runtime_errors | tool_calls | entropy
    model: Literal["rl_final", "merged"] | None = None  # default: the study's model
    margin: float = Field(0.0, ge=0)       # > 0: "better >= than": reproduced when the CI of better - than lies
    #                                        above -margin (the metric's points), i.e. better is not worse by more
    requires: list[str] = []               # preconditions (by name) that must be met for a verdict


class PreconditionSpec(_Strict):
    """What must hold in a variant's runs for a claim that requires it to be judged (see protege.study.preconditions)."""
    name: str = Field(pattern=NAME)
    variant: str
    metric: str                            # a training curve's metric (a column of the run's train_curve.csv), or
    #                                        an upstream stage's figure (disc_pretrain.heldout_auroc)
    kind: Literal[PRECONDITION_KINDS]  # type: ignore[valid-type]
    direction: Literal["down", "up"] = "down"   # collapse: the metric falls (down) or rises (up)
    ratio: float | None = Field(None, gt=0)     # collapse: end <= ratio x start (down) / end >= ratio x start (up)
    threshold: float | None = None              # collapse: end <= threshold (down) / >= (up); above: value > threshold
    window: int = Field(1, ge=1)                # collapse: curve points averaged at the start and at the end
    than: str | None = None                     # at_least_part_of_run: metric >= than at some curve point
    points: int = Field(1, ge=1)                # at_least_part_of_run: at this many points or more
    at: Literal["first", "last"] = "first"      # above / between: which point of a curve is measured
    lo: float | None = None                     # between: lo <= value <= hi
    hi: float | None = None
    seeds: Literal["majority", "all"] = "majority"  # met: on more than half of the finished seeds, or on every one


class ServiceSpec(_Strict):
    kind: Literal["loopback_judge"] = "loopback_judge"  # protege.loopback_server --judge
    port: int = Field(ge=1024, le=65535)
    latency_s: float = Field(0.0, ge=0)


class StudyFile(_Strict):
    seeds: list[int]
    baseline: str
    variants: dict[str, dict[str, Any] | None]
    name: str | None = Field(None, pattern=NAME)
    # qa: the rl stage on questions; agent: agent_rl on the grid game; tool: the tool_rl recipe on the tool game
    task: Literal["qa", "agent", "tool"] = "qa"
    description: str = ""
    model: Literal["rl_final", "merged"] = "rl_final"
    bootstrap: int = Field(1000, ge=100)
    keep_checkpoints: bool = False         # false: a finished run keeps its result files only
    common: dict[str, Any] = {}
    # settings params.yaml must already hold (not overrides): what the shared warm start was made with, e.g.
    # {agent.env: points24}; the study refuses to load otherwise
    project_params: dict[str, Any] = {}
    # a game study's own game (overrides of params.yaml's game section that its warm start is made with, e.g.
    # {agent.env: points24, agent.points24.cards: 2}): every run and the study's own warm starts play it
    game: dict[str, Any] = {}
    claims: list[ClaimSpec] = []
    preconditions: list[PreconditionSpec] = []
    services: dict[str, ServiceSpec] = {}
    # the study's own warm starts, one per seed listed: a game study's warm-start recipe (agent_sft / tool_sft),
    # a qa study's sft, curate, teachers, rollouts and disc_pretrain (protege.study.warm_starts); the i-th of
    # `seeds` plays from warm_start_seeds[i mod n], so every arm meets every warm start; params.yaml's own seed
    # is the project's warm start; empty: the project's warm start for every seed
    warm_start_seeds: list[int] = []


class SuiteFile(_Strict):
    parts: dict[str, Any]                  # part name -> a study body (task, baseline, variants, claims, ...)
    name: str | None = Field(None, pattern=NAME)
    description: str = ""
    seeds: list[int] | None = None         # every part's, unless the part sets its own
    bootstrap: int | None = Field(None, ge=100)
    report: str | None = None              # the claims of every part in one markdown table (in the project)


@dataclass(frozen=True)
class Variant:
    name: str
    train: bool                            # false: evaluate the SFT checkpoint, no RL
    overrides: dict[str, Any]              # the variant's own, flattened, with resolved values
    config: Config                         # params.yaml <- common <- the variant (seed: the first seed)


@dataclass(frozen=True)
class RunSpec:
    variant: str
    seed: int
    train: bool
    config: Config                         # with this run's seed
    overrides: dict[str, Any]
    warm_seed: int | None = None           # the study's own warm start it plays from (None: the project's)

    @property
    def key(self) -> str:
        return f"{self.variant}/seed-{self.seed}"


@dataclass(frozen=True)
class Claim:
    name: str
    better: str
    than: str
    metric: str
    model: str
    margin: float = 0.0
    requires: tuple[str, ...] = ()         # preconditions that must be met for a verdict


@dataclass(frozen=True)
class Precondition:
    """One precondition with its kind's parameters (PreconditionSpec's fields, validated)."""
    name: str
    variant: str
    metric: str
    kind: str
    direction: str = "down"
    ratio: float | None = None
    threshold: float | None = None
    window: int = 1
    than: str | None = None
    points: int = 1
    at: str = "first"
    lo: float | None = None
    hi: float | None = None
    seeds: str = "majority"


@dataclass
class Study:
    path: Path
    project: Path
    name: str
    seeds: list[int]
    baseline: str
    model: str
    bootstrap: int
    keep_checkpoints: bool
    description: str
    common: dict[str, Any]                 # flattened
    variants: dict[str, Variant]
    claims: list[Claim]
    services: dict[str, ServiceSpec] = field(default_factory=dict)
    task: str = "qa"
    part: str | None = None                # the key of this study in its file's `parts:` (None: the whole file)
    preconditions: list[Precondition] = field(default_factory=list)
    warm_start_seeds: list[int] = field(default_factory=list)  # the study's own warm starts (see StudyFile)
    game: dict[str, Any] = field(default_factory=dict)  # its own game settings, flattened, resolved (StudyFile.game)

    @property
    def out_dir(self) -> Path:
        """reports/study/<name>/ in the project: the run folders and the study's state."""
        return self.project / STUDY_DIR / self.name

    def report_paths(self) -> dict[str, Path]:
        base = self.project / STUDY_DIR / self.name
        return {ext: base.with_name(f"{self.name}.{ext}") for ext in ("md", "json", "png")}

    def runs(self) -> list[RunSpec]:
        """Every (variant, seed) run, seed by seed and each seed's variants in file order, so a study stopped
        part way has whole seeds to pair; a `train: false` variant runs once (first seed)."""
        out = []
        for seed in self.seeds:
            for v in self.variants.values():
                # an evaluation-only variant runs once, or once per seed where the seeds use several warm starts
                if v.train or self.warm_start_seeds or seed == self.seeds[0]:
                    out.append(RunSpec(v.name, seed, v.train, v.config.model_copy(update={"seed": seed}),
                                       v.overrides, self.warm_seed(seed)))
        return out

    def warm_seed(self, seed: int) -> int | None:
        """The warm-start seed the run with RL seed `seed` plays from: the i-th seed takes the (i mod n)-th."""
        if not self.warm_start_seeds:
            return None
        return self.warm_start_seeds[self.seeds.index(seed) % len(self.warm_start_seeds)]

    def run_folder(self, run: RunSpec) -> Path:
        return self.out_dir / "runs" / run.variant / f"seed-{run.seed}"

    def find_run(self, variant: str, seed: int) -> RunSpec:
        for run in self.runs():
            if run.variant == variant and run.seed == seed:
                return run
        raise KeyError(f"{self.path}: no run {variant}/seed-{seed} in this study")


@dataclass
class Suite:
    """A study file's studies: its parts (`parts:`, run together and reported in one table), or its one study."""
    path: Path
    project: Path
    name: str
    description: str
    studies: list[Study]
    report: Path | None                    # relative to the project; None: reports/study/<name>.md

    def report_paths(self) -> dict[str, Path]:
        md = self.project / (self.report or STUDY_DIR / f"{self.name}.md")
        return {"md": md, "json": self.project / STUDY_DIR / f"{self.name}.json"}

    @property
    def has_parts(self) -> bool:
        return any(s.part for s in self.studies)

    def study(self, part: str | None) -> Study:
        return next(s for s in self.studies if s.part == part)


# ---------------------------------------------------------------------------------------------- helpers


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def expand(d: dict, where: str, path: Path) -> dict:
    """Dotted keys ('rl.kl_beta': 0) -> nested mappings, merged with nested ones given alongside."""
    out: dict = {}
    for key, value in d.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{path}: {where}: keys must be non-empty strings (got {key!r})")
        node, parts = out, key.split(".")
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"{path}: {where}.{'.'.join(parts[:i + 1])} is given both as a value and as a "
                                  "section")
            node = child
        leaf = parts[-1]
        value = expand(value, f"{where}.{key}", path) if isinstance(value, dict) else value
        if isinstance(node.get(leaf), dict) and isinstance(value, dict):
            node[leaf] = deep_merge(node[leaf], value)
        elif leaf in node:
            raise ConfigError(f"{path}: {where}.{key} is given twice")
        else:
            node[leaf] = value
    return out


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "judge_model" and k != "judge":
            out[k] = deep_merge(out[k], v)
        else:  # a backend spec (judge_model, judge) is replaced whole, never merged field by field
            out[k] = copy.deepcopy(v)
    return out


def _lookup(d: dict, dotted: str) -> Any:
    node: Any = d
    for part in dotted.split("."):
        node = node[part]
    return node


def _first_leaf(value: Any, key: str) -> str:
    if isinstance(value, dict) and value:
        k, v = next(iter(value.items()))
        return _first_leaf(v, f"{key}.{k}")
    return key


def _check_game_keys(task: str):
    """A game study's variants share models/<task>_sft (made from the section's env, task or grid, and sft)."""
    allowed = game_keys(task)
    article = "an" if task[0] in "aeiou" else "a"

    def check(overrides: dict, where: str, path: Path) -> None:
        for key in flatten(overrides):
            if key == "seed":
                raise ConfigError(f"{path}: {where}.seed is not allowed: a run's seed comes from the study's `seeds`")
            if not any(key == k or key.startswith(k + ".") for k in allowed):
                raise ConfigError(f"{path}: {where}.{key} is not allowed: {article} {task} study shares its "
                                  f"warm start (models/{task}_sft) between its variants, so variants may change "
                                  f"{allowed[0]}.*, {', '.join(allowed[1:])} only (what the warm start is made "
                                  f"with goes under the study's `game:`)")
    return check


def _check_game_settings(task: str, game: dict, path: str, own_warm_starts: bool) -> None:
    """`game:` holds settings of the task's game section that its warm start is made with: not the RL section
    nor the evaluation's size (common and the variants set those), nor another section; and the study trains
    its own warm starts under it (warm_start_seeds)."""
    if task not in GAME_TASKS:
        raise ConfigError(f"{path}: key 'game' applies to agent and tool studies (the game their warm start is "
                          f"made with); a {task} study's warm start is params.yaml's")
    runs_keys = game_keys(task)
    for key in flatten(game):
        if not key.startswith(f"{task}."):
            raise ConfigError(f"{path}: game.{key} is not allowed: game holds settings of the {task} section "
                              f"({task}.env, {task}.sft.*, ...), the game this study's warm start is made with")
        if any(key == k or key.startswith(k + ".") for k in runs_keys):
            raise ConfigError(f"{path}: game.{key} is not allowed: it changes the runs, not the warm start: set it "
                              f"under common or a variant")
    if not own_warm_starts:
        raise ConfigError(f"{path}: key 'game' needs warm_start_seeds (e.g. [0, 1]): the study trains its own warm "
                          f"starts under its game, since the project's models/{task}_sft plays params.yaml's")


def _check_project_params(wanted: dict, cfg: Config, shown: str, params_file: Path, task: str) -> None:
    """Each `project_params` setting must already be params.yaml's (resolved with its defaults)."""
    dump = cfg.model_dump(mode="json")
    for key, want in flatten(expand(wanted, "project_params", Path(shown))).items():
        try:
            have = _lookup(dump, key)
        except (KeyError, TypeError):
            raise ConfigError(f"{shown}: project_params.{key}: no such setting") from None
        if have != want:
            rebuild = f"`dvc repro {task}_sft`" if task in GAME_TASKS else "`make demo`"
            raise ConfigError(f"{shown}: project_params {key}: {json.dumps(want)}, but {params_file} has "
                              f"{json.dumps(have)}: set it there and rebuild the shared artifacts ({rebuild})")


def _check_sections(overrides: dict, where: str, path: Path) -> None:
    """Only rl.*, merge.* and evaluate.* (not evaluate.mini_items) may differ between variants."""
    for key, value in overrides.items():
        if key == "seed":
            raise ConfigError(f"{path}: {where}.seed is not allowed: a run's seed comes from the study's `seeds`")
        if key not in Config.model_fields:
            allowed = ", ".join(("train",) * (where != "common") + VARIANT_SECTIONS)
            raise ConfigError(f"{path}: unknown key '{where}.{key}' (allowed here: {allowed})")
        if key not in VARIANT_SECTIONS:
            raise ConfigError(f"{path}: {_first_leaf(value, f'{where}.{key}')} is not allowed: the study shares the "
                              "project's upstream artifacts (data/, models/sft, models/discriminator), so variants "
                              f"may change {', '.join(s + '.*' for s in VARIANT_SECTIONS)} only")
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {where}.{key} must be a mapping of {key} keys (got {value!r})")
        for sub in value:
            if f"{key}.{sub}" in UPSTREAM_KEYS:
                raise ConfigError(f"{path}: {where}.{key}.{sub} is not allowed: {UPSTREAM_KEYS[f'{key}.{sub}']}, "
                                  "which the study shares")


def _model_at(loc: tuple[str, ...]) -> type[BaseModel] | None:
    """The pydantic model holding the last key of `loc` (Optional[...] unwrapped), or None."""
    model: Any = Config
    for part in loc:
        fields = getattr(model, "model_fields", {})
        if part not in fields:
            return None
        ann = fields[part].annotation
        candidates = [ann, *typing.get_args(ann)]
        model = next((a for a in candidates if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return model


def _explain(path: Path, err: ValidationError, where: str, sources: list[tuple[str, dict]]) -> str:
    """One line for a params validation error, naming the study key that set it (`variants.<name>.<key>`)."""
    first = err.errors()[0]
    loc = tuple(str(p) for p in first["loc"])
    key = ".".join(loc)
    label, best = where, 0
    for name, nested in sources:  # the source setting the longest prefix of the key (ties: the variant)
        node: Any = nested
        depth = 0
        for part in loc:
            if not isinstance(node, dict) or part not in node:
                break
            node, depth = node[part], depth + 1
        if depth > best:
            label, best = name, depth
    full = f"{label}.{key}" if key else label
    if first["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        allowed = ", ".join(parent.model_fields) if parent is not None else "?"
        return f"{path}: unknown key '{full}' (allowed here: {allowed})"
    if first["type"] in {"value_error", "assertion_error"}:
        return f"{path}: {full}: {first['msg'].removeprefix('Value error, ')}"
    return (f"{path}: {full} expects {_expected(Config, tuple(first['loc']))}: {first['msg']} "
            f"(got {first.get('input')!r})")


def _study_error(path: Path, err: ValidationError) -> str:
    errors = err.errors()  # an unknown key first: a misspelt key also leaves the right one missing
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    key = ".".join(str(p) for p in first["loc"]) or "<root>"
    if first["type"] == "extra_forbidden":
        model: Any = StudyFile
        if first["loc"][0] == "claims":
            model = ClaimSpec
        elif first["loc"][0] == "preconditions":
            model = PreconditionSpec
        elif first["loc"][0] == "services":
            model = ServiceSpec
        return f"{path}: unknown key '{key}' (allowed here: {', '.join(model.model_fields)})"
    if first["type"] == "missing":
        return f"{path}: key '{key}' is missing"
    return f"{path}: key '{key}': {first['msg']} (got {first.get('input')!r})"


# ---------------------------------------------------------------------------------------------- loading


def _read(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(f"{path}: no such study file")
    raw, _ = read_yaml_file(path, "study file")
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping (seeds, baseline, variants, ...) at the top level")
    return raw


def _suite_spec(path: Path, raw: dict) -> SuiteFile:
    try:
        return SuiteFile.model_validate(raw)
    except ValidationError as err:
        first = next((e for e in err.errors() if e["type"] == "extra_forbidden"), err.errors()[0])
        key = ".".join(str(p) for p in first["loc"]) or "<root>"
        if first["type"] == "extra_forbidden":
            raise ConfigError(f"{path}: unknown key '{key}' (allowed next to parts: "
                              f"{', '.join(SuiteFile.model_fields)})") from None
        raise ConfigError(f"{path}: key '{key}': {first['msg']} (got {first.get('input')!r})") from None


def _part_body(path: Path, suite: SuiteFile, part: str) -> dict:
    """A part's study body, with the suite's seeds and bootstrap unless the part sets its own."""
    body = suite.parts[part]
    if not isinstance(body, dict):
        raise ConfigError(f"{path}: parts.{part} must be a study (task, baseline, variants, claims, ...)")
    if "name" in body:
        raise ConfigError(f"{path}: parts.{part}.name is not allowed: a part is named by its key "
                          f"({suite.name or path.stem}.{part})")
    inherited = {k: getattr(suite, k) for k in ("seeds", "bootstrap") if getattr(suite, k) is not None}
    return {**inherited, **body, "name": f"{suite.name or path.stem}.{part}"}


def load_study(path: str | Path, project: str | Path = ".", part: str | None = None) -> Study:
    """Reads and validates a study file (or, with `part`, one part of a file with `parts:`) against the
    project's params.yaml; ConfigError (one line) if not."""
    path, project = Path(path), Path(project).resolve()
    raw = _read(path)
    if "parts" in raw:
        suite = _suite_spec(path, raw)
        if part is None:
            raise ConfigError(f"{path}: holds parts ({', '.join(suite.parts)}): name one, or load the whole file "
                              "with load_suite")
        if part not in suite.parts:
            raise ConfigError(f"{path}: no part '{part}' (parts: {', '.join(suite.parts)})")
        return _build(path, project, _part_body(path, suite, part), f"{path} parts.{part}", part)
    if part is not None:
        raise ConfigError(f"{path}: has no parts, so there is no part '{part}'")
    return _build(path, project, raw, str(path), None)


def load_suite(path: str | Path, project: str | Path = ".") -> Suite:
    """A study file as the studies it runs: its parts in file order (`parts:`), or the file's one study."""
    path, project = Path(path), Path(project).resolve()
    raw = _read(path)
    if "parts" not in raw:
        study = _build(path, project, raw, str(path), None)
        return Suite(path.resolve(), project, study.name, study.description, [study], None)
    suite = _suite_spec(path, raw)
    if not suite.parts:
        raise ConfigError(f"{path}: key 'parts' is empty: name at least one study")
    for part in suite.parts:
        if not isinstance(part, str) or not re.match(NAME, part):
            raise ConfigError(f"{path}: parts.{part}: a part name may hold letters, digits, '_', '.', '-'")
    studies = [_build(path, project, _part_body(path, suite, part), f"{path} parts.{part}", part)
               for part in suite.parts]
    report = None
    if suite.report is not None:
        report = Path(suite.report)
        if report.is_absolute() or ".." in report.parts or report.suffix != ".md":
            raise ConfigError(f"{path}: key 'report': expected a .md path inside the project, e.g. "
                              f"reports/results.md (got {suite.report!r})")
    return Suite(path.resolve(), project, suite.name or path.stem, suite.description, studies, report)


def _build(path: Path, project: Path, raw: dict, shown: str, part: str | None) -> Study:
    if isinstance(raw.get("seeds"), list) and not raw["seeds"]:
        raise ConfigError(f"{shown}: key 'seeds' is empty: list at least one seed (e.g. seeds: [1, 2, 3])")
    try:
        spec = StudyFile.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_study_error(shown, err)) from None
    if len(set(spec.seeds)) != len(spec.seeds):
        raise ConfigError(f"{shown}: key 'seeds' lists a seed twice: {spec.seeds}")
    if not spec.variants:
        raise ConfigError(f"{shown}: key 'variants' is empty: name at least the baseline variant")
    for name in spec.variants:
        if not isinstance(name, str) or not re.match(NAME, name):
            raise ConfigError(f"{shown}: variants.{name}: a variant name may hold letters, digits, '_', '.', '-'")
    names = ", ".join(spec.variants)
    if spec.baseline not in spec.variants:
        raise ConfigError(f"{shown}: baseline '{spec.baseline}' is not a variant (variants: {names})")
    default_metric = GAME_METRICS[spec.task][0] if spec.task in GAME_TASKS else "benchmark_average"
    spec = spec.model_copy(update={"claims": [c.model_copy(update={"metric": c.metric or default_metric})
                                              for c in spec.claims]})
    for i, c in enumerate(spec.claims):
        for side in ("better", "than"):
            if getattr(c, side) not in spec.variants:
                raise ConfigError(f"{shown}: claims[{i}].{side} '{getattr(c, side)}' is not a variant (variants: {names})")
        if c.better == c.than:
            raise ConfigError(f"{shown}: claims[{i}] compares '{c.better}' with itself")
        if spec.task in GAME_TASKS and c.metric not in GAME_METRICS[spec.task]:
            article = "an" if spec.task[0] in "aeiou" else "a"
            raise ConfigError(f"{shown}: claims[{i}].metric '{c.metric}' is not {article} {spec.task} study's metric "
                              f"(expected {', '.join(GAME_METRICS[spec.task])})")
        if spec.task == "qa" and c.metric not in METRICS:
            raise ConfigError(f"{shown}: claims[{i}].metric '{c.metric}' is unknown (expected world_test, "
                              f"benchmark_average or a benchmark: {', '.join(BENCHMARKS)})")
    preconditions = _check_preconditions(spec, shown)
    for i, c in enumerate(spec.claims):
        for name in c.requires:
            if name not in preconditions:
                raise ConfigError(f"{shown}: claims[{i}].requires '{name}' is not a precondition (preconditions: "
                                  f"{', '.join(preconditions) or 'none declared'})")
    if spec.warm_start_seeds:
        if len(set(spec.warm_start_seeds)) != len(spec.warm_start_seeds) or min(spec.warm_start_seeds) < 0:
            raise ConfigError(f"{shown}: warm_start_seeds must be distinct seeds >= 0 (got {spec.warm_start_seeds})")
        if len(spec.seeds) < len(spec.warm_start_seeds):
            raise ConfigError(f"{shown}: {len(spec.warm_start_seeds)} warm_start_seeds need at least as many seeds "
                              f"(got {len(spec.seeds)}): each warm start is played by seeds[i] with i mod "
                              f"{len(spec.warm_start_seeds)} its position")
    ports = [s.port for s in spec.services.values()]
    if len(set(ports)) != len(ports):
        raise ConfigError(f"{shown}: two services share a port: {ports}")

    params_file = project / "params.yaml"
    project_cfg = load_config(params_file)  # the project's params must be valid first (its message names that file)
    params, _ = read_params(params_file)
    _check_project_params(spec.project_params, project_cfg, shown, params_file, spec.task)
    game_overrides = expand(spec.game, "game", shown)
    game: dict[str, Any] = {}
    if game_overrides:
        _check_game_settings(spec.task, game_overrides, shown, bool(spec.warm_start_seeds))
        params = deep_merge(params, game_overrides)  # the study's game, under common and every variant
        try:
            game_dump = Config.model_validate({**params, "seed": spec.seeds[0]}).model_dump()
        except ValidationError as err:
            raise ConfigError(_explain(shown, err, "game", [("game", game_overrides)])) from None
        game = {k: _lookup(game_dump, k) for k in flatten(game_overrides)}
    common = expand(spec.common, "common", shown)
    check = _check_game_keys(spec.task) if spec.task in GAME_TASKS else _check_sections
    check(common, "common", shown)
    variants = {}
    for name, body in spec.variants.items():
        where = f"variants.{name}"
        if body is not None and not isinstance(body, dict):
            raise ConfigError(f"{shown}: {where} must be a mapping of overrides (or {{}} for params as they are)")
        own = expand(dict(body or {}), where, shown)
        train = own.pop("train", True)
        if not isinstance(train, bool):
            raise ConfigError(f"{shown}: {where}.train expects true or false (got {train!r})")
        check(own, where, shown)
        if not train:
            dead = [k for k in flatten(own) if k.split(".")[0] in ("rl", "merge")
                    or any(k.startswith(f"{t}.rl.") for t in GAME_TASKS)]
            if dead:
                raise ConfigError(f"{shown}: {where}.{dead[0]} has no effect: "
                                  "train: false evaluates the SFT checkpoint without RL")
        merged = deep_merge(deep_merge(params, common), own)
        merged["seed"] = spec.seeds[0]
        try:
            cfg = Config.model_validate(merged)
        except ValidationError as err:
            raise ConfigError(_explain(shown, err, where, [(where, own), ("common", common),
                                                      ("game", game_overrides)])) from None
        dump = cfg.model_dump()
        resolved = {k: _lookup(dump, k) for k in flatten(own)}
        variants[name] = Variant(name, train, resolved, cfg)

    claims = [Claim(c.name or f"{c.better} {'>=' if c.margin else '>'} {c.than}", c.better, c.than, c.metric,
                    c.model or spec.model, c.margin, tuple(c.requires)) for c in spec.claims]
    return Study(path=path.resolve(), project=project, name=spec.name or path.stem, seeds=list(spec.seeds),
                 baseline=spec.baseline, model=spec.model, bootstrap=spec.bootstrap,
                 keep_checkpoints=spec.keep_checkpoints, description=spec.description,
                 common=flatten(common), variants=variants, claims=claims, services=dict(spec.services),
                 task=spec.task, part=part, preconditions=list(preconditions.values()),
                 warm_start_seeds=list(spec.warm_start_seeds), game=game)


def _check_preconditions(spec: StudyFile, shown: str) -> dict[str, Precondition]:
    """Each precondition names a variant of the study, a metric its task's runs record and its kind's
    parameters (and no other kind's); one line naming the field otherwise."""
    out: dict[str, Precondition] = {}
    names = ", ".join(spec.variants)
    known = CURVE_METRICS[spec.task] + UPSTREAM_METRICS[spec.task]
    for i, p in enumerate(spec.preconditions):
        where = f"{shown}: preconditions[{i}]"
        if p.name in out:
            raise ConfigError(f"{where}.name '{p.name}' is given twice")
        if p.variant not in spec.variants:
            raise ConfigError(f"{where}.variant '{p.variant}' is not a variant (variants: {names})")
        for key in ("metric", "than"):
            value = getattr(p, key)
            if value is not None and value not in known:
                article = "an" if spec.task[0] in "aeiou" else "a"
                raise ConfigError(f"{where}.{key} '{value}' is not a metric {article} {spec.task} study's runs record "
                                  f"(expected one of {', '.join(known)})")
        body = spec.variants[p.variant] or {}
        if p.metric not in UPSTREAM_METRICS[spec.task] and body.get("train", True) is False:
            raise ConfigError(f"{where}.variant '{p.variant}' does not train (train: false), so it has no "
                              f"{p.metric} curve")
        given = p.model_fields_set - {"name", "variant", "metric", "kind", "seeds"}
        for key in sorted(given - set(KIND_FIELDS[p.kind])):
            raise ConfigError(f"{where}.{key} does not apply to kind {p.kind} (its fields: "
                              f"{', '.join(KIND_FIELDS[p.kind])})")
        if p.kind == "collapse" and p.ratio is None and p.threshold is None:
            raise ConfigError(f"{where}: kind collapse needs ratio (end vs start) or threshold (end), or both")
        if p.kind == "above" and p.threshold is None:
            raise ConfigError(f"{where}: kind above needs threshold")
        if p.kind == "between" and (p.lo is None or p.hi is None or p.lo > p.hi):
            raise ConfigError(f"{where}: kind between needs lo <= hi (got lo {p.lo}, hi {p.hi})")
        if p.kind == "at_least_part_of_run" and p.than is None:
            raise ConfigError(f"{where}: kind at_least_part_of_run needs than (the metric it is compared with)")
        if p.metric in UPSTREAM_METRICS[spec.task] and p.kind in ("collapse", "at_least_part_of_run"):
            raise ConfigError(f"{where}.metric '{p.metric}' is one figure, not a curve: use kind above or between")
        out[p.name] = Precondition(**p.model_dump())
    return out


def describe(overrides: dict[str, Any], empty: str = "(params as they are)") -> str:
    """'rl.algorithm=grpo rl.kl_beta=0.0' (JSON for lists and mappings), or `empty`."""
    if not overrides:
        return empty
    return " ".join(f"{k}={v if isinstance(v, (str, int, float, bool)) else json.dumps(v)}"
                    for k, v in overrides.items())
