"""LLM judge over an OpenAI-compatible server: strict verdicts, one retry, cached verdicts."""
import re

from protege.rewards.llm_judge import LLMJudge, parse_verdict
from protege.teachers.backends import SamplingParams
from protege.loopback_server import ServerBehaviour, serve_in_thread
from protege.teachers.openai_backend import OpenAITeacher


def test_parse_verdict_is_strict():
    assert parse_verdict("Yes") == 1.0 and parse_verdict(" no. ") == 0.0
    assert parse_verdict("yes, because") is None and parse_verdict("") is None and parse_verdict("maybe") is None


def grader(prompt: str) -> str:
    """A stand-in model: compares the ground truth with the response's last number; rambles when told once."""
    if "Reply with exactly one word" not in prompt and "ramble" in prompt:
        return "Well, let me think about it..."
    truth = re.search(r"Ground-truth answer: (\S+)", prompt).group(1)
    resp = re.search(r"<<<RESPONSE\n(.*)\nRESPONSE>>>", prompt, re.S).group(1)
    nums = re.findall(r"\d+", resp)
    return "yes" if nums and nums[-1] == truth else "no"


def test_llm_judge_verdicts_retry_and_cache(tmp_path):
    behaviour = ServerBehaviour(reply=grader)
    with serve_in_thread(behaviour) as url:
        backend = OpenAITeacher("judge", url, "grader", SamplingParams(temperature=0.0, max_tokens=2), api_key_env=None)
        judge = LLMJudge(backend, tmp_path / "verdicts.jsonl")
        out = judge(["How many?"] * 3, ["3", "3", "4"], ["It is 3.", "ramble: 3", "two"])
        assert out == [1.0, 1.0, 0.0]
        asked = behaviour.counts["requests"]
        assert asked == 4  # three prompts + one retry of the rambling verdict
        again = LLMJudge(backend, tmp_path / "verdicts.jsonl")(["How many?"], ["3"], ["It is 3."])
        assert again == [1.0] and behaviour.counts["requests"] == asked  # from the cache, no request


def test_unparsable_twice_counts_as_no():
    with serve_in_thread(ServerBehaviour(reply=lambda p: "I cannot say.")) as url:
        judge = LLMJudge(OpenAITeacher("judge", url, "m", api_key_env=None))
        assert judge(["Q"], ["1"], ["1"]) == [0.0] and judge.unparsable == 1
