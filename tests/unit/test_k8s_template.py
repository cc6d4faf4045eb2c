"""The gpu work pool's Kubernetes job template (deploy/k8s/), rendered by Prefect's own job-configuration code
the way a worker renders it for a deployment's job variables; then what prefect-kubernetes' worker makes of it
(its steps that shape the pod, mirrored below: the package is not a dependency here) and what each pod of the
Indexed Job runs once Kubernetes has filled in the pod's own values."""
import asyncio
import copy
import json
import os
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml
from prefect.client.schemas.objects import FlowRun
from prefect.utilities.processutils import command_from_string
from prefect.workers.base import BaseJobConfiguration

from tests.conftest import REPO

TEMPLATE = REPO / "deploy" / "k8s" / "gpu-base-job-template.json"
SERVICE = REPO / "deploy" / "k8s" / "rendezvous-service.yaml"
JOB_NAME = "rl-x7k2p"  # what Kubernetes makes of the manifest's generateName "rl-"
FLOW_RUN = "6f1c2a4e-0000-4000-8000-000000000001"


class KubernetesJob(BaseJobConfiguration):
    """The fields our template adds to Prefect's base configuration (what prefect-kubernetes' worker reads)."""
    namespace: str
    job_manifest: dict[str, Any]


def render(job_variables: dict) -> KubernetesJob:
    """A client that points nowhere: our template has no block or variable placeholders, so rendering must
    not need a server (were one added, this fails instead of starting a temporary server)."""
    from prefect.client.orchestration import PrefectClient

    template = json.loads(TEMPLATE.read_text())
    client = PrefectClient("http://127.0.0.1:9/api")
    return asyncio.run(KubernetesJob.from_template_and_values(template, job_variables, client=client))


def container(job: KubernetesJob | dict) -> dict:
    manifest = job if isinstance(job, dict) else job.job_manifest
    [c] = manifest["spec"]["template"]["spec"]["containers"]
    return c


def defaults() -> dict:
    return {k: v.get("default") for k, v in json.loads(TEMPLATE.read_text())["variables"]["properties"].items()}


def worker_manifest(job: KubernetesJob) -> dict:
    """The Job prefect-kubernetes' worker creates from the rendered configuration, for the steps of its
    KubernetesWorkerJobConfiguration.prepare_for_flow_run that shape the pod: Prefect's own preparation for a
    flow run (the run's id in env), then the env mapping as name/value entries ahead of the container's own
    entries (those the mapping also names dropped), the container's args from the `command` variable or, left
    empty, the worker's flow-run command, and the Job's labels added to the pod's."""
    job = job.model_copy(deep=True)
    job.prepare_for_flow_run(FlowRun(id=uuid.UUID(FLOW_RUN), flow_id=uuid.uuid4(), name="rl",
                                     parameters={"project_dir": "/workspace/protege", "stage": "rl"}))
    manifest = copy.deepcopy(job.job_manifest)
    c = container(manifest)
    env = [{"name": k, "value": v} for k, v in job.env.items()]
    c["env"] = env + [e for e in c["env"] if e["name"] not in job.env] if isinstance(c.get("env"), list) else env
    args = c.get("args")
    if args is None:
        c["args"] = command_from_string(BaseJobConfiguration._base_flow_run_command())
    elif isinstance(args, str):
        c["args"] = command_from_string(args)
    pod = manifest["spec"]["template"].setdefault("metadata", {})
    pod["labels"] = {**pod.get("labels", {}), **job.labels}
    return manifest


