"""The text prompt a model sees for a benchmark question: lmms-eval's default prompt for that task.

Images travel separately; no <image> tokens are added. Image markers already in the question are
treated as lmms-eval treats them: MMMU keeps "<image 1>" (lmms-eval's default, non-interleaved
format leaves them in the text), MM-Vet v2 turns each "<IMG>file.png<IMG>" segment into "[<IMG_PLH>]".

Prompts per task (lmms-eval `default` kwargs):
  ai2d, seedbench, seedbench2_plus   question, "A. text" lines, "Answer with the option's letter from the
                                     given choices directly."
  mmstar, realworldqa, blink         the dataset's question already lists the options (MMStar "Options:
                                     A: ..", RealWorldQA "A. .." lines, BLINK "(A) .." lines); they are
                                     appended only when the question does not contain them. MMStar adds
                                     "\\nAnswer with the option's letter from the given choices directly"
                                     (no final period, as in lmms-eval); BLINK starts with "Note: You only
                                     need to respond with A, B, C without providing any additional information."
  mmbench / mmbench_cn               "{hint} {question} There are several options:\\nA. ..", then
                                     "\\n\\nAnswer with the option's letter from the given choices directly." /
                                     "有如下几个选项：" and "\\n\\n请直接使用所提供的选项字母作为答案回答。"
  mmmu / mmmu_pro                    question, options, blank line, "Answer with the option's letter from the
                                     given choices directly." (MMMU-Pro: "the option letter"); MMMU open:
                                     "Answer the question using a single word or phrase."
  chartqa                            question, "\\nAnswer the question using a single word or phrase."
  mathvista                          lmms-eval "format-prompt": question (Unit: u), "A. choice" lines, a line
                                     saying which kind of answer to give
  mmvet / mmvet_v2                   "First please perform reasoning, and think step by step to provide best
                                     answer to the following question: \\n\\n" + question
"""
from __future__ import annotations

from protege.bench.items import BenchItem

LETTER_DIRECTLY = "Answer with the option's letter from the given choices directly."
SHORT_ANSWER = "Answer the question using a single word or phrase."
MMVET_PRE = "First please perform reasoning, and think step by step to provide best answer to the following question: \n\n"


def _option_lines(options: dict[str, str], style: str = "{k}. {v}") -> str:
    return "\n".join(style.format(k=k, v=v) for k, v in options.items())


def _mentions_options(question: str, options: dict[str, str]) -> bool:
    return all(str(v).strip() and str(v).strip() in question for v in options.values())


def _with_hint(item: BenchItem, text: str) -> str:
    return f"{item.hint.strip()}\n{text}" if item.hint.strip() else text


def _multiple_choice(item: BenchItem) -> str:
    return _with_hint(item, f"{item.question.strip()}\n{_option_lines(item.options)}\n{LETTER_DIRECTLY}")


def _mmstar(item: BenchItem) -> str:
    question = item.question.strip()
    if item.options and not _mentions_options(question, item.options):
        question += "\nOptions: " + ", ".join(f"{k}: {v}" for k, v in item.options.items())
    return f"{question}\nAnswer with the option's letter from the given choices directly"


def _realworldqa(item: BenchItem) -> str:
    question = item.question.strip()
    if item.options and not _mentions_options(question, item.options):
        question += "\n" + _option_lines(item.options)
    return question


def _blink(item: BenchItem) -> str:
    letters = ", ".join(item.options) if item.options else "A, B, C, D"
    question = item.question.strip()
    if item.options and not _mentions_options(question, item.options):
        question += "\nSelect from the following choices.\n" + _option_lines(item.options, "({k}) {v}")
    return f"Note: You only need to respond with {letters} without providing any additional information.\n{question}"


def _mmbench(item: BenchItem, chinese: bool) -> str:
    intro, post = ("有如下几个选项：", "请直接使用所提供的选项字母作为答案回答。") if chinese else \
        ("There are several options:", LETTER_DIRECTLY)
    options = f"{intro}\n{_option_lines(item.options)}"
    hint = item.hint.strip()
    body = f"{hint} {item.question} {options}" if hint and hint.lower() != "nan" else f"{item.question} {options}"
    return f"{body}\n\n{post}"


def _mmmu(item: BenchItem, pro: bool) -> str:
    if item.options:
        post = "Answer with the option letter from the given choices directly." if pro else LETTER_DIRECTLY
        return f"{item.question}\n{_option_lines(item.options)}\n\n{post}"
    return f"{item.question}\n\n{SHORT_ANSWER}"


def _mathvista(item: BenchItem) -> str:
    meta = item.meta
    question = item.question.strip()
    if meta.get("unit"):
        question += f" (Unit: {meta['unit']})"
    choices = list(meta.get("choices") or item.options.values())
    lines = [question]
    if choices:
        lines.append("\n".join(f"{chr(ord('A') + i)}. {c}" for i, c in enumerate(choices)))
    qtype = meta.get("question_type") or ("multi_choice" if choices else "free_form")
    atype = meta.get("answer_type", "")
    precision = meta.get("precision")
    if qtype == "multi_choice":
        lines.append(LETTER_DIRECTLY)
    elif atype == "integer":
        lines.append("Answer the question using a single integer number.")
    elif atype == "float":
        places = {1: "one decimal place", 2: "two decimal places", 3: "three decimal places"}.get(
            int(float(precision)) if precision not in (None, "") else 0)
        lines.append(f"Answer the question using a single floating-point number with {places}."
                     if places else "Answer the question using a single floating-point number.")
    elif atype == "list":
        lines.append("Answer the question using a Python list.")
    return "\n".join(lines)


def _mmvet_v2_question(question: str) -> str:
    question = question.replace("<image>", "<IMG>x.png<IMG>")  # the readers' image slots, as file markers
    parts = []
    for part in question.split("<IMG>"):
        part = part.strip()
        parts.append("[<IMG_PLH>]" if part.lower().endswith((".jpg", ".png", ".jpeg")) else part)
    return "".join(parts)


def build_prompt(item: BenchItem) -> str:
    b = item.benchmark
    if b in ("ai2d", "seedbench", "seedbench2_plus"):
        return _multiple_choice(item)
    if b == "mmstar":
        return _mmstar(item)
    if b == "realworldqa":
        return _realworldqa(item)
    if b == "blink":
        return _blink(item)
    if b in ("mmbench", "mmbench_cn"):
        return _mmbench(item, chinese=b == "mmbench_cn")
    if b in ("mmmu", "mmmu_pro"):
        return _mmmu(item, pro=b == "mmmu_pro")
    if b == "chartqa":
        return f"{item.question}\n{SHORT_ANSWER}"
    if b == "mathvista":
        return _mathvista(item)
    if b == "mmvet":
        return MMVET_PRE + item.question
    if b == "mmvet_v2":
        return MMVET_PRE + _mmvet_v2_question(item.question)
    raise ValueError(f"no prompt for benchmark {b!r}")


__all__ = ["build_prompt"]
