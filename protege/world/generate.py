"""Writes the world's train / rl / val / test splits as parquet + PNG under a folder.

Each split is balanced by construction: question kinds are dealt in shuffled rounds, and within a kind
the target answers (option letters included) too, so no constant answer beats chance by more than
one item's worth (none at all when a kind's count divides by its number of answers). The train split's
`target` (the SFT target) alternates the two teachers' styles within each (kind, answer), so half of
every answer is said each way; with `world.accounts` it is the weaker SFT source's account and then the
answer (protege.world.teachers.sft_target); the other splits leave it null. `facts` (JSON) records what each
image shows that its question is about, for the scripted teachers' accounts; the student never sees it.
"""
from __future__ import annotations

import hashlib
import io
import json
import random
from pathlib import Path

import pandas as pd

from protege.config import WorldConfig
from protege.world.questions import ANSWERS, KINDS, Deck, make_item
from protege.world.teachers import STYLES, all_templates, sft_target, styled

SPLITS = ("train", "rl", "val", "test")
COLUMNS = ["id", "split", "kind", "family", "question", "answer", "candidates", "options", "image", "extra_images",
           "difficulty", "target", "facts"]


def split_sizes(cfg: WorldConfig) -> dict[str, int]:
    return {"train": cfg.n_train, "rl": cfg.n_rl, "val": cfg.n_val, "test": cfg.n_test}


def _png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def generate_split(cfg: WorldConfig, split: str, out_dir: Path, seen: set[tuple[str, ...]] | None = None,
                   image_split: dict[str, str] | None = None) -> pd.DataFrame:
    """One split from its own seed stream. An (images, question) pair already in `seen` (any split) is
    drawn again, and so is an image already used by another split (`image_split`: image sha256 -> split),
    so no example repeats and no image of one split appears in another."""
    rng = random.Random(f"{cfg.seed}-{split}")
    seen = set() if seen is None else seen
    image_split = {} if image_split is None else image_split
    img_dir = out_dir / "images" / split
    img_dir.mkdir(parents=True, exist_ok=True)
    kinds = Deck(rng, list(KINDS))
    targets = {k: Deck(rng, ANSWERS[k]) for k in KINDS}
    rows = []
    said: dict[tuple[str, str], int] = {}  # (kind, answer) -> train rows so far: the next one's style
    for i in range(split_sizes(cfg)[split]):
        kind = kinds.deal()
        target = targets[kind].deal()
        for _ in range(1000):
            item = make_item(rng, cfg.image_size, kind, target,
                             held_out=tuple(cfg.sft_held_out_formats) if split == "train" else ())
            pngs = [_png(im) for im in item.images]
            hashes = [hashlib.sha256(p).hexdigest() for p in pngs]
            key = (*hashes, item.question)
            if key not in seen and all(image_split.get(h, split) == split for h in hashes):
                break
        else:
            raise ValueError(f"world: cannot draw {split_sizes(cfg)[split]} distinct {split} examples; the world "
                             "has fewer distinct (image, question) pairs than requested")
        seen.add(key)
        image_split.update((h, split) for h in hashes)
        item_id = f"{split}-{i:06d}"
        rels = []
        for k, png in enumerate(pngs):
            rel = Path("images") / split / (f"{item_id}.png" if k == 0 else f"{item_id}-{k + 1}.png")
            (out_dir / rel).write_bytes(png)
            rels.append(str(rel))
        target = None
        if split == "train":
            n = said.get((item.kind, item.answer), 0)
            said[(item.kind, item.answer)] = n + 1
            style = STYLES[n % len(STYLES)]
            target = sft_target(style, item.kind, item.answer, item.facts, item_id, cfg.sft_account_error, cfg.seed,
                                cfg.sft_account_vague) if cfg.accounts else styled(style, item.answer)
        rows.append({"id": item_id, "split": split, "kind": item.kind, "family": item.family,
                     "question": item.question, "answer": item.answer, "candidates": json.dumps(item.candidates),
                     "options": json.dumps(item.options, ensure_ascii=False), "image": rels[0],
                     "extra_images": json.dumps(rels[1:]), "difficulty": item.difficulty, "target": target,
                     "facts": json.dumps(item.facts)})
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.to_parquet(out_dir / f"{split}.parquet", index=False)
    return df


def generate_world(cfg: WorldConfig, out_dir: Path) -> dict[str, pd.DataFrame]:
    out_dir.mkdir(parents=True, exist_ok=True)
    seen: set[tuple[str, ...]] = set()
    image_split: dict[str, str] = {}
    return {split: generate_split(cfg, split, out_dir, seen, image_split) for split in SPLITS}


def vocabulary_texts(train: pd.DataFrame) -> list[str]:
    """The text the world's tokenizer learns: the train split's questions, answers, SFT targets and candidate
    answers, and every phrase a teacher can say."""
    targets = [t for t in train["target"] if isinstance(t, str)] if "target" in train else []
    return (list(train["question"]) + list(train["answer"]) + targets + all_templates() * 20
            + [c for cands in train["candidates"] for c in json.loads(cands)])