def k8s_expand(text: str, defined: Mapping[str, str]) -> str:
    """Kubernetes' expansion of env values, command and args: $(VAR) is VAR's value where VAR is defined (for an
    env value: by an entry before it), $$ is one $, anything else stays as written."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and text.find(")", i) > 0:
            end = text.find(")", i)
            name = text[i + 2:end]
            out.append(defined[name] if name in defined else text[i:end + 1])
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def pod(manifest: dict, index: int) -> tuple[dict[str, str], list[str], str]:
    """Pod `index` of the Indexed Job as Kubernetes starts it: the Job controller's labels and annotation on it
    (job name, completion index) and JOB_COMPLETION_INDEX after the container's env; the downward API's values
    and the $(VAR) expansion filled in. Returns the process's environment, its command line and the pod's DNS
    name (hostname <job-name>-<index> in its subdomain)."""
    template = manifest["spec"]["template"]
    labels = {**template["metadata"]["labels"], "job-name": JOB_NAME, "batch.kubernetes.io/job-name": JOB_NAME,
              "batch.kubernetes.io/job-completion-index": str(index)}
    annotations = {"batch.kubernetes.io/job-completion-index": str(index)}
    fields = {**{f"metadata.labels['{k}']": v for k, v in labels.items()},
              **{f"metadata.annotations['{k}']": v for k, v in annotations.items()}}
    c = container(manifest)
    index_env = {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}}
    env: dict[str, str] = {}
    for entry in [*c["env"], index_env]:
        if "valueFrom" in entry:
            env[entry["name"]] = fields[entry["valueFrom"]["fieldRef"]["fieldPath"]]  # KeyError: the pod lacks it
        else:
            assert isinstance(entry["value"], str), f"Kubernetes takes only strings as env values: {entry}"
            env[entry["name"]] = k8s_expand(entry["value"], env)
    argv = [k8s_expand(a, env) for a in [*c.get("command", []), *c["args"]]]
    return env, argv, f"{JOB_NAME}-{index}.{template['spec']['subdomain']}"


def executes(argv: list[str], env: dict[str, str], tmp_path: Path) -> list[str]:
    """What the pod's process ends up running: its command line under /bin/sh, with stand-ins for `prefect` and
    `python` first on PATH that print how they were called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("prefect", "python"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho {name} "$@"\n')
        (bin_dir / name).chmod(0o755)
    done = subprocess.run(argv, env={**env, "PATH": f"{bin_dir}{os.pathsep}{os.defpath}"}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_defaults_render_a_one_gpu_job():
    job = render({})
    c = container(job)
    assert job.job_manifest["kind"] == "Job" and job.namespace == "protege"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and c["resources"]["requests"]["memory"] == "64Gi"
    assert pod(worker_manifest(job), 0)[0]["DS_ACCELERATOR"] == "cuda" and c["workingDir"] == "/workspace/protege"
    spec = job.job_manifest["spec"]["template"]["spec"]
    assert spec["volumes"][0]["persistentVolumeClaim"]["claimName"] == "protege-workspace"
    assert "{{" not in json.dumps(job.job_manifest).replace("{{ name }}", "")  # every variable has a value


def test_a_deployments_job_variables_override_gpu_count_and_image():
    job = render({"gpus": 4, "image": "ghcr.io/acme/protege:1.2", "memory": "320Gi",
                  "env": {"NCCL_DEBUG": "INFO"}})
    c = container(job)
    assert c["image"] == "ghcr.io/acme/protege:1.2"
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 4, "memory": "320Gi", "cpu": "8",
                                        "ephemeral-storage": "100Gi"}
    assert job.env["NCCL_DEBUG"] == "INFO"


def test_the_plans_job_variables_fill_the_template():
    """`protege plan --job` prints variables this template takes: 8 ranks of a 7B RIL run on one node."""
    from protege.config import load_config
    from protege.plan import GiB, host_plan, job_variables, model_shape

    folder = REPO / "docs" / "examples" / "qwen2.5-vl-7b"
    cfg = load_config(folder / "params.yaml")
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"path": str(folder)})})
    host = host_plan(cfg, model_shape(cfg, REPO, folder), processes=8)
    variables = job_variables(host)
    assert set(variables) <= set(json.loads(TEMPLATE.read_text())["variables"]["properties"])
    c = container(render(variables))
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8
    # each of the eight ranks keeps its 14 GiB bf16 discriminator on the host between updates (offload_idle),
    # rank 0 a checkpoint's merged weights besides: far above the template's 64Gi default
    assert host.rank["models waiting on the host"] > 14 * GiB and host.rank0["checkpoint (merged weights)"] > 15 * GiB
    memory = int(c["resources"]["limits"]["memory"].removesuffix("Gi"))
    assert memory * GiB >= host.node_peak and memory > 8 * 18
    assert c["resources"]["requests"]["ephemeral-storage"] == variables["ephemeral_storage"]


@pytest.mark.parametrize("name", ["gpus", "image", "memory", "workspace_pvc", "project_dir", "nodes",
                                  "rendezvous_port", "rendezvous_service"])
def test_every_documented_variable_is_used_by_the_manifest(name):
    template = json.loads(TEMPLATE.read_text())
    assert name in template["variables"]["properties"]
    assert "{{ " + name + " }}" in json.dumps(template["job_configuration"])


