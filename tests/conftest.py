import random
from pathlib import Path

import pytest

from protege.config import ModelConfig, WorldConfig

REPO = Path(__file__).resolve().parents[1]

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
