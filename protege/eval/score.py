"""Scoring one benchmark's predictions: coverage checks, the benchmark's scorer, summary and rows.

Predictions are JSONL, one object per line: {"index": ..., "prediction": "..."} and optionally
"tokens" and "latency_s" (what `protege eval run` records). Any model's outputs can be scored this
way, without loading a model.
"""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from protege.errors import UserFacingError
from protege.bench.items import BenchItem, Scored, Unit
from protege.eval.judging import check_tally
from protege.eval.stats import bootstrap_ci, score_of


@dataclass
class Prediction:
    index: str
    text: str
    tokens: int | None = None
    latency_s: float | None = None


def _listed(values: list[str], limit: int = 10) -> str:
    shown = ", ".join(values[:limit])
    return shown + (f" and {len(values) - limit} more" if len(values) > limit else "")


def read_predictions(path: str | Path) -> dict[str, Prediction]:
    path = Path(path)
    if not path.is_file():
        raise UserFacingError(f"{path}: predictions file not found (expected JSONL lines "
                              '{"index": ..., "prediction": "..."})')
    preds: dict[str, Prediction] = {}
    problems = []
    for n, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.append(f"line {n}: not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})")
            continue
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"line {n}: not JSON ({exc.msg})")
            continue
        if not isinstance(rec, dict) or "index" not in rec or not isinstance(rec.get("prediction"), str):
            problems.append(f'line {n}: expected {{"index": ..., "prediction": "<text>"}}')
            continue
        key = str(rec["index"])
        if key in preds:
            problems.append(f"line {n}: index {key} predicted twice")
            continue
        preds[key] = Prediction(key, rec["prediction"], rec.get("tokens"), rec.get("latency_s"))
    if problems:
        raise UserFacingError(f"{path}: {len(problems)} bad line(s): {_listed(problems, 5)}")
    return preds


def write_predictions(path: str | Path, preds: list[Prediction]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"index": p.index, "prediction": p.text, "tokens": p.tokens,
                                        "latency_s": p.latency_s}, ensure_ascii=False) + "\n" for p in preds),
                    encoding="utf-8")
    return path


def check_coverage(items: list[BenchItem], preds: dict[str, Prediction], pred_path: str | Path) -> None:
    """Every item needs a prediction, and every prediction an item: a silent gap would move the score."""
    indices = [it.index for it in items]
    missing = [it for it in items if it.index not in preds]
    if missing:
        rows = [f"index {it.index} (row {it.row})" if it.row else f"index {it.index}" for it in missing]
        raise UserFacingError(f"{pred_path}: no prediction for {len(missing)} of {len(items)} items of "
                              f"{items[0].source or items[0].benchmark}: {_listed(rows)}")
    unknown = sorted(set(preds) - set(indices))
    if unknown:
        raise UserFacingError(f"{pred_path}: {len(unknown)} prediction(s) for indices not in the benchmark file: "
                              f"{_listed(unknown)}")


def _breakdown(units: list[Unit], key: str) -> dict[str, dict]:
    groups: dict[str, list[float]] = defaultdict(list)
    for u in units:
        if getattr(u, key):
            groups[getattr(u, key)].append(u.score)
    return {k: {"score": 100 * sum(v) / len(v), "n": len(v)} for k, v in sorted(groups.items())}


def chance_score(items: list[BenchItem], aggregate: str) -> float:
    """The expected score of guessing a listed option uniformly at random (open questions: 0), with the
    benchmark's own units and aggregation: a circular group is right only if every copy is."""
    units: dict[str, Unit] = {}
    for it in items:
        p = 1.0 / len(it.options) if it.options else 0.0
        key = it.group or it.index
        if key in units:
            units[key].score *= p
        else:
            units[key] = Unit(key, p, it.l2_category if aggregate == "macro" and it.l2_category else it.category)
    return score_of(list(units.values()), aggregate)


def score_benchmark(name: str, items: list[BenchItem], preds: dict[str, Prediction], protocol: str = "lmms-eval",
                    complete=None, n_boot: int = 1000, seed: int = 0, grader_prompt: str | None = None
                    ) -> tuple[dict, list[dict], list[Unit]]:
    """(summary, one row per item, the units the bootstrap resamples)."""
    from protege.eval.scorers import scorer_for

    scorer = scorer_for(name, protocol, grader_prompt)
    texts = [preds[it.index].text for it in items]
    take_tally = getattr(complete, "take_tally", None)
    if take_tally:
        take_tally()  # what an earlier benchmark asked is not this one's
    scored: list[Scored] = scorer.score(items, texts, complete)
    judge = take_tally() if take_tally else None
    if judge is not None:
        check_tally(judge, complete.who, complete.max_unusable, name)
    units = scorer.units(items, scored)
    lo, hi = bootstrap_ci(units, scorer.aggregate, n_boot, seed)
    tokens = [p.tokens for p in (preds[it.index] for it in items) if p.tokens is not None]
    latency = [p.latency_s for p in (preds[it.index] for it in items) if p.latency_s is not None]
    summary = {
        "benchmark": name, "data": items[0].source if items else "", "protocol": scorer.protocol,
        "aggregate": scorer.aggregate,
        "score": score_of(units, scorer.aggregate), "ci": [lo, hi], "chance": chance_score(items, scorer.aggregate),
        "items": len(items), "units": len(units),
        "per_category": _breakdown(units, "category"), "per_difficulty": _breakdown(units, "difficulty"),
        "mean_tokens": sum(tokens) / len(tokens) if tokens else None,
        "mean_latency_s": sum(latency) / len(latency) if latency else None,
        "notes": dict(Counter(s.note for s in scored if s.note)),
        "judge": judge.as_dict() if judge is not None else None,
    }
    rows = [{"index": it.index, "category": it.category, "answer": it.answer, "prediction": preds[it.index].text,
             "extracted": s.extracted, "score": s.score, "note": s.note} for it, s in zip(items, scored)]
    return summary, rows, units


def write_scores(out_dir: str | Path, summary: dict, rows: list[dict], units: list[Unit]) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False), encoding="utf-8")
    (out / "items.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                     encoding="utf-8")
    (out / "units.json").write_text(json.dumps({u.id: u.score for u in units}), encoding="utf-8")
    return out
