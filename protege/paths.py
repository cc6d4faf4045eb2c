"""Where each stage reads and writes, relative to the project root (the same paths as dvc.yaml)."""
from pathlib import Path

WORLD = Path("data/world")
SPLITS = ("train", "rl", "val", "test")  # val: RL learning curves
SPLIT_TABLES = {s: WORLD / f"{s}.parquet" for s in SPLITS}  # the embedded world's
IMPORTED = Path("data/imported")  # data.source files: the `data` stage's tables, images/ by content hash
SOURCE_DIRS = {"world": WORLD, "files": IMPORTED}


REQUIRED_SPLITS = ("train", "rl", "test")  # val may be left out (no learning curve)


def split_table(source: str, split: str) -> Path:
    """The question table of `split` for `data.source` (world or files); for files, val exists only when
    data.val was given."""
    return SOURCE_DIRS[source] / f"{split}.parquet"


BASE_MODEL = Path("models/base")
VALIDATION_REPORT = Path("reports/validation.json")
CURATED = Path("data/curated")
CURATED_RL = CURATED / "rl.parquet"
CURATION_REPORT = Path("reports/curation.json")
CURATION_PLOTS = Path("reports/curation")  # histogram CSVs (DVC plots) and PNG
TEACHER_CACHE = Path("data/teachers")
TEACHER_ANSWERS = Path("data/teacher_answers.parquet")  # the training view of the cache
SFT_MODEL = Path("models/sft")
ROLLOUTS = Path("data/rollouts/student.parquet")
DISCRIMINATOR = Path("models/discriminator")
RL_CHECKPOINTS = Path("models/rl")
# training states for exact resume of a killed sft / disc_pretrain run: outside their DVC outputs (DVC
# deletes those before it runs a stage) and removed once the stage has written its checkpoint
TRAINING_STATES = Path("models/.state")
MERGED_MODEL = Path("models/merged")
AGENT_SFT_MODEL = Path("models/agent_sft")  # the agent game's warm start (scripted solver's episodes)
AGENT_RL = Path("models/agent_rl")  # agent RL checkpoints (+ merged-teacher/ under GTR-Turbo)
AGENT_REPORT = Path("reports/agent")  # summary.json (success at start and end), train_curve.csv
TOOL_SFT_MODEL = Path("models/tool_sft")  # the tool environment's warm start (scripted solver's tool episodes)
TOOL_RL = Path("models/tool_rl")  # tool RL (GTPO) checkpoints
TOOL_REPORT = Path("reports/tool")  # summary.json (accuracy, runtime errors at start and end), train_curve.csv
EVAL_JSON = Path("reports/eval.json")
EVAL_MD = Path("reports/eval.md")
EVAL_ITEMS = Path("reports/eval_items.jsonl")
PROMOTION = Path("reports/promotion.json")
STAGE_METRICS = Path("reports/stages")  # one small JSON of figures per stage (DVC metrics)
MINI_BENCHMARKS = Path("data/benchmarks")  # the world's mini versions of the 14 benchmarks
EVAL_DIR = Path("reports/eval")  # per model and benchmark: predictions, scored items, units
EVAL_PNG = Path("reports/eval.png")


def checkpoint_dir(out_dir: Path, step: int) -> Path:
    """Where an RL run writes its checkpoint after `step`."""
    return Path(out_dir) / f"step-{step:05d}"


def checkpoints(folder: Path) -> list[Path]:
    """The step-N checkpoint folders of an RL run in step order, by number (step-100000 after step-99999)."""
    found = [p for p in Path(folder).glob("step-*") if p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))
