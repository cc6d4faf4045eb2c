"""One node, past the first, of a training stage that spans several (the gpu pool's Kubernetes Job with
`nodes` > 1, deploy/k8s/).

Each pod of that Job is a node. Pod 0 runs the protege-stage flow run (flows/stage.py: `dvc repro` of the
stage, whose `protege stage NAME` hosts the rendezvous and writes the outputs); every other pod runs
`python -m flows.stage_node`: it reads the flow run's parameters from Prefect's API (the worker gives every pod
PREFECT__FLOW_RUN_ID) and runs `protege stage NAME` in the same project folder, so this node's ranks join the
rendezvous (PROTEGE_NODES, PROTEGE_NODE_RANK and PROTEGE_RDZV_ENDPOINT come from the pod). It exits with the
stage's code.

It starts the stage once pod 0's rendezvous accepts connections: pod 0 gets there only after the flow run's
start and DVC's checks, and the agents here give up on a store that is not there within a minute. A flow run
that ends first (its stage up to date, or failed), or a stage that runs on one node (evaluate, rollouts: not
a training stage), leaves this pod nothing to do: it exits at once."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from uuid import UUID

FLOW_RUN_ENV = "PREFECT__FLOW_RUN_ID"


class NodeError(RuntimeError):
    """This pod cannot tell which stage to run."""


def flow_run_id(environ: Mapping[str, str]) -> UUID:
    value = environ.get(FLOW_RUN_ENV, "").strip()
    if not value:
        raise NodeError(f"{FLOW_RUN_ENV} is not set: this runs in the pods past the first of a protege-stage "
                        f"flow run's Kubernetes job, where the worker sets it to the flow run's id")
    try:
        return UUID(value)
    except ValueError:
        raise NodeError(f"{FLOW_RUN_ENV} is {value!r}, not a flow run id") from None


def read_flow_run(run_id: UUID):
    """The flow run, from the Prefect API the worker pointed this pod at (PREFECT_API_URL)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL

    api = PREFECT_API_URL.value()
    if not api:  # without it the client would start a server of its own, which knows no flow run
        raise NodeError("PREFECT_API_URL is not set: the node reads its flow run from the Prefect server")
    with get_client(sync_client=True) as client:
        try:
            return client.read_flow_run(run_id)
        except ObjectNotFound:
            raise NodeError(f"flow run {run_id} is not known to the Prefect API at {api}") from None


def wait_for_rendezvous(endpoint: str, run_id: UUID, poll_s: float = 5.0):
    """Waits until `endpoint` (HOST:PORT, node 0's rendezvous) accepts a connection; returns None then, or the
    flow run's final state if the run ended first. An endpoint that is no HOST:PORT is not waited for (the
    stage says what is wrong with it)."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit():
        return None
    said = None
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=5):
                return None
        except OSError:
            pass
        state = read_flow_run(run_id).state
        if state is not None and state.is_final():
            return state
        if said is None or time.monotonic() - said > 60:
            print(f"waiting for node 0's rendezvous at {endpoint} (flow run {run_id}: "
                  f"{state.name if state else 'no state'})", flush=True)
            said = time.monotonic()
        time.sleep(poll_s)


def stage_command(parameters: Mapping, run_id: UUID | str) -> tuple[list[str], Path]:
    """The command this node runs, and the folder it runs in: the flow run's stage in its project folder."""
    stage, project_dir = parameters.get("stage"), parameters.get("project_dir")
    if not isinstance(stage, str) or not stage:
        raise NodeError(f"flow run {run_id} has no 'stage' parameter (it has {sorted(parameters) or 'none'}); "
                        f"flows.stage_node runs the other nodes of a protege-stage flow run")
    if not isinstance(project_dir, str) or not project_dir:
        raise NodeError(f"flow run {run_id} has no 'project_dir' parameter (it has {sorted(parameters)})")
    return [sys.executable, "-m", "protege", "stage", stage, "--params", "params.yaml"], Path(project_dir).resolve()


def run(argv: list[str], cwd: Path, env: Mapping[str, str]) -> int:
    """Runs the stage and returns its exit code (128 + N for a stage killed by signal N). Kubernetes' SIGTERM,
    sent to this process as the pod's first, is passed on: the stage's agent stops its ranks."""
    child = subprocess.Popen(argv, cwd=cwd, env=dict(env))
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: child.send_signal(signum))
    try:
        code = child.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return code if code >= 0 else 128 - code


def main() -> int:
    try:
        return node(os.environ)
    except NodeError as exc:
        print(f"flows.stage_node: {exc}", file=sys.stderr)
        return 2


def node(environ: Mapping[str, str]) -> int:
    from protege.pipeline import stage_env
    from protege.stage_names import TRAINING_SECTIONS

    run_id = flow_run_id(environ)
    parameters = dict(read_flow_run(run_id).parameters or {})
    argv, cwd = stage_command(parameters, run_id)
    stage = parameters["stage"]
    node = f"node {environ.get('PROTEGE_NODE_RANK', '?')} of {environ.get('PROTEGE_NODES', '?')}"
    if stage not in TRAINING_SECTIONS:  # pod 0 runs it whole; run here too, it would run twice
        print(f"{node}: stage '{stage}' runs on one node (only training stages span several); nothing to do here",
              flush=True)
        return 0
    endpoint = environ.get("PROTEGE_RDZV_ENDPOINT", "")
    ended = wait_for_rendezvous(endpoint, run_id) if endpoint else None
    if ended is not None:
        print(f"{node}: flow run {run_id} ended {ended.name} before node 0 opened the rendezvous; nothing to do here",
              flush=True)
        return 0 if ended.is_completed() else 1
    print(f"{node} (rendezvous {endpoint or '?'}): protege stage {stage} in {cwd}", flush=True)
    # the environment the flow run gives its stage: this environment's executables first, unbuffered output
    return run(argv, cwd, stage_env(parameters.get("parent_run_id")))


if __name__ == "__main__":
    sys.exit(main())
