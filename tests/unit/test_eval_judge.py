"""MM-Vet through `evaluate.judge`: an OpenAI-compatible grader (the loopback server) scores free-form
answers; an unparsable grade is asked once more, then scores 0 with a note."""
import re

import pytest

from protege.config import JudgeSpec, TeacherSpec
from protege.bench.items import BenchItem
from protege.eval.score import Prediction, score_benchmark
from protege.eval.judging import JudgeCompleter, JudgeTally, check_tally, min_prompts_for_share
from protege.eval.report import markdown, new_report
from protege.eval.scorers.mmvet import EMPTY_NOTE
from protege.eval.suite import completer_for
from protege.loopback_server import ServerBehaviour, serve_in_thread


def grade(prompt: str) -> str:
    """A stand-in grader: the prompt's last line is the row to grade (question | truth | prediction |)."""
    prediction = prompt.strip().splitlines()[-1].split("|")[2]
    if "ramble" in prediction:
        return "Let me think about this carefully."
    return "1.0" if re.search(r"\bred\b", prediction) and re.search(r"\b3\b", prediction) else "0.0"


@pytest.mark.parametrize("protocol, requests, prompt_start", [
    # four grades; the rambling one asked at temperatures 0, 0.5, 1, 1.5, each followed by the ask whose reply
    # lmms-eval drops: 3 + 8 asks; lmms-eval's own prompt
    ("lmms-eval", 11, "Compare the ground truth"),
    ("lenient", 5, "Grade how correct"),            # four grades + one retry; protege's prompt
])
def test_mmvet_scored_by_an_llm_grader(tmp_path, protocol, requests, prompt_start):
    pytest.importorskip("lmms_eval")
    items = [BenchItem("mmvet", f"v1_{i}", "What colour are the shapes, and how many?", [], "red <AND> 3",
                       category="rec,math") for i in range(4)]
    preds = {"v1_0": "There are 3 red shapes.", "v1_1": "Two blue ones.", "v1_2": "ramble",
             "v1_3": "3 red circles"}
    seen: list[str] = []
    behaviour = ServerBehaviour(reply=lambda prompt: seen.append(prompt) or grade(prompt))
    with serve_in_thread(behaviour) as url:
        spec = TeacherSpec(name="grader", backend="openai", model="grader", base_url=url, max_retries=0,
                           temperature=0.0)
        complete = completer_for(spec, tmp_path, seed=0)
        summary, rows, _ = score_benchmark("mmvet", items, {k: Prediction(k, v) for k, v in preds.items()},
                                           protocol=protocol, complete=complete, n_boot=200)
    assert [r["score"] for r in rows] == [1.0, 0.0, 0.0, 1.0]
    assert summary["score"] == pytest.approx(50.0)
    assert rows[2]["note"] and "rule judge" not in rows[2]["note"]  # the rambling grade: retried, then 0
    assert behaviour.counts["requests"] == requests
    assert summary["protocol"].startswith(protocol)
    assert seen and all(p.startswith(prompt_start) for p in seen)


def test_mmvet_without_a_judge_says_it_is_not_comparable():
    items = [BenchItem("mmvet", "v1_0", "What colour?", [], "red")]
    _, rows, _ = score_benchmark("mmvet", items, {"v1_0": Prediction("v1_0", "red")}, n_boot=100)
    assert rows[0]["score"] == 1.0 and "not comparable" in rows[0]["note"]


# --- the judge's reply as OpenAI-compatible servers send it --------------------------------------------

from protege.errors import UserFacingError  # noqa: E402
from protege import loopback_server  # noqa: E402
from protege.teachers.openai_backend import EmptyReply, reply_text  # noqa: E402


def body(message=None, **choice) -> dict:
    return {"choices": [{"index": 0, **({"message": message} if message is not None else {}), **choice}]}


