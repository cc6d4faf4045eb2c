"""A real dataset's size through the pipeline's first stages: rows per second and peak resident memory per stage.

Writes, once (kept under --work and reused):
  train.jsonl      N LLaVA conversation records (default 100,000), one 256 x 256 JPEG each on disk (images/)
  rl.parquet       M rows (default 20,000) in verl's layout with every image embedded as bytes
  test.jsonl       500 records (a test split is required; its images on disk too)
then a project whose params.yaml reads them (`data.source: files`) with an embedded-architecture student as
`model.path`, and runs `data` (import and validation), `validate`, `sft` (a few steps) and `curate` one stage
at a time under `dvc repro -s`, each from a fresh parent so its peak resident set size is its own (the largest
process of the stage: ru_maxrss of the waited-for children). Prints one line per stage and a JSON summary:
seconds, rows, rows per second, peak RSS, and for sft the seconds from the stage's start to its first
logged step (an upper bound on the first step's: sft logs every few steps).

    .venv/bin/python benchmarks/data_scale.py [--rows 100000] [--parquet-rows 20000] [--work /tmp/data_scale]
    .venv/bin/python benchmarks/data_scale.py --rows 2000 --parquet-rows 500      # a quick look
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PASS = re.compile(r"^.*?(?=\S+: [\d,]+/[\d,]+ )")  # a stage's closing progress line, from its pass's name on
COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 20)}
SIDE = 256


def jpeg(i: int) -> tuple[bytes, str]:
    """A 256 x 256 JPEG of a coloured square on a textured ground (every image its own bytes), and its colour."""
    from PIL import Image, ImageDraw

    rng = random.Random(i)
    colour = rng.choice(list(COLOURS))
    im = Image.new("RGB", (SIDE, SIDE), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    draw = ImageDraw.Draw(im)
    for _ in range(6):
        x, y = rng.randrange(SIDE), rng.randrange(SIDE)
        draw.line((x, y, rng.randrange(SIDE), rng.randrange(SIDE)), fill=(rng.randrange(256),) * 3, width=3)
    x, y = rng.randrange(SIDE - 96), rng.randrange(SIDE - 96)
    draw.rectangle((x, y, x + 96, y + 96), fill=COLOURS[colour])
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=85)
    return buf.getvalue(), colour


def _write_images(args: tuple[Path, str, int, int]) -> list[str]:
    folder, prefix, start, stop = args
    colours = []
    for i in range(start, stop):
        data, colour = jpeg(i)
        (folder / f"{prefix}{i}.jpg").write_bytes(data)
        colours.append(colour)
    return colours


def images_on_disk(folder: Path, prefix: str, n: int, offset: int) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    chunks = [(folder, prefix, offset + s, offset + min(s + 2000, n)) for s in range(0, n, 2000)]
    with ProcessPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return [c for part in pool.map(_write_images, chunks) for c in part]


def llava(path: Path, images: str, prefix: str, colours: list[str], offset: int) -> None:
    with path.open("w") as f:
        for k, colour in enumerate(colours):
            i = offset + k
            f.write(json.dumps({"id": f"{prefix}{i}", "image": f"{images}/{prefix}{i}.jpg", "answer": colour,
                                "conversations": [{"from": "human", "value": "<image>\nWhat colour is the square?"},
                                                  {"from": "gpt", "value": f"It is {colour}."}]}) + "\n")


def verl_parquet(path: Path, n: int, offset: int) -> None:
    """verl's RL layout, images embedded as bytes, written by row groups (never the whole table in memory)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer = None
    for start in range(0, n, 1000):
        rows = []
        for i in range(offset + start, offset + min(start + 1000, n)):
            data, colour = jpeg(i)
            rows.append({"data_source": "colours", "prompt": [{"role": "user", "content": "<image>Which colour is this?"}],
                         "images": [{"bytes": data}], "reward_model": {"style": "rule", "ground_truth": colour},
                         "extra_info": {"index": i}})
        table = pa.Table.from_pylist(rows)
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()


def write_dataset(mine: Path, rows: int, parquet_rows: int) -> dict:
    marker = mine / "done.json"
    if marker.exists() and json.loads(marker.read_text()) == {"rows": rows, "parquet_rows": parquet_rows}:
        return json.loads(marker.read_text())
    shutil.rmtree(mine, ignore_errors=True)
    mine.mkdir(parents=True)
    t0 = time.perf_counter()
    llava(mine / "train.jsonl", "images", "t", images_on_disk(mine / "images", "t", rows, 0), 0)
    llava(mine / "test.jsonl", "images", "e", images_on_disk(mine / "images", "e", 500, 10_000_000), 10_000_000)
    verl_parquet(mine / "rl.parquet", parquet_rows, 20_000_000)
    size = sum(p.stat().st_size for p in mine.rglob("*") if p.is_file())
    print(f"wrote {rows:,} + 500 JPEGs and a {parquet_rows:,}-row parquet with embedded images "
          f"({size / 2**30:.2f} GiB) in {time.perf_counter() - t0:.0f} s", flush=True)
    marker.write_text(json.dumps({"rows": rows, "parquet_rows": parquet_rows}))
    return {"rows": rows, "parquet_rows": parquet_rows}


