"""dvc.yaml, written from the stage table below for the project's params (`protege dag`).

The DAG depends on where the data comes from (`data.source`): with `world` the world stage generates the
splits (and the tiny base student) and the mini benchmarks are made from it; with `files` a `data` stage
imports your files in its place (your files are its dependencies, so editing one re-runs what it feeds), the
split tables live in data/imported/ and stages that started from models/base start from `model.path`. Each
stage's code dependencies and params come from what its code imports and reads (`protege.stage_deps`),
so dvc.yaml never calls a stale output up to date. `protege pipeline` writes dvc.yaml itself before it runs
DVC; a test holds the committed dvc.yaml to the default params' rendering.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

from protege.paths import IMPORTED, SPLITS, WORLD
from protege.stage_deps import code_files, params_read

# The stages in dvc.yaml's order, as YAML, without their code dependencies (added by `render`). Data
# dependencies on the world's tables are rewritten for `data.source: files`; `@data_files` stands for the
# data stage's inputs.
TEMPLATE = """\
# The one DAG of record. `dvc repro` runs it; the Prefect flow runs the same stages through DVC.
# meta.seconds: a stage's time in the demo on 2 CPU cores; the flow's first guess at how long it takes (it then
# uses what the stage last took in this project) when it chooses which ready stage to start (protege/pipeline.py).
stages:
  world:
    cmd: protege stage world
    meta: {seconds: 14}
    deps:
    params: [seed, world, model]
    outs:
      - data/world
      - models/base
      - reports/stages/world.json:
          cache: false
  data:
    cmd: protege stage data
    meta: {seconds: 10}
    deps:
      - @data_files
    params: [data]
    outs:
      - data/imported:
          persist: true   # the last good import stays until every split of a new one has passed
      - reports/stages/data.json:
          cache: false
  mini_benchmarks:
    cmd: protege stage mini_benchmarks
    meta: {seconds: 2}
    deps:
      - data/world
    params: [world.seed, world.image_size, evaluate.mini_items]
    outs:
      - data/benchmarks
      - reports/stages/mini_benchmarks.json:
          cache: false
  validate:
    cmd: protege stage validate
    meta: {seconds: 11}
    deps:
      - data/world
    params: []
    outs:
      - reports/validation.json:
          cache: false
      - reports/validation_summary.csv:
          cache: false
  sft:
    cmd: protege stage sft
    meta: {seconds: 213}
    deps:
      - data/world/train.parquet
      - data/world/images/train
      - data/pool
      - ${sft.init}
      - reports/validation.json
    params: [seed, sft, model.digest, model.dtype, model.gradient_checkpointing, model.path, model.trust_remote_code, model.lora]
    outs:
      - models/sft
    metrics:
      - reports/stages/sft.json:
          cache: false
  curate:
    cmd: protege stage curate
    meta: {seconds: 21}
    deps:
      - data/world/rl.parquet
      - data/world/images/rl
      - models/sft
    params: [seed, curate, model.dtype, model.gradient_checkpointing, model.trust_remote_code]
    outs:
      - data/curated
      - reports/curation/histograms.png:
          cache: false
    metrics:
      - reports/curation.json:
          cache: false
    plots:
      - reports/curation/logprob.csv:
          cache: false
      - reports/curation/tokens.csv:
          cache: false
  teachers:
    cmd: protege stage teachers
    meta: {seconds: 10}
    deps:
      - data/curated
    params: [seed, curate.max_teacher_tokens, teachers.answers_per_question, teachers.error_rate, teachers.pool, model.digest, model.path, model.trust_remote_code]
    outs:
      - data/teachers:
          persist: true   # the cache survives re-runs: a teacher is never asked twice
      - data/teacher_answers.parquet
    metrics:
      - reports/stages/teachers.json:
          cache: false
  rollouts:
    cmd: protege stage rollouts
    meta: {seconds: 38}
    deps:
      - data/curated
      - models/sft
    params: [seed, rollouts, model.dtype, model.gradient_checkpointing, model.trust_remote_code]
    outs:
      - data/rollouts
    metrics:
      - reports/stages/rollouts.json:
          cache: false
  disc_pretrain:
    cmd: protege stage disc_pretrain
    meta: {seconds: 51}
    deps:
      - data/rollouts
      - data/teacher_answers.parquet
      - models/sft
    params: [seed, disc_pretrain, model.trust_remote_code, model.dtype, model.lora]
    outs:
      - models/discriminator
    metrics:
      - reports/stages/disc_pretrain.json:
          cache: false
  rl:
    cmd: protege stage rl
    meta: {seconds: 88}
    deps:
      - data/curated
      - data/world/val.parquet   # the learning curve's questions
      - data/world/images/val
      - data/teacher_answers.parquet
      - models/sft
      - models/discriminator
    params: [seed, rl, evaluate.batch_size, model.dtype, model.gradient_checkpointing, model.trust_remote_code, model.lora]
    outs:
      - models/rl:
          persist: true   # holds the resume state; a state from other params is discarded by the stage
      - reports/rl/learning_curve.csv:
          cache: false
          persist: true   # a resumed run keeps the points up to its state's step
      - reports/rl/train_curve.csv:
          cache: false
          persist: true   # every step's figures; a resumed run keeps the rows up to its state's step
    metrics:
      - reports/stages/rl.json:
          cache: false
  rl_baseline:     # the same run with rl.baseline's algorithm (dr_grpo); rl.baseline: null -> nothing trained
    cmd: protege stage rl_baseline
    meta: {seconds: 34}
    deps:
      - data/curated
      - data/world/val.parquet
      - data/world/images/val
      - data/teacher_answers.parquet
      - models/sft
      - models/discriminator
    params: [seed, rl, evaluate.batch_size, model.dtype, model.gradient_checkpointing, model.trust_remote_code, model.lora]
    outs:
      - models/rl_baseline:
          persist: true
      - reports/rl_baseline/learning_curve.csv:
          cache: false
          persist: true
      - reports/rl_baseline/train_curve.csv:
          cache: false
          persist: true   # every step's figures; a resumed run keeps the rows up to its state's step
    metrics:
      - reports/stages/rl_baseline.json:
          cache: false
  merge:
    cmd: protege stage merge
    meta: {seconds: 2}
    deps:
      - models/rl
      - models/sft
    params: [merge]
    outs:
      - models/merged
  agent_sft:
    cmd: protege stage agent_sft
    meta: {seconds: 221}
    deps:
      - models/base
    params: [seed, world.image_size, agent, model.digest, model.dtype, model.gradient_checkpointing, model.path, model.trust_remote_code]
    outs:
      - models/agent_sft
    metrics:
      - reports/stages/agent_sft.json:
          cache: false
  agent_rl:
    cmd: protege stage agent_rl
    meta: {seconds: 167}
    deps:
      - models/agent_sft
    params: [seed, world.image_size, agent, model.dtype, model.gradient_checkpointing, model.trust_remote_code, model.lora]
    outs:
      - models/agent_rl:
          persist: true
      - reports/agent/train_curve.csv:
          cache: false
          persist: true
      - reports/agent/summary.json:
          cache: false
    metrics:
      - reports/stages/agent_rl.json:
          cache: false
  tool_sft:
    cmd: protege stage tool_sft
    meta: {seconds: 246}
    deps:
      - models/base
    params: [seed, world.image_size, tool, model.digest, model.dtype, model.gradient_checkpointing, model.path, model.trust_remote_code]
    outs:
      - models/tool_sft
    metrics:
      - reports/stages/tool_sft.json:
          cache: false
  tool_rl:
    cmd: protege stage tool_rl
    meta: {seconds: 88}
    deps:
      - models/tool_sft
    params: [seed, world.image_size, tool, model.dtype, model.gradient_checkpointing, model.trust_remote_code, model.lora]
    outs:
      - models/tool_rl:
          persist: true
      - reports/tool/train_curve.csv:
          cache: false
          persist: true
      - reports/tool/summary.json:
          cache: false
    metrics:
      - reports/stages/tool_rl.json:
          cache: false
  evaluate:
    cmd: protege stage evaluate
    meta: {seconds: 26}
    deps:
      - data/world/test.parquet
      - data/world/images/test
      - data/benchmarks
      - models/sft
      - models/rl
      - models/rl_baseline
      - models/merged
    params: [seed, evaluate, model.dtype, model.gradient_checkpointing, model.trust_remote_code]
    outs:
      - reports/eval.md:
          cache: false
      - reports/eval.png:
          cache: false
      - reports/eval_items.jsonl:
          cache: false
      - reports/eval:
          cache: false
    metrics:
      - reports/eval.json:
          cache: false
  promote:
    cmd: protege stage promote
    meta: {seconds: 2}
    deps:
      - reports/eval.json
    params: [promote]
    outs:
      - reports/promotion.json:
          cache: false

