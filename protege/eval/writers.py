"""`BenchItem`s -> the benchmark file layouts `protege.eval.readers` reads (see its docstring for each one).

TSV is written as VLMEvalKit does (pandas, tab-separated, base64 images, a Python-literal list of base64
strings for a multi-image question); parquet in the lmms-eval / Hugging Face layout of that benchmark, images
as {bytes, path} structs, with the `huggingface` schema metadata so `datasets` decodes them as images; MM-Vet
(v1, v2) also as the release's JSON plus an `images/` folder. Whatever a layout has no column for is lost on
the way (e.g. ai2d, chartqa and realworldqa parquet have no id column: read back, the index is the row
position).
"""
from __future__ import annotations

import base64
import io
import json
from pathlib import Path

from PIL import Image

from protege.data.image_bytes import sniff_ext
from protege.bench.items import BENCHMARKS, BenchItem
from protege.eval.readers import JSON_NAME, LETTERS, SEED_TYPES, line_options

SEED_IDS = {v: k for k, v in SEED_TYPES.items()}


def _ext(data: bytes) -> str:
    ext = sniff_ext(data).lstrip(".")
    return "png" if ext == "img" else ext


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _struct(data: bytes | None, name: str) -> dict | None:
    return None if data is None else {"bytes": data, "path": f"{name}.{_ext(data)}"}


def _safe(index: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in str(index)) or "item"


def _capability(item: BenchItem) -> list[str]:
    caps = item.meta.get("capability")
    if caps:
        return [str(c) for c in caps]
    return [c.strip() for c in item.category.split(",") if c.strip()]


def _placed(question: str, names: list[str]) -> str:
    """MM-Vet v2 question with each "<image>" placeholder turned into an `<IMG>name<IMG>` marker, in order;
    images without a placeholder go first."""
    parts = question.split("<image>")
    free = len(parts) - 1
    lead = "".join(f"<IMG>{nm}<IMG>" for nm in names[:max(0, len(names) - free)])
    names = names[max(0, len(names) - free):]
    out = [parts[0]]
    for k, part in enumerate(parts[1:]):
        out.append(f"<IMG>{names[k]}<IMG>" if k < len(names) else "<image>")
        out.append(part)
    return lead + "".join(out)


# ---------------------------------------------------------------------------------------------- TSV

def _tsv(name: str, items: list[BenchItem], path: Path) -> None:
    import pandas as pd

    letters = [L for L in LETTERS if name != "mathvista" and any(L in it.options for it in items)]
    rows = []
    for it in items:
        imgs = [_b64(b) for b in it.images]
        r = {"index": it.index, "image": imgs[0] if len(imgs) == 1 else (str(imgs) if imgs else ""),
             "question": it.question, "hint": it.hint}
        r.update({L: it.options.get(L, "") for L in letters})
        r.update({"answer": it.answer, "category": it.category, "l2-category": it.l2_category,
                  "split": str(it.meta.get("split", ""))})
        if name == "mathvista":
            m = it.meta
            choices = m.get("choices") or (list(it.options.values()) if it.options else [])
            r.pop("category")
            prec = m.get("precision")
            r.update({"task": it.category, "question_type": m.get("question_type", ""),
                      "answer_type": m.get("answer_type", ""), "precision": "" if prec is None else str(prec),
                      "unit": m.get("unit", "") or "", "choices": str(list(choices)) if choices else "",
                      "answer_option": m.get("answer_option", ""),
                      "skills": str(list(m["skills"])) if m.get("skills") else ""})
            for key in ("grade", "context", "source", "language"):
                if m.get(key):
                    r[key] = str(m[key])
        elif name in ("mmvet", "mmvet_v2"):
            r["category"] = ",".join(_capability(it))
        elif name == "chartqa":
            answers = it.meta.get("answers") or []
            if len(answers) > 1:
                r["answer"] = str([str(a) for a in answers])
        elif name in ("mmmu", "mmmu_pro"):
            r.update({"question_type": it.meta.get("question_type", "multiple-choice" if it.options else "open"),
                      "topic_difficulty": it.difficulty})
            for key in ("subfield", "img_type"):
                if it.meta.get(key):
                    r[key] = str(it.meta[key])
        elif name in ("mmbench", "mmbench_cn"):
            for key in ("source", "comment"):
                if it.meta.get(key):
                    r[key] = str(it.meta[key])
        rows.append(r)
    df = pd.DataFrame(rows).fillna("")
    df.to_csv(path, sep="\t", index=False)


