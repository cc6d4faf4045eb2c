"""Stages of independent branches at once: which stage waits for which, and the slots that bound them."""
import threading
import time

from protege.pipeline import Slots, stage_upstream
from protege.stages import STAGES
from tests.conftest import REPO


def test_upstream_stages_come_from_dvc_yaml():
    up = stage_upstream(REPO, STAGES)
    assert up["world"] == []
    assert up["agent_rl"] == ["agent_sft"] and up["agent_sft"] == ["world"]
    assert up["tool_rl"] == ["tool_sft"]
    assert set(up["rl"]) >= {"sft", "curate", "teachers", "disc_pretrain"}
    assert set(up["evaluate"]) >= {"rl", "merge", "rl_baseline", "mini_benchmarks"}
    # the games never wait for the question chain, nor it for them
    question = {"sft", "curate", "teachers", "rollouts", "disc_pretrain", "rl", "rl_baseline", "merge"}
    assert not question & set(up["agent_rl"] + up["agent_sft"] + up["tool_rl"] + up["tool_sft"])
    # dvc.yaml's order is a topological order
    assert all(STAGES.index(u) < STAGES.index(s) for s in STAGES for u in up[s])


def test_slots_bound_concurrency_and_serve_the_earliest_stage_first():
    slots, inside = Slots(2), []
    lock = threading.Lock()
    gates = {p: threading.Event() for p in (10, 11, 9, 3, 7)}

    def stage(priority):
        with slots.slot(priority):
            with lock:
                inside.append(priority)
            gates[priority].wait(10)

    def wait_until(cond):
        deadline = time.monotonic() + 10
        while not cond():
            assert time.monotonic() < deadline
            time.sleep(0.01)

    threads = {p: threading.Thread(target=stage, args=(p,)) for p in gates}
    for p in (10, 11):
        threads[p].start()
    wait_until(lambda: len(inside) == 2)
    for p in (9, 3, 7):  # all three wait: both slots are taken
        threads[p].start()
    wait_until(lambda: len(slots.waiting) == 3)
    gates[10].set()  # one slot frees: the earliest waiting stage (3) gets it
    wait_until(lambda: len(inside) == 3)
    assert inside[2] == 3
    gates[11].set()
    wait_until(lambda: len(inside) == 4)
    time.sleep(0.2)  # 9 would be inside by now if a third stage could run
    assert inside[3] == 7 and 9 not in inside
    gates[3].set()
    wait_until(lambda: len(inside) == 5)
    for p in (7, 9):
        gates[p].set()
    for t in threads.values():
        t.join(10)
    assert inside[2:] == [3, 7, 9]