plots:
  - curation-logprob:
      title: mean answer log-prob under the SFT student (pool vs selected)
      x: bin
      y:
        reports/curation/logprob.csv: [pool, selected]
  - curation-tokens:
      title: tokens per example, prompt + image + answer (pool vs selected)
      x: bin
      y:
        reports/curation/tokens.csv: [pool, selected]
  - rl-learning-curve:
      title: greedy accuracy on the val split during RL (rl vs rl_baseline)
      x: step
      y:
        reports/rl/learning_curve.csv: accuracy
        reports/rl_baseline/learning_curve.csv: accuracy
"""
SOURCE_STAGES = {"world": ("world", "mini_benchmarks"), "files": ("data",)}
BASE_MODEL_DEPS = ("models/base",)
_STAGE = re.compile(r"^  (\w+):")
_DEP = re.compile(r"^      - (\S+)(.*)$")


def _files_dep(dep: str, cfg) -> str | None:
    """A world-mode data dependency as it reads with your files; None: no dependency there."""
    split = re.fullmatch(rf"{WORLD}/(\w+)\.parquet", dep)
    if split:
        name = split.group(1)
        return f"{IMPORTED}/{name}.parquet" if name in cfg.data.split_files() else None
    if dep.startswith(f"{WORLD}/images/"):
        return None  # imported images are named by their content: the table pins them
    if dep == str(WORLD):
        return str(IMPORTED)
    if dep in BASE_MODEL_DEPS or dep == "data/benchmarks":
        return None  # no world student, no mini benchmarks
    if dep == "${sft.init}" and Path(cfg.sft.init) == Path("models/base"):
        return None  # sft starts from model.path, pinned by model.digest
    return dep


def data_inputs(cfg) -> list[str]:
    """The data stage's dependencies: every file or folder the splits name, and the image folder."""
    entries = [e for files in cfg.data.split_files().values() for e in files]
    return list(dict.fromkeys(entries + ([cfg.data.images] if cfg.data.images else [])))