# ---------------------------------------------------------------------------------------------- parquet

def _feature(t, image: str | None) -> dict:
    import pyarrow as pa

    if image == "one":
        return {"_type": "Image"}
    if image == "list":
        return {"feature": {"_type": "Image"}, "_type": "Sequence"}
    if pa.types.is_list(t):
        return {"feature": _feature(t.value_type, None), "_type": "Sequence"}
    if pa.types.is_struct(t):
        return {t.field(i).name: _feature(t.field(i).type, None) for i in range(t.num_fields)}
    dtype = {pa.string(): "string", pa.int64(): "int64", pa.float64(): "float64", pa.bool_(): "bool",
             pa.binary(): "binary"}.get(t, "string")
    return {"dtype": dtype, "_type": "Value"}


def _write_parquet(records: list[dict], path: Path, images: dict[str, str], types: dict | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    img = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    columns = list(dict.fromkeys(k for r in records for k in r))
    arrays, features = [], {}
    for col in columns:
        values = [r.get(col) for r in records]
        if col in images:
            arr = pa.array(values, type=img if images[col] == "one" else pa.list_(img))
        elif types and col in types:
            arr = pa.array(values, type=types[col])
        else:
            try:
                arr = pa.array(values)
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                arr = pa.array([None if v is None else str(v) for v in values], type=pa.string())
            if pa.types.is_null(arr.type):
                arr = arr.cast(pa.string())
        arrays.append(arr)
        features[col] = _feature(arr.type, images.get(col))
    table = pa.Table.from_arrays(arrays, names=columns)
    meta = {b"huggingface": json.dumps({"info": {"features": features}}).encode()}
    pq.write_table(table.replace_schema_metadata(meta), path)


def _numbered(it: BenchItem, r: dict, first: int, last: int, name: str) -> None:
    if len(it.images) > last - first + 1:
        raise ValueError(f"{name} item {it.index} has {len(it.images)} images; its layout holds at most "
                         f"{last - first + 1}")
    for k in range(first, last + 1):
        j = k - first
        r[f"image_{k}"] = _struct(it.images[j], f"{_safe(it.index)}_{k}") if j < len(it.images) else None


def _four(name: str, it: BenchItem) -> list[str]:
    if any(L not in "ABCD" for L in it.options):
        raise ValueError(f"{name} item {it.index}: its parquet layout holds options A-D only, got "
                         f"{list(it.options)}")
    return [it.options.get(L) for L in "ABCD"]


def _one(it: BenchItem) -> dict | None:
    if len(it.images) > 1:
        raise ValueError(f"{it.benchmark} item {it.index} has {len(it.images)} images; its layout holds one")
    return _struct(it.images[0], _safe(it.index)) if it.images else None


def _parquet(name: str, items: list[BenchItem], path: Path) -> None:
    import pyarrow as pa

    records, images, types = [], {}, {}
    numeric = all(x.index.isdigit() for x in items)  # MMBench / MMStar index is an int64 column when it can be
    # the option columns every row of the file gets (computed once: MMBench files hold thousands of rows)
    letters = [L for L in LETTERS if any(L in x.options for x in items)] or list("ABCD")
    for it in items:
        opts = list(it.options.values())
        if name == "ai2d":
            ans = str(list(it.options).index(it.answer)) if it.answer in it.options else it.answer
            records.append({"question": it.question, "options": opts, "answer": ans, "image": _one(it)})
            images, types = {"image": "one"}, {"options": pa.list_(pa.string())}
        elif name == "chartqa":
            records.append({"type": it.category, "question": it.question, "answer": it.answer, "image": _one(it)})
            images = {"image": "one"}
        elif name == "mathvista":
            m = it.meta
            size = (None, None)
            if it.images:
                with Image.open(io.BytesIO(it.images[0])) as im:
                    size = im.size
            prec = m.get("precision")
            choices = m.get("choices") or (opts if m.get("question_type") == "multi_choice" else None)
            ext = _ext(it.images[0]) if it.images else "png"
            records.append({
                "pid": it.index, "question": it.question, "image": f"images/{_safe(it.index)}.{ext}",
                "decoded_image": _one(it), "choices": list(choices) if choices else None,
                "unit": m.get("unit") or None, "precision": None if prec is None else float(prec),
                "answer": it.answer, "question_type": m.get("question_type", "free_form"),
                "answer_type": m.get("answer_type", "text"),
                "metadata": {"category": it.l2_category, "context": m.get("context", ""),
                             "grade": m.get("grade", ""), "img_height": size[1], "img_width": size[0],
                             "language": m.get("language", "english"), "skills": list(m.get("skills") or []),
                             "source": m.get("source", ""), "split": m.get("split", "testmini"),
                             "task": it.category},
                "query": m.get("query") or it.question})
            images = {"decoded_image": "one"}
            types = {"choices": pa.list_(pa.string()), "unit": pa.string(), "precision": pa.float64(),
                     "metadata": pa.struct([("category", pa.string()), ("context", pa.string()),
                                            ("grade", pa.string()), ("img_height", pa.int64()),
                                            ("img_width", pa.int64()), ("language", pa.string()),
                                            ("skills", pa.list_(pa.string())), ("source", pa.string()),
                                            ("split", pa.string()), ("task", pa.string())])}
        elif name in ("mmbench", "mmbench_cn"):
            r = {"index": int(it.index) if numeric else it.index, "question": it.question,
                 "hint": it.hint or None, "answer": it.answer}
            r.update({L: it.options.get(L) for L in letters})
            r.update({"category": it.category, "image": _one(it), "source": it.meta.get("source", ""),
                      "l2-category": it.l2_category, "comment": it.meta.get("comment", ""),
                      "split": it.meta.get("split", "dev")})
            records.append(r)
            images = {"image": "one"}
            types = {L: pa.string() for L in letters} | {"hint": pa.string()}
        elif name == "mmvet":
            records.append({"question_id": it.index, "image": _one(it), "question": it.question,
                            "answer": it.answer, "image_source": it.meta.get("image_source", ""),
                            "capability": ",".join(_capability(it))})
            images = {"image": "one"}
        elif name == "mmvet_v2":
            names = [f"image_{k}.{_ext(b)}" for k, b in enumerate(it.images)]
            r = {"id": it.index, "question": _placed(it.question, names), "answer": it.answer,
                 "capability": _capability(it), "added_in": it.meta.get("added_in", "v2")}
            records.append(r)
            types["capability"] = pa.list_(pa.string())
        elif name in ("mmmu", "mmmu_pro"):
            r = {"id": it.index, "question": it.question, "options": str(opts), "explanation": ""}
            _numbered(it, r, 1, 7, name)
            img_type = it.meta.get("img_type") or str(["Diagrams"] * len(it.images))
            r.update({"img_type": str(img_type), "answer": it.answer, "topic_difficulty": it.difficulty})
            if name == "mmmu":
                r.update({"question_type": it.meta.get("question_type",
                                                       "multiple-choice" if it.options else "open"),
                          "subfield": str(it.meta.get("subfield", ""))})
            else:
                r["subject"] = it.category
            records.append(r)
            images = {f"image_{k}": "one" for k in range(1, 8)}
        elif name == "mmstar":
            shown = ", ".join(f"{L}: {t}" for L, t in it.options.items())
            q = f"{it.question}\nOptions: {shown}" if it.options else it.question
            records.append({"index": int(it.index) if numeric else it.index, "question": q,
                            "image": _one(it), "answer": it.answer, "category": it.category,
                            "l2_category": it.l2_category})
            images = {"image": "one"}
        elif name == "blink":
            r = {"idx": it.index, "question": it.question, "sub_task": it.category}
            _numbered(it, r, 1, 4, name)
            listing = "\n".join(f"({L}) {t}" for L, t in it.options.items())
            r.update({"choices": opts, "answer": f"({it.answer})",
                      "prompt": f"{it.question}\nSelect from the following choices.\n{listing}",
                      "explanation": "", "isVisualPrompt": False})
            records.append(r)
            images = {f"image_{k}": "one" for k in range(1, 5)}
            types = {"choices": pa.list_(pa.string())}
        elif name == "seedbench":
            a, b, c, d = _four(name, it)
            tid = it.meta.get("question_type_id") or SEED_IDS.get(it.category, it.category)
            records.append({"answer": it.answer, "choice_a": a, "choice_b": b, "choice_c": c, "choice_d": d,
                            "data_id": it.meta.get("data_id", f"{_safe(it.index)}.png"),
                            "data_type": it.meta.get("data_type", "image"), "question": it.question,
                            "question_id": it.index, "question_type_id": tid,
                            "image": [_struct(x, f"{_safe(it.index)}_{k}") for k, x in enumerate(it.images)]})
            images = {"image": "list"}
            types = {f"choice_{x}": pa.string() for x in "abcd"}
        elif name == "seedbench2_plus":
            a, b, c, d = _four(name, it)
            records.append({"question_id": it.index, "question": it.question, "choice_A": a, "choice_B": b,
                            "choice_C": c, "choice_D": d, "answer": it.answer,
                            "question_image_type": it.category, "question_image_subtype": it.l2_category,
                            "image": _one(it)})
            images = {"image": "one"}
            types = {f"choice_{x}": pa.string() for x in "ABCD"}
        elif name == "realworldqa":
            listed = line_options(it.question)[1] == it.options  # already in the text: RealWorldQA's own form
            listing = "" if listed else "".join(f"\n{L}. {t}" for L, t in it.options.items())
            records.append({"question": it.question + listing, "answer": it.answer, "image": _one(it)})
            images = {"image": "one"}
    if name == "seedbench":
        ids = [r["question_type_id"] for r in records]
        if all(isinstance(i, int) or str(i).isdigit() for i in ids):
            for r in records:
                r["question_type_id"] = int(r["question_type_id"])
        else:
            for r in records:
                r["question_type_id"] = str(r["question_type_id"])
    if name == "mmvet_v2":
        most = max((len(it.images) for it in items), default=0)
        for r, it in zip(records, items):
            for k in range(most):
                r[f"image_{k}"] = _struct(it.images[k], f"{_safe(it.index)}_{k}") if k < len(it.images) else None
        images = {f"image_{k}": "one" for k in range(most)}
    _write_parquet(records, path, images, types)


# ---------------------------------------------------------------------------------------------- JSON

def _json(name: str, items: list[BenchItem], path: Path) -> Path:
    if name not in JSON_NAME:
        raise ValueError(f"{name} has no JSON layout; only {', '.join(JSON_NAME)} do")
    if path.suffix.lower() != ".json":
        path = path / JSON_NAME[name]
    images_dir = path.parent / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    data = {}
    for it in items:
        if name == "mmvet" and len(it.images) > 1:
            raise ValueError(f"mmvet item {it.index} has {len(it.images)} images; mm-vet.json holds one")
        names = [f"{_safe(it.index)}{'' if name == 'mmvet' else f'_{k}'}.{_ext(b)}"
                 for k, b in enumerate(it.images)]
        for nm, b in zip(names, it.images):
            (images_dir / nm).write_bytes(b)
        if name == "mmvet":
            data[it.index] = {"imagename": names[0] if names else "", "capability": _capability(it),
                              "question": it.question, "answer": it.answer}
        else:
            data[it.index] = {"question": _placed(it.question, names), "answer": it.answer,
                              "capability": _capability(it), "added_in": it.meta.get("added_in", "v2")}
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")
    return path


def write_benchmark(name: str, items: list[BenchItem], path: str | Path, fmt: str) -> Path:
    """Writes `items` in the benchmark's `fmt` layout ("tsv", "parquet" or "json"); returns the file written."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; expected one of {', '.join(BENCHMARKS)}")
    fmt = fmt.lower().lstrip(".")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "tsv":
        _tsv(name, items, path)
    elif fmt == "parquet":
        _parquet(name, items, path)
    elif fmt == "json":
        return _json(name, items, path)
    else:
        raise ValueError(f"unknown format {fmt!r}; expected tsv, parquet or json")
    return path
