"""The gpu work pool's Kubernetes job template (deploy/k8s/), rendered by Prefect's own job-configuration code
the way a worker renders it for a deployment's job variables."""
import asyncio
import json
from typing import Any

import pytest
from prefect.workers.base import BaseJobConfiguration

from tests.conftest import REPO

TEMPLATE = REPO / "deploy" / "k8s" / "gpu-base-job-template.json"


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


def container(job: KubernetesJob) -> dict:
    [c] = job.job_manifest["spec"]["template"]["spec"]["containers"]
    return c


def test_defaults_render_a_one_gpu_job():
    job = render({})
    c = container(job)
    assert job.job_manifest["kind"] == "Job" and job.namespace == "protege"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1 and c["resources"]["requests"]["memory"] == "64Gi"
    assert c["env"]["DS_ACCELERATOR"] == "cuda" and c["workingDir"] == "/workspace/protege"
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


@pytest.mark.parametrize("name", ["gpus", "image", "memory", "workspace_pvc", "project_dir"])
def test_every_documented_variable_is_used_by_the_manifest(name):
    template = json.loads(TEMPLATE.read_text())
    assert name in template["variables"]["properties"]
    assert "{{ " + name + " }}" in json.dumps(template["job_configuration"])