@pytest.mark.parametrize("reply, text", [
    (body({"role": "assistant", "content": "D"}), "D"),
    (body({"role": "assistant", "content": [{"type": "text", "text": "D"}]}), "D"),
    (body({"content": [{"type": "text", "text": "1"}, {"type": "text", "text": "3"}]}), "13"),
    (body({"content": [{"type": "output_text", "text": "D", "annotations": []}]}), "D"),
    (body({"content": [{"type": "text", "text": {"value": "D"}}]}), "D"),
    (body({"content": [{"type": "image_url", "image_url": {"url": "x"}}, "D"]}), "D"),
    (body({"content": "D", "reasoning_content": "The last choice is D."}), "D"),
    (body({"role": "assistant", "content": None}, text="D"), "D"),                # legacy completions shape
    (body(text="13", finish_reason="stop"), "13"),
    (body(delta={"content": "D"}), "D"),
])
def test_reply_text_reads_the_shapes_servers_send(reply, text):
    assert reply_text(reply) == text


@pytest.mark.parametrize("reply, said", [
    (body({"content": None, "reasoning_content": "Let me think. The ans"}, finish_reason="length"),
     ["choices[0].message.content is null", "finish_reason 'length'", "reasoning_content", "raise max_tokens"]),
    (body({"content": "  \n"}, finish_reason="stop"), ["choices[0].message.content is blank"]),
    (body({"content": [{"type": "image_url", "image_url": {"url": "x"}}]}), ["a list with no text parts"]),
    (body({"content": None, "refusal": "I can't help with that."}), ["is null", "refused"]),
    (body({"content": None, "reasoning": "hmm"}, finish_reason="stop"), ["only choices[0].message.reasoning"]),
])
def test_an_empty_reply_is_an_error_naming_the_field(reply, said):
    with pytest.raises(EmptyReply) as err:
        reply_text(reply)
    assert all(s in str(err.value) for s in said), str(err.value)


@pytest.mark.parametrize("reply", [{}, {"choices": []}, {"choices": "D"}, [], {"error": {"message": "bad"}}])
def test_a_body_without_choices_is_malformed(reply):
    with pytest.raises(ValueError, match="no choices"):
        reply_text(reply)


def shaped_judge(shape):
    """An app answering MathVista extraction prompts with one reply shape: "13" for the float question,
    "D" otherwise (the issue's replies)."""
    from aiohttp import web

    def make_app(behaviour):
        async def chat(request):
            behaviour.counts["requests"] += 1
            prompt = (await request.json())["messages"][-1]["content"][-1]["text"]
            return web.json_response(shape("13" if "About thirteen" in prompt else "D"))

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app

    return make_app


SHAPES = {
    "string": lambda t: body({"role": "assistant", "content": t}, finish_reason="stop"),
    "parts": lambda t: body({"role": "assistant", "content": [{"type": "text", "text": t}]}, finish_reason="stop"),
    "reasoning server": lambda t: body({"role": "assistant", "content": t, "reasoning_content": "..."}),
    "legacy text": lambda t: body(text=t, finish_reason="stop"),
}


def mathvista_items():
    choices = ["3 cm", "5 cm", "7 cm", "9 cm"]
    query = "Question: Which is longest?\nChoices:\n" + "\n".join(f"({chr(65 + i)}) {c}" for i, c in enumerate(choices))
    return [BenchItem("mathvista", "1", "Which is longest?", [], "9 cm",
                      meta={"question_type": "multi_choice", "answer_type": "text", "precision": None,
                            "choices": choices, "unit": "", "query": query}),
            BenchItem("mathvista", "2", "How long?", [], "13.0",
                      meta={"question_type": "free_form", "answer_type": "float", "precision": 1.0,
                            "choices": None, "unit": "", "query": "Question: How long?"})]


@pytest.mark.parametrize("shape", list(SHAPES))
def test_mathvista_uses_the_judges_extraction_whatever_its_reply_shape(tmp_path, monkeypatch, shape):
    pytest.importorskip("lmms_eval")
    monkeypatch.setattr(loopback_server, "make_app", shaped_judge(SHAPES[shape]))
    behaviour = ServerBehaviour()
    with serve_in_thread(behaviour) as url:
        spec = TeacherSpec(name="judge", backend="openai", model="judge", base_url=url, max_retries=0)
        complete = completer_for(spec, tmp_path, seed=0)
        items = mathvista_items()
        _, rows, _ = score_benchmark("mathvista", items, {"1": Prediction("1", "The last one."),
                                                         "2": Prediction("2", "About thirteen.")}, n_boot=10,
                                     complete=complete)
    assert [(r["score"], r["extracted"], r["note"]) for r in rows] == [(1.0, "9 cm", "llm extraction"),
                                                                       (1.0, "13.0", "llm extraction")]
    assert behaviour.counts["requests"] == 2