def _params(declared: str, stage: str) -> str:
    """A stage's params: the declared ones it still reads, plus every one its code reads."""
    names = [p.strip() for p in declared.split(",") if p.strip()]
    need = params_read(stage)
    keep = [p for p in names if p in need or p.split(".")[0] in need]
    for r in sorted(need):
        if r not in keep and r.split(".")[0] not in keep:
            keep.append(r)
    return ", ".join(p for p in keep if "." not in p or p.split(".")[0] not in keep)


REWARD_STAGES = ("rl", "rl_baseline")  # the question loop's stages: they call rl.rewards' functions


def reward_files(cfg, project: Path | None) -> list[str]:
    """The project's own files that rl.rewards' functions live in (`mypkg.rewards:f` -> mypkg/rewards.py or
    mypkg/rewards/__init__.py), so editing one re-runs RL; modules found elsewhere (installed) are not tracked."""
    if project is None:
        return []
    found = []
    for spec in cfg.rl.rewards:
        if ":" not in spec.function:
            continue  # a built-in (the judge)
        base = Path(*spec.function.split(":")[0].split("."))
        for rel in (base.with_suffix(".py"), base / "__init__.py"):
            if (Path(project) / rel).is_file():
                found.append(rel.as_posix())
                break
    return list(dict.fromkeys(found))


def render(cfg, project: Path | None = None) -> str:
    """dvc.yaml's text for a configuration (`project`: where your own reward modules are looked for)."""
    source = cfg.data.source
    dropped = {s for key, names in SOURCE_STAGES.items() if key != source for s in names}
    out: list[str] = []
    stage, skip, in_deps = None, False, False

    def close_deps() -> None:
        out.extend(f"      - {p}" for p in sorted(map(str, code_files(stage))))
        if stage in REWARD_STAGES:
            out.extend(f"      - {p}" for p in reward_files(cfg, project))

    for line in TEMPLATE.splitlines():
        m = _STAGE.match(line)
        if m or (line and not line.startswith(" ")):
            if in_deps:
                close_deps()
                in_deps = False
            stage = m.group(1) if m else None
            skip = stage in dropped
        if skip:
            continue
        if stage and line == "    deps:":
            in_deps = True
            out.append(line)
            continue
        dep = _DEP.match(line) if in_deps else None
        if dep:
            if dep.group(1) == "@data_files":
                out.extend(f"      - {p}" for p in data_inputs(cfg))
                continue
            path = dep.group(1) if source == "world" else _files_dep(dep.group(1), cfg)
            if path is not None:
                out.append(f"      - {path}{dep.group(2)}")
            continue
        if in_deps:
            close_deps()
            in_deps = False
        pm = re.match(r"^    params: \[(.*)\](.*)$", line)
        if stage and pm:
            names = _params(pm.group(1), stage)
            if not names:
                continue
            line = "\n".join(textwrap.wrap(f"    params: [{names}]{pm.group(2)}", 116, subsequent_indent=" " * 6,
                                            break_long_words=False, break_on_hyphens=False))
        out.append(line)
    return "\n".join(out) + "\n"


def stages_in(project: Path) -> list[str]:
    """The stages of PROJECT/dvc.yaml, in the pipeline's order."""
    from protege.dvc_lockfile import read_dvc_yaml
    from protege.stage_names import STAGES

    present = read_dvc_yaml(project)
    return [s for s in STAGES if s in present]


def write(cfg, project: Path) -> bool:
    """Writes PROJECT/dvc.yaml for `cfg`; True when it changed."""
    path = Path(project) / "dvc.yaml"
    text = render(cfg, project)
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True
