"""lmms-eval 0.7.3's own scoring path for one task, run on in-memory documents.

A task is built by lmms-eval itself from its installed yaml (`load_yaml_config`, `ConfigurableTask`),
so its filter chain, metric list and `process_results` are the harness's; only the dataset download is
replaced by the documents a test gives. Responses then go where lmms-eval sends generated text:
`Task.apply_filters`, then `evaluator._process_document_results` with the command line's default
`--reasoning_tags`, which calls `Task.process_results` (it strips the text, then runs the task's rule).
A test that calls a task function directly skips those steps, which is how the stripping was missed.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path

import datasets

import lmms_eval
from lmms_eval.api.instance import Instance
from lmms_eval.api.reasoning import parse_reasoning_tags_config
from lmms_eval.api.task import ConfigurableTask
from lmms_eval.evaluator import _process_document_results
from lmms_eval.utils import load_yaml_config

TASKS = Path(lmms_eval.__file__).parent / "tasks"


@cache
def cli_reasoning_tags():
    """The default of `lmms-eval --reasoning_tags`, read from its own argument parser."""
    import sys
    from unittest import mock

    from lmms_eval.__main__ import parse_eval_args

    with mock.patch.object(sys, "argv", ["lmms-eval"]):
        _, args = parse_eval_args()
    return parse_reasoning_tags_config(cli_value=args.reasoning_tags)


class InMemoryTask(ConfigurableTask):
    def __init__(self, config: dict, docs: list[dict]):
        self._docs = docs
        super().__init__(config=config)

    def download(self, dataset_kwargs=None) -> None:
        split = datasets.Dataset.from_list(self._docs)
        self.dataset = datasets.DatasetDict({self.config.test_split: split})
        self.dataset_no_image = self.dataset


def task_config(yaml: str) -> dict:
    """The task's config as lmms-eval loads it (includes resolved, !function imported)."""
    return load_yaml_config(str(TASKS / yaml), mode="full")


def harness_results(yaml: str, docs: list[dict], responses: list[str], config: dict | None = None) -> list[dict]:
    """`process_results`' dict for each (document, raw response) after lmms-eval's whole chain."""
    task = InMemoryTask(config or task_config(yaml), docs)
    instances = []
    for doc_id, response in enumerate(responses):
        inst = Instance(request_type="generate_until", arguments=("", {}), idx=0,
                        metadata={"task": task.config.task, "doc_id": doc_id, "repeats": 1})
        inst.resps = [response]
        instances.append(inst)
    task._instances = instances
    task.apply_filters()
    tags = cli_reasoning_tags()
    out = []
    for filter_key in list(instances[0].filtered_resps):
        for doc_id, (doc, inst) in enumerate(zip(task.test_docs(), instances)):
            processed = _process_document_results((doc_id, doc, [inst]), task=task, filter_key=filter_key,
                                                  reasoning_tags=tags, log_samples=False)
            out.append(processed.metrics)
    return out


# --- our items as the harness's documents ----------------------------------------------------------

TASK_YAML = {
    "mmstar": "mmstar/mmstar.yaml", "realworldqa": "realworldqa/realworldqa.yaml", "ai2d": "ai2d/ai2d.yaml",
    "seedbench": "seedbench/seedbench.yaml", "seedbench2_plus": "seedbench_2_plus/seedbench_2_plus.yaml",
    "blink": "blink/blink_art_style.yaml", "mmmu": "mmmu/mmmu_val.yaml",
    "mmmu_pro": "mmmu_pro/mmmu_pro_standard.yaml", "chartqa": "chartqa/chartqa.yaml",
    "mathvista": "mathvista/mathvista_testmini_format.yaml", "mmvet": "mmvet/mmvet.yaml",
    "mmvet_v2": "mmvetv2/mmvetv2.yaml", "mmbench": "mmbench/mmbench_en_dev.yaml",
    "mmbench_cn": "mmbench/mmbench_cn_dev.yaml",
}
LETTERS = "ABCDEFGHIJ"


def _choices(item) -> list[str]:
    return [str(v) for v in item.options.values()]


def _mmbench_doc(item) -> dict:
    doc = {"index": int(item.index), "question": item.question, "answer": item.answer, "hint": item.hint or "nan",
           "source": "s", "split": "dev", "category": item.category or "c", "L2-category": item.l2_category or "l2"}
    return {**doc, **{c: item.options.get(c, "nan") for c in "ABCDE"}}


def _mathvista_doc(item) -> dict:
    m = item.meta
    return {"pid": item.index, "question": item.question, "query": m["query"], "question_type": m["question_type"],
            "answer_type": m["answer_type"], "choices": m["choices"], "precision": m["precision"], "unit": m["unit"],
            "answer": item.answer, "metadata": {"split": "testmini"}}


_DOCS = {
    "mmstar": lambda it: {"index": it.index, "question": it.question, "answer": it.answer,
                          "category": it.category or "c", "l2_category": it.l2_category or "l2"},
    "realworldqa": lambda it: {"question": it.question, "answer": it.answer},
    "ai2d": lambda it: {"question": it.question, "options": _choices(it),
                        "answer": str(LETTERS.index(it.answer.strip()))},
    "seedbench": lambda it: {"question": it.question, "answer": it.answer, "question_id": it.index,
                             "data_type": "image", **{f"choice_{c.lower()}": it.options.get(c, "") for c in "ABCD"}},
    "seedbench2_plus": lambda it: {"question": it.question, "answer": it.answer, "question_id": it.index,
                                   "question_image_type": "chart",
                                   **{f"choice_{c}": it.options.get(c, "") for c in "ABCD"}},
    "blink": lambda it: {"idx": it.index, "question": it.question, "prompt": it.question, "choices": _choices(it),
                         "answer": it.answer, "sub_task": "Art_Style", "hint": ""},
    "mmmu": lambda it: {"id": f"validation_Math_{it.index}", "question": it.question, "answer": it.answer,
                        "options": repr(_choices(it)),
                        "question_type": "multiple-choice" if it.options else "open"},
    "mmmu_pro": lambda it: {"id": f"test_Math_{it.index}", "question": it.question, "answer": it.answer,
                            "options": repr(_choices(it)), "subject": "Math"},
    "chartqa": lambda it: {"question": it.question, "answer": it.answer, "type": "human_test"},
    "mathvista": _mathvista_doc,
    "mmvet": lambda it: {"question_id": it.index, "question": it.question, "answer": it.answer, "capability": "rec"},
    "mmvet_v2": lambda it: {"id": it.index, "question_id": it.index, "question": it.question, "answer": it.answer,
                            "capability": "rec"},
    "mmbench": _mmbench_doc, "mmbench_cn": _mmbench_doc,
}


def lmms_doc(item) -> dict:
    return _DOCS[item.benchmark](item)


def benchmark_config(benchmark: str) -> dict:
    """The task config of a benchmark. Its !function entries come from freshly executed copies of the
    task's modules, so a test patches what they call through the function's own globals."""
    return task_config(TASK_YAML[benchmark])


def run_task(benchmark: str, items, responses: list[str], config: dict | None = None) -> list[dict]:
    """Our items and raw responses through lmms-eval's own task for the benchmark."""
    return harness_results(TASK_YAML[benchmark], [lmms_doc(it) for it in items], responses, config)