def student(folder: Path) -> None:
    """The embedded Qwen2-VL architecture at its default (tiny) sizes, as a Hugging Face folder."""
    from protege.config import ModelConfig
    from protege.models.processor import StudentProcessor
    from protege.models.student import build_student
    from protege.models.tokenizer import train_tokenizer

    texts = ["What colour is the square?", "Which colour is this?"] + [f"It is {c}." for c in COLOURS] * 20
    processor = StudentProcessor.create(train_tokenizer(texts, 300), 64, 8, 2)
    build_student(ModelConfig(), processor, seed=0).save_pretrained(folder, safe_serialization=True)
    processor.save_pretrained(folder)


def project(work: Path, sft_steps: int, select: int) -> Path:
    import yaml

    proj = work / "proj"
    shutil.rmtree(proj, ignore_errors=True)
    proj.mkdir(parents=True)
    shutil.copytree(REPO / "protege", proj / "protege", ignore=shutil.ignore_patterns("__pycache__"))
    student(proj / "student")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["data"].update({"source": "files", "train": str(work / "mine/train.jsonl"),
                           "rl": str(work / "mine/rl.parquet"), "test": str(work / "mine/test.jsonl"), "val": None})
    params["model"]["path"] = "student"
    params["sft"].update({"steps": sft_steps, "device": "cpu"})
    params["curate"].update({"select": select})
    (proj / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(proj, [sys.executable, "-m", "dvc", "init", "--no-scm", "-q"])
    run(proj, [sys.executable, "-m", "protege", "dag"])
    run(proj, [sys.executable, "-m", "protege", "model", "pin"])
    return proj


def env(proj: Path) -> dict:
    e = dict(os.environ)
    e["PATH"] = str(Path(sys.executable).parent) + os.pathsep + e["PATH"]
    e["PREFECT_HOME"] = str(proj / ".prefect")
    e.setdefault("HF_HUB_OFFLINE", "1")
    return e


def run(proj: Path, cmd: list[str]) -> None:
    done = subprocess.run(cmd, cwd=proj, env=env(proj), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")


_ONE_STAGE = """
import resource, subprocess, sys, time, json
t0 = time.perf_counter(); first = None
p = subprocess.Popen([sys.executable, "-m", "dvc", "repro", "-s", sys.argv[1]], stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
lines = []
for line in p.stdout:
    lines.append(line)
    if first is None and sys.argv[2] and __import__("re").search(sys.argv[2], line):
        first = time.perf_counter() - t0
rc = p.wait()
finals = [ln.strip() for ln in lines if "in all)" in ln]  # each pass's closing progress line
print(json.dumps({"rc": rc, "seconds": time.perf_counter() - t0, "first_step_s": first, "finals": finals,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
                  "tail": "".join(lines[-40:])}))
"""


def stage(proj: Path, name: str, first_line: str = "") -> dict:
    done = subprocess.run([sys.executable, "-c", _ONE_STAGE, name, first_line], cwd=proj, env=env(proj),
                          capture_output=True, text=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["rc"]:
        sys.exit(f"dvc repro -s {name} failed:\n{result['tail']}")
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--parquet-rows", type=int, default=20_000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/data_scale"))
    ap.add_argument("--sft-steps", type=int, default=5)
    args = ap.parse_args(argv)
    write_dataset(args.work / "mine", args.rows, args.parquet_rows)
    proj = project(args.work, args.sft_steps, select=min(2000, args.parquet_rows))
    with open(proj / "dvc.yaml") as f:
        stages = set(__import__("yaml").safe_load(f)["stages"])
    rows = {"data": args.rows + args.parquet_rows + 500, "validate": args.rows + args.parquet_rows + 500,
            "curate": args.parquet_rows}  # sft reads its table, then trains a few steps: no rate over rows
    summary = {}
    for name in ("data", "validate", "pool", "sft", "curate"):
        if name not in stages:
            continue
        r = stage(proj, name, r"step \d+:" if name == "sft" else "")
        n = rows.get(name)
        summary[name] = {"seconds": round(r["seconds"], 1), "rows": n,
                         "rows_per_s": round(n / r["seconds"], 1) if n else None,
                         "peak_rss_mib": round(r["peak_rss_mib"], 1),
                         **({"first_step_s": round(r["first_step_s"], 1) if r["first_step_s"] else None}
                            if name == "sft" else {}),
                         "passes": [PASS.sub("", ln) for ln in r["finals"]]}
        s = summary[name]
        print(f"{name:>9}: {s['seconds']:8.1f} s  peak RSS {s['peak_rss_mib']:8.1f} MiB"
              + (f"  {s['rows_per_s']:9.1f} rows/s over {n:,} rows" if n else "")
              + (f"  first logged step after {s['first_step_s']} s" if name == "sft" else ""), flush=True)
        for line in s["passes"]:
            print(f"{'':>11}{line}", flush=True)
    print(json.dumps({"part": "data_scale", "rows": args.rows, "parquet_rows": args.parquet_rows, **summary}))


if __name__ == "__main__":
    main()
