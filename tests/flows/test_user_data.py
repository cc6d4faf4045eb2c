"""End to end: your own model and your own files, in four layouts, through `dvc repro evaluate`.

The train split is LLaVA conversations (JSONL, image paths), the RL pool a verl table (a chat-message
`prompt`, `images` as a list of {bytes}, `reward_model.ground_truth`), the val split an EasyR1 table
(`problem`, `images` as paths, `answer`) and the test split a Hugging Face style parquet table (an image
struct, lettered option columns, `category`). The model is a tiny qwen2_vl folder. dvc.yaml then has a data
stage in place of the world; editing one RL row re-runs data, curate and what follows, not sft."""
import io
import json
import random
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import yaml
from PIL import Image

from protege import stage_host
from tests.conftest import REPO
from tests.families import build_family
from tests.flows.test_pipeline import project_env, tiny_params

COLORS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}


def png(rgb, k: int) -> bytes:
    im = Image.new("RGB", (64, 64), rgb)
    im.putpixel((k % 64, k // 64 % 64), (0, 0, 0))  # every image its own bytes
    buf = io.BytesIO()
    im.save(buf, format="PNG")
    return buf.getvalue()


def write_files(mine, rng):
    (mine / "images").mkdir(parents=True)
    (mine / "val_images").mkdir()
    train = []
    for i in range(24):
        c = rng.choice(list(COLORS))
        (mine / "images" / f"t{i}.png").write_bytes(png(COLORS[c], i))
        train.append({"id": f"tr{i}", "image": f"images/t{i}.png", "answer": c, "conversations": [
            {"from": "human", "value": "<image>\nWhat colour is the square?"}, {"from": "gpt", "value": f"It is {c}."}]})
    (mine / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train))
    rl = [{"data_source": "colours", "prompt": [{"role": "user", "content": "<image>Which colour is this?"}],
           "images": [{"bytes": png(COLORS[c], 100 + i)}], "ability": "vision",
           "reward_model": {"style": "rule", "ground_truth": c}, "extra_info": {"index": i}}
          for i, c in enumerate(rng.choice(list(COLORS)) for _ in range(16))]
    pd.DataFrame(rl).to_parquet(mine / "rl.parquet")
    val = []
    for i in range(8):
        c = rng.choice(list(COLORS))
        (mine / "val_images" / f"v{i}.png").write_bytes(png(COLORS[c], 200 + i))
        val.append({"problem": "<image>Name the colour.", "images": [f"val_images/v{i}.png"], "answer": c})
    pd.DataFrame(val).to_parquet(mine / "val.parquet")
    names = list(COLORS)
    test = [{"id": f"te{i}", "question": "Which colour is the square?",
             "image": {"bytes": png(COLORS[c], 300 + i), "path": None}, **dict(zip("ABCD", names)),
             "answer": "ABCD"[names.index(c)], "category": "light" if i % 2 else "dark"}
            for i, c in enumerate(rng.choice(names) for _ in range(12))]
    pd.DataFrame(test).to_parquet(mine / "test.parquet")
    return {"train": 24, "rl": 16, "val": 8, "test": 12}


def protege(proj, *args, check=True):
    return subprocess.run([sys.executable, "-m", "protege", *args], cwd=proj, env=project_env(proj), check=check,
                          capture_output=True, text=True)


def dvc(proj, *args):
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=proj, env=project_env(proj),
                          capture_output=True, text=True)


@pytest.mark.slow
def test_your_files_and_model_through_every_stage_to_evaluate(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    shutil.copytree(REPO / "protege", proj / "protege", ignore=shutil.ignore_patterns("__pycache__"))
    build_family("qwen2_vl", proj / "mymodel")
    counts = write_files(proj / "mine", random.Random(0))
    params = yaml.safe_load(tiny_params(baseline=None))
    params["data"].update({"source": "files", "train": "mine/train.jsonl", "rl": "mine/rl.parquet",
                           "val": ["mine/val.parquet"], "test": "mine/test.parquet"})
    params["model"]["path"] = "mymodel"
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert dvc(proj, "init", "--no-scm", "-q").returncode == 0
    assert "written for data.source files" in protege(proj, "dag").stdout
    protege(proj, "model", "pin")
    # the two full runs under a warm stage host (what the pipeline flow runs its stages under): each `protege stage`
    # DVC starts skips a fresh process's imports, the stage runs as it would alone (protege/stage_host.py); the
    # bad file at the end goes through a stage in its own process
    with stage_host.running():  # one host for both runs: its imports are paid once
        first = dvc(proj, "repro", "evaluate")
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]

        assert "Running stage 'world'" not in first.stdout and not (proj / "data/world").exists()
        assert "Running stage 'data'" in first.stdout and not (proj / "models/base").exists()
        for split, n in counts.items():
            assert len(pd.read_parquet(proj / f"data/imported/{split}.parquet")) == n, split
        assert f"sft {counts['train']} examples (0 pool batches), from mymodel" in first.stdout + first.stderr
        rl_ids = set(pd.read_parquet(proj / "data/imported/rl.parquet")["id"])
        curated = pd.read_parquet(proj / "data/curated/rl.parquet")
        assert len(curated) == params["curate"]["select"] and set(curated["id"]) <= rl_ids
        report = json.loads((proj / "reports/eval.json").read_text())
        assert report["test_split"] == "test split (test.parquet)" and report["benchmarks"] == {}
        assert all(m["world_test"]["items"] == counts["test"] for m in report["models"].values())
        markdown = (proj / "reports/eval.md").read_text()
        assert markdown.startswith("# Evaluation on the test split (test.parquet)")
        assert "| light: accuracy" in markdown and "| dark: accuracy" in markdown     # the category column
        assert "Data and pipelines are up to date" in dvc(proj, "status", "--with-deps", "evaluate").stdout
        lock = yaml.safe_load((proj / "dvc.lock").read_text())["stages"]
        assert "world" not in lock and "data" in lock

        # one RL row edited: data, curate and what follows re-run, sft (whose train file did not change) does not
        df = pd.read_parquet(proj / "mine/rl.parquet")
        reward = dict(df.loc[3, "reward_model"])
        df.at[3, "reward_model"] = {**reward, "ground_truth": "purple"}
        df.to_parquet(proj / "mine/rl.parquet")
        again = dvc(proj, "repro", "evaluate")
        assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
        for stage in ("data", "curate", "rl", "evaluate"):
            assert f"Running stage '{stage}'" in again.stdout, stage
        assert "Stage 'sft' didn't change, skipping" in again.stdout
        assert pd.read_parquet(proj / "data/imported/rl.parquet")["answer"][3] == "purple"

    # a bad file stops the data stage before any compute, naming it; the last good import stays
    (proj / "mine/rl.parquet").write_bytes(b"not parquet")
    bad = dvc(proj, "repro", "data")
    assert bad.returncode != 0 and "rl.parquet: not a readable parquet table" in bad.stdout + bad.stderr
    assert len(pd.read_parquet(proj / "data/imported/rl.parquet")) == counts["rl"]