def test_a_judge_cut_off_by_its_token_limit_on_every_prompt_stops_scoring_and_names_the_field(tmp_path,
                                                                                               monkeypatch):
    """No usable reply at all, and not only blank ones: a misconfigured judge stops the run in one line."""
    pytest.importorskip("lmms_eval")
    empty = lambda t: body({"role": "assistant", "content": None, "reasoning_content": "Let me see"},  # noqa: E731
                           finish_reason="length")
    monkeypatch.setattr(loopback_server, "make_app", shaped_judge(empty))
    with serve_in_thread(ServerBehaviour()) as url:
        spec = TeacherSpec(name="judge", backend="openai", model="judge", base_url=url, max_retries=0)
        with pytest.raises(UserFacingError) as err:
            score_benchmark("mathvista", mathvista_items(), {"1": Prediction("1", "The last one."),
                                                             "2": Prediction("2", "About thirteen.")},
                            n_boot=10, complete=completer_for(spec, tmp_path, seed=0))
    message = str(err.value)
    assert "evaluate.judge 'judge'" in message and "2 of 2 prompts" in message and "\n" not in message
    assert "choices[0].message.content is null" in message and "raise max_tokens" in message


def test_an_unreachable_judge_stops_scoring_in_one_line(tmp_path):
    behaviour = ServerBehaviour(fail_after=0, status_on_failure=401)
    items = [BenchItem("mmvet", f"v{i}", "What colour?", [], "red") for i in range(3)]
    with serve_in_thread(behaviour) as url:
        spec = JudgeSpec(name="judge", backend="openai", model="judge", base_url=url, max_retries=0)
        with pytest.raises(UserFacingError, match=r"no usable reply to 3 of 3 prompts \(mmvet\): HTTP 401"):
            score_benchmark("mmvet", items, {it.index: Prediction(it.index, f"red {it.index}") for it in items}, n_boot=10,
                            complete=completer_for(spec, tmp_path, seed=0))


def blank_for(marker: str, grade: str = "1.0"):
    """A grader that answers blank content for the rows holding `marker`, `grade` otherwise."""
    return lambda prompt: "" if marker in prompt.strip().splitlines()[-1] else grade


def test_one_blank_judge_reply_is_scored_as_lmms_eval_scores_it(tmp_path):
    """MM-Vet: lmms-eval's get_chat_response asks three times, gets '', and the item scores 0; the others go on,
    and the report counts the blank reply."""
    pytest.importorskip("lmms_eval")
    items = [BenchItem("mmvet", f"v{i}", f"What colour? ({i})", [], "red") for i in range(4)]
    preds = {"v0": "red", "v1": "It is red (blank)", "v2": "red", "v3": "red"}
    behaviour = ServerBehaviour(reply=blank_for("(blank)"))
    with serve_in_thread(behaviour) as url:
        spec = JudgeSpec(name="judge", backend="openai", model="judge", base_url=url, max_retries=0)
        summary, rows, _ = score_benchmark("mmvet", items, {k: Prediction(k, v) for k, v in preds.items()},
                                           n_boot=10, complete=completer_for(spec, tmp_path, seed=0))
    assert [r["score"] for r in rows] == [1.0, 0.0, 1.0, 1.0]
    assert rows[1]["note"] == EMPTY_NOTE
    assert behaviour.counts["requests"] == 3 + 3                 # the blank one asked three times
    assert summary["judge"]["prompts"] == 4 and summary["judge"]["unusable"] == summary["judge"]["empty"] == 1
    assert JudgeTally(**summary["judge"]).line() == "1 of 4 judge replies were empty"
    # the evaluation report's scoring notes carry the count
    from protege.config import EvaluateConfig

    report = new_report(EvaluateConfig(), {"mmvet": tmp_path / "mmvet.json"}, "m")
    report["score"] = 75.0
    report["models"]["m"] = {"benchmarks": {"mmvet": summary}, "average": 75.0, "average_ci": [0, 100],
                             "mean_tokens": 1.0, "mean_latency_s": 0.0, "seconds_per_answer": 0.0}
    assert "- mmvet (m): 1 of 4 judge replies were empty" in markdown(report)


