"""Benchmark-protocol scorers: `scorer_for(benchmark, protocol)` -> a `Scorer`.

Protocols:
* "lmms-eval" (default): lmms-eval 0.7.3's scoring rule for the task, item by item, held there by
  tests/differential, on the response as the harness hands it to the task (`lmms_pipeline`: filter
  chain, reasoning blocks dropped, stripped). Where lmms-eval asks GPT (MMBench matching, MathVista
  extraction, the MM-Vet grader) the configured judge gets lmms-eval's own prompt, read from the
  installed harness (`harness_prompts`); without a judge, what lmms-eval does when its GPT cannot be
  reached (MMBench: a random letter, scored 0; MathVista: an empty extraction), except MM-Vet, which
  falls back to a documented rule grader.
* "lenient": our generous reading (letters in more positions, option texts, number words, thousands
  separators), for knowing what the model knew rather than comparing with papers.
* "vlmevalkit": VLMEvalKit's multiple-choice matching (`vlmevalkit_match.can_infer`, at the commit
  named there), exact matching and CircularEval; multiple-choice benchmarks only (a suite-wide setting
  scores the open benchmarks by their lmms-eval rule, see `suite_protocol`).
No scorer draws random numbers: where a harness guesses a letter, we score 0 and say so in the note.
"""
from __future__ import annotations

from collections.abc import Callable

from protege.bench.items import BENCHMARKS
from protege.eval.scorers.base import Completer, Scorer
from protege.eval.scorers.chartqa import ChartQAScorer
from protege.eval.scorers.lmms_choice import (
    LmmsAI2DScorer,
    LmmsBlinkScorer,
    LmmsChartQAScorer,
    LmmsMMMUScorer,
    LmmsMMStarScorer,
    LmmsRealWorldQAScorer,
    LmmsSeedBenchScorer,
)
from protege.eval.scorers.circular import CircularScorer
from protege.eval.scorers.lmms_mathvista import LmmsMathVistaScorer
from protege.eval.scorers.mathvista import MathVistaScorer
from protege.eval.scorers.mmmu import MMMUProScorer, MMMUScorer
from protege.eval.scorers.mmvet import MMVetScorer
from protege.eval.scorers.multiple_choice import (
    AI2DScorer,
    BlinkScorer,
    MMStarScorer,
    RealWorldQAScorer,
    SeedBench2PlusScorer,
    SeedBenchScorer,
    VLMEvalKitChoiceScorer,
)

PROTOCOLS = ("lmms-eval", "lenient", "vlmevalkit")

_LENIENT: dict[str, Callable[[], Scorer]] = {
    "ai2d": lambda: AI2DScorer("ai2d", "lmms-eval: ai2d exact match of the option letter"),
    "mmstar": lambda: MMStarScorer("mmstar", "lmms-eval: mmstar exact_match on the option letter, "
                                             "macro over L2 categories"),
    "realworldqa": lambda: RealWorldQAScorer("realworldqa", "lmms-eval: realworldqa letter or normalised "
                                                            "exact match (number words to digits)"),
    "blink": lambda: BlinkScorer("blink", "lmms-eval: blink leading option letter vs '(X)' gold"),
    "seedbench": lambda: SeedBenchScorer("seedbench", "lmms-eval: seedbench option letter"),
    "seedbench2_plus": lambda: SeedBench2PlusScorer("seedbench2_plus", "lmms-eval: seedbench_2_plus "
                                                                       "option letter"),
    "mmmu": lambda: MMMUScorer("mmmu"),
    "mmmu_pro": lambda: MMMUProScorer("mmmu_pro"),
    "mmbench": lambda: CircularScorer("mmbench", "lenient"),
    "mmbench_cn": lambda: CircularScorer("mmbench_cn", "lenient"),
    "chartqa": lambda: ChartQAScorer("chartqa"),
    "mathvista": lambda: MathVistaScorer("mathvista"),
    "mmvet": lambda: MMVetScorer("mmvet", protocol="lenient"),
    "mmvet_v2": lambda: MMVetScorer("mmvet_v2", protocol="lenient"),
}
MULTIPLE_CHOICE = ("ai2d", "mmstar", "realworldqa", "blink", "seedbench", "seedbench2_plus", "mmmu",
                    "mmmu_pro", "mmbench", "mmbench_cn")
assert set(_LENIENT) == set(BENCHMARKS)
_LMMS_EVAL: dict[str, Callable[[], Scorer]] = {
    **_LENIENT, "mmstar": LmmsMMStarScorer, "realworldqa": LmmsRealWorldQAScorer, "ai2d": LmmsAI2DScorer,
    "blink": LmmsBlinkScorer, "seedbench": lambda: LmmsSeedBenchScorer("seedbench"),
    "seedbench2_plus": lambda: LmmsSeedBenchScorer("seedbench2_plus"),
    "mmmu": LmmsMMMUScorer, "mmmu_pro": lambda: LmmsMMMUScorer("mmmu_pro"), "chartqa": LmmsChartQAScorer,
    "mathvista": LmmsMathVistaScorer, "mmvet": MMVetScorer, "mmvet_v2": lambda: MMVetScorer("mmvet_v2"),
    "mmbench": lambda: CircularScorer("mmbench", "lmms-eval"),
    "mmbench_cn": lambda: CircularScorer("mmbench_cn", "lmms-eval")}


def scorer_for(benchmark: str, protocol: str = "lmms-eval", grader_prompt: str | None = None) -> Scorer:
    """`grader_prompt`: MM-Vet / MM-Vet v2 only, the few-shot prefix of the grader (default: ours)."""
    if benchmark in ("mmvet", "mmvet_v2") and grader_prompt and protocol in ("lmms-eval", "lenient"):
        return MMVetScorer(benchmark, grader_prompt, protocol)
    if benchmark not in _LMMS_EVAL:
        raise ValueError(f"unknown benchmark {benchmark!r}; known: {', '.join(BENCHMARKS)}")
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown scoring protocol {protocol!r}; known: {', '.join(PROTOCOLS)}")
    if protocol == "lmms-eval":
        return _LMMS_EVAL[benchmark]()
    if protocol == "lenient":
        scorer = _LENIENT[benchmark]()
        scorer.protocol = f"lenient: {scorer.protocol.split(': ', 1)[-1]}"
        return scorer
    if benchmark not in MULTIPLE_CHOICE:
        raise ValueError(f"protocol 'vlmevalkit' covers multiple-choice benchmarks only "
                         f"({', '.join(MULTIPLE_CHOICE)}); {benchmark!r} is scored by 'lmms-eval'")
    if benchmark in ("mmbench", "mmbench_cn"):
        return CircularScorer(benchmark, "vlmevalkit")
    return VLMEvalKitChoiceScorer(benchmark, _LENIENT[benchmark]())


def suite_protocol(benchmark: str, protocol: str) -> str:
    """The protocol a suite-wide setting means for one benchmark: `vlmevalkit` changes multiple-choice
    matching only, so the other benchmarks keep their lmms-eval scorer."""
    return "lmms-eval" if protocol == "vlmevalkit" and benchmark not in MULTIPLE_CHOICE else protocol


__all__ = ["MULTIPLE_CHOICE", "PROTOCOLS", "Completer", "Scorer", "scorer_for", "suite_protocol"]
