#!/usr/bin/env bash
# The GPU check, one prepared script for a CUDA machine (written for one H100 / H200; under 8 minutes once the
# environment exists): a few RL steps of the tiny world's student with DeepSpeed ZeRO-2 on CUDA, rollouts
# from transformers and from vLLM (sleep mode, weights synced tensor by tensor after every update, truncated
# importance sampling), one bf16 + LoRA + ZeRO-3 step at a 151,936-token vocabulary, a check that the vLLM
# engine answers like the policy before and after a sync, and two processes where two GPUs are there. Prints
# rollout tokens/s, update and sync seconds, and each part's peak GPU memory beside `protege plan`'s estimate.
#
#   bash benchmarks/gpu_check.sh            # STEPS=8 by default
#   STEPS=4 PROTEGE_GPU_VENV=/opt/venv bash benchmarks/gpu_check.sh
#
# The environment (default .venv-gpu) is created when missing, which needs the package index: vLLM's CUDA
# wheel with the torch, torchvision and transformers it pins (Qwen2-VL in vLLM needs torchvision), protege
# without its dependencies, and DeepSpeed built against that torch. An existing one is used as it is.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${PROTEGE_GPU_VENV:-.venv-gpu}
STEPS=${STEPS:-8}
VLLM_SPEC=${VLLM_SPEC:-vllm==0.33.0}
DEEPSPEED_SPEC=${DEEPSPEED_SPEC:-deepspeed==0.19.8}
PY="$VENV/bin/python"
LOGS=$(mktemp -d)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1 TOKENIZERS_PARALLELISM=false

fail() {
    echo "gpu_check: FAILED: $*" >&2
    exit 1
}

command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this check needs a CUDA GPU"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || fail "nvidia-smi sees no GPU"

if [ ! -x "$PY" ]; then
    # DeepSpeed compiles its CUDA ops against the toolkit at first use; without nvcc they cannot build
    if ! command -v nvcc >/dev/null && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
        echo "gpu_check: no CUDA toolkit (nvcc) found: DeepSpeed's optional ops will not build (DS_BUILD_OPS=0)"
        export DS_BUILD_OPS=0
    fi
    echo "gpu_check: creating $VENV ($VLLM_SPEC for CUDA + $DEEPSPEED_SPEC)"
    python3 -m venv "$VENV" || fail "python3 -m venv $VENV"
    "$VENV/bin/pip" install -q --upgrade pip wheel setuptools || fail "pip upgrade"
    "$VENV/bin/pip" install -q "$VLLM_SPEC" || fail "pip install $VLLM_SPEC"
    "$VENV/bin/pip" install -q --no-deps -e . || fail "pip install protege"
    "$VENV/bin/pip" install -q pandas pyarrow ninja || fail "pip install pandas pyarrow ninja"
    "$VENV/bin/pip" install -q --no-build-isolation "$DEEPSPEED_SPEC" || fail "pip install $DEEPSPEED_SPEC"
fi
"$PY" -c "import torch, vllm, deepspeed, transformers
assert torch.cuda.is_available(), 'torch sees no CUDA device'
print('gpu_check: torch', torch.__version__, '| vllm', vllm.__version__, '| deepspeed', deepspeed.__version__,
      '| transformers', transformers.__version__, '|', torch.cuda.get_device_name())" ||
    fail "$VENV cannot import torch + vllm + deepspeed with CUDA (rm -rf $VENV to rebuild it)"

# one part at a time, each in its own process under a time limit, so a hang or crash names its part
run_part() {
    local name=$1 limit=$2
    shift 2
    echo "gpu_check: $name ..."
    if ! timeout "$limit" "$PY" benchmarks/gpu_rl.py "$@" >"$LOGS/$name.log" 2>&1; then
        tail -n 40 "$LOGS/$name.log" >&2
        fail "$name (exit status above; full log $LOGS/$name.log)"
    fi
    grep '^{' "$LOGS/$name.log" | tail -n 1 >"$LOGS/$name.json"
}

run_part rl-transformers 120 rl --generation transformers --backend deepspeed --steps "$STEPS"
run_part rl-vllm 150 rl --generation vllm --backend deepspeed --steps "$STEPS"
run_part rl-bf16-lora-zero3 120 rl --generation transformers --backend deepspeed --zero 3 --dtype bfloat16 \
    --trainable lora --vocab 151936 --steps 3
run_part sync 90 sync
GPUS=$(nvidia-smi --list-gpus | wc -l)
if [ "$GPUS" -ge 2 ]; then
    echo "gpu_check: two processes ..."
    timeout 150 "$PY" -m torch.distributed.run --nproc_per_node 2 benchmarks/gpu_rl.py rl --generation transformers \
        --backend deepspeed --zero 3 --steps 3 >"$LOGS/two-processes.log" 2>&1 ||
        { tail -n 40 "$LOGS/two-processes.log" >&2; fail "two processes (full log $LOGS/two-processes.log)"; }
    grep '^{' "$LOGS/two-processes.log" | tail -n 1 >"$LOGS/two-processes.json"
else
    echo "gpu_check: two processes skipped: $GPUS GPU (one rank per GPU)"
fi

"$PY" - "$LOGS" <<'EOF'
import json
import sys
from pathlib import Path

logs = Path(sys.argv[1])
for name in ("rl-transformers", "rl-vllm", "rl-bf16-lora-zero3", "two-processes"):
    if not (logs / f"{name}.json").exists():
        continue
    r = json.loads((logs / f"{name}.json").read_text())
    print(f"gpu_check: {name:18s} rollouts {r['rollout_tokens_per_s']:9.0f} tokens/s | update {r['update_s']:.3f} s"
          f" | weight sync {r['sync_s']:.3f} s | step {r['step_s']:.3f} s | {r['sequences_per_step']} sequences/step,"
          f" median of {max(r['steps'] - 1, 1)} steps, {r['tensors_changed']} tensors changed | peak "
          f"{r['peak_gib']:.2f} GiB, plan {r['plan_gib']:.2f} GiB ({r['dtype']}, {r['trainable']}, ZeRO-{r['zero']},"
          f" vocabulary {r['vocab'] or 'as trained'})" + (f" | tis weight {r['tis_weight_mean']:.3f}"
                                                           if "tis_weight_mean" in r else ""))
s = json.loads((logs / "sync.json").read_text())
print(f"gpu_check: sync check       engine start {s['startup_s']:.1f} s | sync {s['sync_s']:.3f} s | first tokens "
      f"agree with torch {s['agree_before']:.2f} before, {s['agree_after']:.2f} after the sync "
      f"(stale until synced {s['stale_until_sync']:.2f}) | sampling {s['sampling_tokens_per_s']:.0f} tokens/s "
      f"over {s['sampling_sequences']} sequences")
EOF
echo "gpu_check: OK"