SH = pytest.mark.skipif(not Path("/bin/sh").exists(), reason="the pods' command is a /bin/sh script")


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_kubernetes_worker_accepts_the_manifest(nodes):
    """prefect-kubernetes refuses a Job manifest that lacks what its own base manifest has, or changes it (its
    KubernetesWorkerJobConfiguration._validate_job_manifest, mirrored): the pod spec's parallelism and
    completions of 1 are its check's (Kubernetes drops them); the Job's own are spec.parallelism/completions."""
    manifest = render({"nodes": nodes}).job_manifest
    manifest["metadata"].setdefault("annotations", {})
    base = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"annotations": {}, "labels": {}},
            "spec": {"template": {"spec": {"parallelism": 1, "completions": 1, "restartPolicy": "Never",
                                           "containers": [{"name": "prefect-job"}]}}}}
    refused = [op for op in jsonpatch.JsonPatch.from_diff(manifest, base) if op["op"] in ("add", "replace")]
    assert not refused


@SH
def test_one_node_by_default_runs_the_flow_run_as_before(tmp_path):
    """The default is an Indexed Job of one pod that runs the worker's flow-run command, as the template did
    before it had nodes: the container's args are what the worker fills in where `command` is left empty."""
    manifest = worker_manifest(render({}))
    spec = manifest["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 1, 1)
    assert container(manifest)["args"] == ["prefect", "flow-run", "execute"]
    env, argv, _ = pod(manifest, 0)
    assert executes(argv, env, tmp_path) == ["prefect", "flow-run", "execute"]
    assert (env["PROTEGE_NODES"], env["PROTEGE_NODE_RANK"], env["PREFECT__FLOW_RUN_ID"]) == ("1", "0", FLOW_RUN)


def test_two_nodes_are_an_indexed_job_on_the_rendezvous_services_subdomain():
    job = render({"nodes": 2})
    spec = job.job_manifest["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert spec["template"]["spec"]["subdomain"] == defaults()["rendezvous_service"] == "protege-rendezvous"
    assert job.env["PROTEGE_NODES"] == "2"


def test_every_pod_of_two_nodes_finds_the_rendezvous_on_pod_0():
    manifest = worker_manifest(render({"nodes": 2}))
    pods = [pod(manifest, index) for index in (0, 1)]
    for index, (env, _, _) in enumerate(pods):
        assert env["PROTEGE_RDZV_ENDPOINT"] == f"{JOB_NAME}-0.protege-rendezvous:29400"
        assert env["PROTEGE_NODES"] == "2" and env["PROTEGE_NODE_RANK"] == str(index)
        assert env["PREFECT__FLOW_RUN_ID"] == FLOW_RUN  # stage_node reads the stage from the flow run
    host = pods[0][0]["PROTEGE_RDZV_ENDPOINT"].rpartition(":")[0]
    assert host == pods[0][2]  # pod 0's own DNS name, which the headless Service publishes


@SH
def test_pod_0_runs_the_flow_run_and_the_other_pods_run_stage_node(tmp_path):
    manifest = worker_manifest(render({"nodes": 2}))
    runs = {}
    for index in (0, 1):
        env, argv, _ = pod(manifest, index)
        runs[index] = executes(argv, env, tmp_path)
    assert runs == {0: ["prefect", "flow-run", "execute"], 1: ["python", "-m", "flows.stage_node"]}


def test_the_rendezvous_port_and_service_are_job_variables():
    job = render({"nodes": 3, "rendezvous_port": 29500, "rendezvous_service": "rdzv-a"})
    manifest = worker_manifest(job)
    env, _, name = pod(manifest, 2)
    assert env["PROTEGE_RDZV_ENDPOINT"] == f"{JOB_NAME}-0.rdzv-a:29500" and name == f"{JOB_NAME}-2.rdzv-a"
    assert manifest["spec"]["template"]["metadata"]["labels"]["protege/rendezvous"] == "rdzv-a"
    assert container(manifest)["ports"] == [{"name": "rendezvous", "containerPort": 29500}]


def test_the_rendezvous_service_selects_every_pod_of_the_template():
    service = yaml.safe_load(SERVICE.read_text())
    variables = defaults()
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True  # pod 0's name resolves before it is ready
    assert service["metadata"]["name"] == variables["rendezvous_service"]
    assert service["metadata"]["namespace"] == variables["namespace"]
    assert [p["port"] for p in service["spec"]["ports"]] == [variables["rendezvous_port"]]
    for job_variables in ({}, {"nodes": 2, "labels": {"team": "vision"}}):  # a deployment's labels replace ours
        labels = worker_manifest(render(job_variables))["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= labels.items()
