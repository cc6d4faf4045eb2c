import os
import random
import sys
from pathlib import Path

import pytest

from protege.config import ModelConfig, WorldConfig

REPO = Path(__file__).resolve().parents[1]

# DeepSpeed JIT-builds its CPU shared-memory collective (deepspeed_shm_comm) with ninja in the first process that
# initialises it on the CPU, into one folder per user (~/.cache/torch_extensions) that every checkout and
# virtual environment on the machine shares. A build by another checkout (other paths) or by another ninja
# (pip's 1.13 in .venv/bin hashes commands unlike the system's 1.11) marks it stale, and the next test process
# rebuilds it (about 50 s of a core, every other DeepSpeed process waiting on the build lock). The tests' own
# folder in this environment and this environment's ninja first on PATH: built once, then only loaded.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch_extensions"))
_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _BIN:
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")

# Each test process gets its share of the cores (torch's default is every core in every process): with two
# xdist workers on two cores, two threads each made torch's workers spin against each other, and the RL loop,
# agent and micro-batch tests took 368 s where one thread each takes 39 s. Stages the tests start in
# subprocesses inherit the share.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    if "torch" in sys.modules:  # imported before this file (a plugin): the variable came too late for it
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

TINY_WORLD = WorldConfig(n_train=48, n_rl=16, n_val=8, n_test=16)


@pytest.fixture(scope="session")
def tiny_world(tmp_path_factory) -> Path:
    """A small world written once per session (parquet + PNG)."""
    from protege.world.generate import generate_world

    out = tmp_path_factory.mktemp("world")
    generate_world(TINY_WORLD, out)
    return out


@pytest.fixture(scope="session")
def tiny_processor():
    from protege.models.processor import StudentProcessor
    from protege.models.tokenizer import train_tokenizer
    from protege.world.questions import make_item
    from protege.world.teachers import all_templates

    rng = random.Random(0)
    items = [make_item(rng, 64) for _ in range(100)]
    texts = [i.question for i in items] + [i.answer for i in items] + all_templates() * 5
    return StudentProcessor.create(train_tokenizer(texts, 400), 64, 8, 2)


@pytest.fixture
def tiny_student(tiny_processor):
    from protege.models.student import build_student

    return build_student(ModelConfig(), tiny_processor, seed=0)
