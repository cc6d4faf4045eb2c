"""flows/stage_node.py: what a pod past the first of a several-node stage runs, from its flow run's parameters
(the Prefect client's read stands in for a server here)."""
import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import prefect.client.orchestration
import pytest
from prefect.client.schemas.objects import FlowRun
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect.states import Completed, Failed, Running

from flows import stage_node
from protege.tracking import PARENT_ENV
from tests.conftest import REPO

RUN_ID = uuid.UUID("6f1c2a4e-0000-4000-8000-000000000001")


@pytest.fixture
def flow_run(monkeypatch):
    """The flow run the client reads: set its parameters and state (or an exception) on the returned dict."""
    served: dict = {"parameters": {}, "state": Running()}

    class Client:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read_flow_run(self, run_id):
            assert run_id == RUN_ID
            if "error" in served:
                raise served["error"]
            return FlowRun(id=run_id, flow_id=uuid.uuid4(), name="rl", parameters=served["parameters"],
                           state=served["state"])

    def get_client(httpx_settings=None, sync_client=False):
        assert sync_client
        return Client()

    monkeypatch.setattr(prefect.client.orchestration, "get_client", get_client)
    monkeypatch.setenv(stage_node.FLOW_RUN_ENV, str(RUN_ID))
    monkeypatch.delenv("PROTEGE_RDZV_ENDPOINT", raising=False)
    with temporary_settings(updates={PREFECT_API_URL: "http://prefect.test/api"}):
        yield served


@pytest.fixture
def started(monkeypatch):
    """What main() would run, instead of running it."""
    calls = []

    def run(argv, cwd, env):
        calls.append((argv, cwd, env))
        return 3

    monkeypatch.setattr(stage_node, "run", run)
    return calls


def test_the_node_runs_the_flow_runs_stage_in_its_project_folder(flow_run, started, tmp_path):
    flow_run["parameters"] = {"project_dir": str(tmp_path), "stage": "agent_rl", "parent_run_id": "mlflow-parent"}
    assert stage_node.main() == 3  # the stage's exit code
    [(argv, cwd, env)] = started
    assert argv == [sys.executable, "-m", "protege", "stage", "agent_rl", "--params", "params.yaml"]
    assert cwd == tmp_path.resolve()
    # the environment the flow run gives its stage on pod 0
    assert env[PARENT_ENV] == "mlflow-parent" and env["PATH"].startswith(str(Path(sys.executable).parent))


@pytest.fixture
def rendezvous():
    """A listening port, as node 0's rendezvous store is once its stage has started."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        yield f"127.0.0.1:{listening.getsockname()[1]}"


def closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_the_node_starts_its_stage_once_node_0s_rendezvous_listens(flow_run, started, rendezvous, monkeypatch):
    flow_run["parameters"] = {"project_dir": "/workspace/protege", "stage": "rl"}
    monkeypatch.setenv("PROTEGE_RDZV_ENDPOINT", rendezvous)
    assert stage_node.main() == 3 and len(started) == 1


def test_a_flow_run_that_ends_before_the_rendezvous_opens_leaves_the_node_nothing_to_do(flow_run, started,
                                                                                       monkeypatch, capsys):
    """Pod 0's `dvc repro` found the stage up to date (or failed before it): no store will ever listen."""
    flow_run["parameters"] = {"project_dir": "/workspace/protege", "stage": "rl"}
    monkeypatch.setenv("PROTEGE_RDZV_ENDPOINT", closed_port())
    flow_run["state"] = Completed()
    assert stage_node.main() == 0 and not started
    assert "ended Completed before node 0 opened the rendezvous" in capsys.readouterr().out
    flow_run["state"] = Failed()
    assert stage_node.main() == 1 and not started


def test_the_node_waits_while_the_flow_run_runs(flow_run, monkeypatch):
    calls = []

    def read(run_id):  # running twice, then done
        calls.append(run_id)
        return FlowRun(id=run_id, flow_id=uuid.uuid4(), state=Running() if len(calls) < 3 else Completed())

    monkeypatch.setattr(stage_node, "read_flow_run", read)
    assert stage_node.wait_for_rendezvous(closed_port(), RUN_ID, poll_s=0.01).is_completed() and len(calls) == 3


def test_a_stage_of_one_node_leaves_the_other_pods_nothing_to_do(flow_run, started, capsys):
    """evaluate on a several-pod job (a deployment whose nodes is above 1): pod 0 runs it, once."""
    flow_run["parameters"] = {"project_dir": "/workspace/protege", "stage": "evaluate"}
    assert stage_node.main() == 0 and not started
    assert "stage 'evaluate' runs on one node" in capsys.readouterr().out


def test_without_a_flow_run_id_the_node_says_where_it_belongs(monkeypatch, started, capsys):
    monkeypatch.delenv(stage_node.FLOW_RUN_ENV, raising=False)
    assert stage_node.main() == 2 and not started
    assert "PREFECT__FLOW_RUN_ID is not set" in capsys.readouterr().err
    monkeypatch.setenv(stage_node.FLOW_RUN_ENV, "rl-x7k2p")
    assert stage_node.main() == 2 and "'rl-x7k2p', not a flow run id" in capsys.readouterr().err


def test_a_flow_run_without_a_stage_is_refused(flow_run, started, capsys):
    flow_run["parameters"] = {"project_dir": "/workspace/protege", "stages": ["rl"]}
    assert stage_node.main() == 2 and not started
    err = capsys.readouterr().err
    assert f"flow run {RUN_ID} has no 'stage' parameter (it has ['project_dir', 'stages'])" in err
    flow_run["parameters"] = {"stage": "rl"}
    assert stage_node.main() == 2 and "no 'project_dir' parameter" in capsys.readouterr().err


def test_an_unknown_flow_run_or_no_api_is_said_plainly(flow_run, started, capsys):
    flow_run["error"] = ObjectNotFound(http_exc=Exception("404"))
    assert stage_node.main() == 2 and f"flow run {RUN_ID} is not known to the Prefect API at http://prefect.test/api" \
        in capsys.readouterr().err
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        assert stage_node.main() == 2 and "PREFECT_API_URL is not set" in capsys.readouterr().err
    assert not started


def test_the_node_exits_with_the_stages_code(tmp_path):
    assert stage_node.run([sys.executable, "-c", "raise SystemExit(7)"], tmp_path, os.environ) == 7
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert stage_node.run([sys.executable, "-c", killed], tmp_path, os.environ) == 128 + signal.SIGTERM


def test_the_module_runs_as_the_pods_command():
    """`python -m flows.stage_node` from the project folder (the pods' working directory)."""
    env = {k: v for k, v in os.environ.items() if k != stage_node.FLOW_RUN_ENV}
    done = subprocess.run([sys.executable, "-m", "flows.stage_node"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "flows.stage_node: PREFECT__FLOW_RUN_ID is not set" in done.stderr