def test_one_blank_extraction_is_scored_as_lmms_eval_scores_it(tmp_path, monkeypatch):
    """MathVista: the blank extraction is '' after get_chat_response's patience, then the usual fallback
    (multi_choice: the choice nearest to '', here "3 cm"); the float question is extracted as usual."""
    pytest.importorskip("lmms_eval")
    shapes = {"D": body({"role": "assistant", "content": ""}, finish_reason="stop"),
              "13": body({"role": "assistant", "content": "13"}, finish_reason="stop")}
    monkeypatch.setattr(loopback_server, "make_app", shaped_judge(lambda t: shapes[t]))
    behaviour = ServerBehaviour()
    with serve_in_thread(behaviour) as url:
        spec = JudgeSpec(name="judge", backend="openai", model="judge", base_url=url, max_retries=0)
        summary, rows, _ = score_benchmark("mathvista", mathvista_items(),
                                           {"1": Prediction("1", "The last one."),
                                            "2": Prediction("2", "About thirteen.")},
                                           n_boot=10, complete=completer_for(spec, tmp_path, seed=0))
    assert [(r["score"], r["extracted"], r["note"]) for r in rows] == [(0.0, "3 cm", "llm: empty reply"),
                                                                       (1.0, "13.0", "llm extraction")]
    assert behaviour.counts["requests"] == 5 + 1
    assert summary["judge"]["unusable"] == 1


@pytest.mark.parametrize("blank, fails", [(1, False), (2, True)])
def test_more_unusable_replies_than_max_unusable_stop_the_run(tmp_path, blank, fails):
    """20 prompts at 5%: one blank reply is within the share, two are not."""
    pytest.importorskip("lmms_eval")
    items = [BenchItem("mmvet", f"v{i}", f"What colour? ({i})", [], "red") for i in range(20)]
    preds = {it.index: ("red (blank)" if i < blank else "red") for i, it in enumerate(items)}
    with serve_in_thread(ServerBehaviour(reply=blank_for("(blank)"))) as url:
        spec = JudgeSpec(name="judge", backend="openai", model="judge", base_url=url, max_retries=0)
        run = lambda: score_benchmark("mmvet", items, {k: Prediction(k, v) for k, v in preds.items()},  # noqa: E731
                                      n_boot=10, complete=completer_for(spec, tmp_path, seed=0))
        if fails:
            with pytest.raises(UserFacingError, match=r"2 of 20 judge replies were empty on mmvet \(10.0%, more "
                                                      r"than evaluate.judge.max_unusable 5%\)"):
                run()
        else:
            assert run()[0]["judge"]["unusable"] == 1


def test_the_tally_is_per_benchmark_and_the_share_needs_enough_prompts():
    assert min_prompts_for_share(0.05) == 20 and min_prompts_for_share(0.1) == 10 and min_prompts_for_share(0) == 1
    check_tally(JudgeTally(3, 3, 3, {"empty reply": 3}), "j", 0.05, "b")          # three blanks, too few to judge
    with pytest.raises(UserFacingError, match="1 of 1 judge replies were empty"):
        check_tally(JudgeTally(1, 1, 1, {"empty reply": 1}), "j", 0.0, "b")        # max_unusable 0: none allowed
    with pytest.raises(UserFacingError, match="no usable reply to 1 of 1"):
        check_tally(JudgeTally(1, 1, 0, {"HTTP 500": 1}), "j", 0.05, "b")
    calls = iter([({0: "0.5"}, {1: ("empty", "empty reply")}), ({0: "0.5"}, {})])
    judge = JudgeCompleter(lambda prompts: next(calls), "j", 0.05)
    assert judge(["p", "q"]) == ["0.5", ""]
    assert judge.take_tally() == JudgeTally(2, 1, 1, {"empty reply": 1})
    assert judge(["p"]) == ["0.5"] and judge.take_tally() == JudgeTally(1, 0, 0, {})


def test_max_unusable_is_a_judge_setting():
    from protege.config import EvaluateConfig

    ev = EvaluateConfig(judge={"name": "g", "backend": "openai", "model": "m", "base_url": "http://h/v1",
                               "max_unusable": 0.2})
    assert ev.judge.max_unusable == 0.2
    with pytest.raises(ValueError):
        EvaluateConfig(judge={"name": "g", "backend": "openai", "model": "m", "base_url": "http://h/v1",
                              "max_unusable": 1.5})
