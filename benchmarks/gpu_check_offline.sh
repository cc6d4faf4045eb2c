#!/usr/bin/env bash
# The GPU check for ONE GPU and NO package index (e.g. a lent H100 / H200 whose image has Python 3.12 with a CUDA
# torch, transformers, peft, pandas, pyarrow, pillow, pyyaml, typer, rich, psutil, py-cpuinfo, msgpack, ninja,
# nvidia-ml-py, numpy, safetensors, tokenizers): it runs from this checkout plus the wheels that
# benchmarks/gpu_wheels.sh downloads beforehand (about 18 MiB: DeepSpeed, pydantic, hjson, transformers 5.19,
# ...), installed with `pip install --no-index --no-deps --target $SITE` and put first on PYTHONPATH with the
# checkout. No vLLM, no MLflow: what needs them is gpu_check.sh's. Parts, each under `timeout`, all within
# BUDGET_S (default 450 s, under 8 minutes with the install):
#
#   driver              the driver against the CUDA version torch was built with (gpu_driver.py)
#   resume              ZeRO-2 fp32 RL steps of the tiny student, exact-resume probe: N steps in one go, a run
#                       stopped after step K with its state saved, a fresh process resuming it; the final
#                       weights must equal (deterministic kernels). Prints the uninterrupted run's figures too
#   rl-bf16-lora        bf16 + LoRA at a 152,064-token vocabulary, ZeRO-2
#   rl-bf16-lora-zero3  the same under ZeRO-3: weights compared whole, gathered from the shards
#   bf16-updates        benchmarks/bf16_updates.py, the bf16-update probe: how many weight elements small AdamW
#                       steps move with bf16 weights, plain vs fp32 master weights, against fp32 (tiny student, CPU)
#   activation-bytes    bytes per token one Qwen2.5-VL-7B decoder layer keeps for backward: plain, gradient
#                       checkpointing, LoRA r=128 (dropout 0.05), both (activation_bytes.py, 4096 tokens, bf16)
#   direct-load         a 7B-width student (2 layers, bf16, 3.1 GB) loaded onto the GPU as the stages load the
#                       policy and the discriminator: the host's peak resident memory must not grow by a copy of
#                       it (direct_load.py)
#
#   bash benchmarks/gpu_wheels.sh                            # here, with the index: fills .whl
#   bash benchmarks/gpu_check_offline.sh                     # there: .whl carried beside the checkout
#   bash benchmarks/gpu_check_offline.sh --parts resume,activation-bytes
#   bash benchmarks/gpu_check_offline.sh --cpu-smoke         # no GPU: every part on the CPU, tiny sizes
#
# Options: --parts a,b, --wheels DIR (default $WHEELS or .whl; --cpu-smoke installs none unless given), --cpu-smoke,
# -h/--help.
# Environment: PYTHON (default python3; --cpu-smoke: .venv/bin/python), SITE (default /tmp/site), BUDGET_S,
# STEPS (resume's N, default 4), GPU_CHECK_LOGS, BF16_UPDATES_ARGS (replace bf16_updates.py's arguments).
set -uo pipefail
cd "$(dirname "$0")/.."

ALL_PARTS="driver resume rl-bf16-lora rl-bf16-lora-zero3 bf16-updates activation-bytes direct-load"
SMOKE=0
WANTED=${PARTS:-}
WHEELS_GIVEN=${WHEELS:+1}
WHEELS=${WHEELS:-.whl}
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case $1 in
        --cpu-smoke) SMOKE=1 ;;
        --parts) [ $# -ge 2 ] || { echo "gpu_check_offline: --parts needs a comma-separated list" >&2; exit 2; }
                 WANTED=$2; shift ;;
        --parts=*) WANTED=${1#--parts=} ;;
        --wheels) [ $# -ge 2 ] || { echo "gpu_check_offline: --wheels needs a folder" >&2; exit 2; }
                  WHEELS=$2; WHEELS_GIVEN=1; shift ;;
        --wheels=*) WHEELS=${1#--wheels=}; WHEELS_GIVEN=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "gpu_check_offline: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
for p in ${WANTED//,/ }; do
    [[ " $ALL_PARTS " == *" $p "* ]] || { echo "gpu_check_offline: unknown part '$p'; parts: $ALL_PARTS" >&2; exit 2; }
done

SITE=${SITE:-/tmp/site}
BUDGET_S=${BUDGET_S:-450}
STEPS=${STEPS:-4}
LOGS=${GPU_CHECK_LOGS:-$(mktemp -d -t gpu_check_offline.XXXXXX)}
mkdir -p "$LOGS" && : >"$LOGS/parts"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1

TAG=gpu_check_offline
# fail, want, skip_part, run_part
source benchmarks/gpu_parts.sh

install_wheels() {  # the carried wheels into $SITE, first on the path; the checkout's protege, not installed
    if [ "$SMOKE" = 1 ] && [ -z "$WHEELS_GIVEN" ]; then  # .whl holds cp312 wheels for the GPU machine, not for here
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
        return
    fi
    if compgen -G "$WHEELS/*.whl" >/dev/null; then
        echo "gpu_check_offline: installing $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
            "$WHEELS"/*.whl || fail "pip install --no-index --no-deps --target $SITE $WHEELS/*.whl"
        export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "gpu_check_offline: no wheels in $WHEELS: using $PY's own packages (benchmarks/gpu_wheels.sh makes them)"
        export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    fi
}

check_imports() {
    "$PY" -c "import torch, transformers, peft, pydantic, deepspeed, protege.rl.loop
print('gpu_check_offline: python', __import__('sys').version.split()[0], '| torch', torch.__version__, '(CUDA',
      torch.version.cuda, ') | transformers', transformers.__version__, '| peft', peft.__version__, '| deepspeed',
      deepspeed.__version__, '| pydantic', pydantic.__version__, '| protege from', protege.__file__)
assert $([ "$SMOKE" = 1 ] && echo True || echo 'torch.cuda.is_available()'), 'torch sees no CUDA device'" ||
        fail "$PY cannot import what the check needs (the traceback above names the package: carry its wheel)"
}

if [ "$SMOKE" = 1 ]; then
    PY=${PYTHON:-.venv/bin/python}
    export DS_ACCELERATOR=cpu CUDA_VISIBLE_DEVICES=""
    DEVICE=cpu
    SIZES=(--questions 2 --group 2 --new-tokens 4)
    ACTIVATION=(--family tiny --tokens 32)
    LOAD_SIZES=(--hidden 64 --intermediate 256 --heads 2 --kv-heads 1 --vocab 400)
    RESUME_STEPS=3
    echo "gpu_check_offline: CPU smoke with $PY; logs in $LOGS"
else
    PY=${PYTHON:-python3}
    export DS_ACCELERATOR=cuda
    DEVICE=cuda
    SIZES=()
    ACTIVATION=(--family qwen2.5-vl-7b --tokens 4096)
    LOAD_SIZES=()
    RESUME_STEPS=$STEPS
    command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this check needs an NVIDIA GPU and its driver"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || fail "nvidia-smi sees no GPU"
fi
install_wheels
check_imports

if [ "$SMOKE" = 1 ]; then  # the decision on a given driver: an H100 image's driver and its CUDA 13 torch
    run_part driver 60 "$PY" benchmarks/gpu_driver.py --driver 580.159.04 --driver-cuda 13.0 --torch-cuda 13.0
else
    run_part driver 60 "$PY" benchmarks/gpu_driver.py
    if want driver && [ "$(cat "$LOGS/driver.status")" != ok ]; then
        "$PY" benchmarks/gpu_summary.py "$LOGS" --prefix gpu_check_offline
        fail "the driver check failed (above): no CUDA part can run"
    fi
fi
run_part resume 240 "$PY" benchmarks/gpu_rl.py resume --device "$DEVICE" --backend deepspeed --zero 2 \
    ${SIZES[@]+"${SIZES[@]}"} --steps "$RESUME_STEPS" --stop-after 2 --part-limit 100
run_part rl-bf16-lora 120 "$PY" benchmarks/gpu_rl.py rl --device "$DEVICE" --generation transformers \
    --backend deepspeed --zero 2 --dtype bfloat16 --trainable lora --vocab 152064 ${SIZES[@]+"${SIZES[@]}"} --steps 3
run_part rl-bf16-lora-zero3 120 "$PY" benchmarks/gpu_rl.py rl --device "$DEVICE" --generation transformers \
    --backend deepspeed --zero 3 --dtype bfloat16 --trainable lora --vocab 152064 ${SIZES[@]+"${SIZES[@]}"} --steps 3
# benchmarks/bf16_updates.py (another engineer's, with the fp32 master weights): weight elements 10 AdamW steps
# move with bf16 weights, plain vs fp32 masters, against fp32 (the tiny student, on the CPU; it prints a table,
# which the summary shows). BF16_UPDATES_ARGS replaces its arguments. Skipped, and said so, where it is missing
if [ -f benchmarks/bf16_updates.py ]; then
    BF16_ARGS=${BF16_UPDATES_ARGS-}
    [ "$SMOKE" = 1 ] && BF16_ARGS=${BF16_UPDATES_ARGS---steps 2 --lr 1e-4}
    # shellcheck disable=SC2086 # the arguments are words
    run_part bf16-updates 120 "$PY" benchmarks/bf16_updates.py $BF16_ARGS
else
    skip_part bf16-updates "benchmarks/bf16_updates.py is not in this checkout"
fi
run_part activation-bytes 150 "$PY" benchmarks/activation_bytes.py --device "$DEVICE" "${ACTIVATION[@]}"
run_part direct-load 150 "$PY" benchmarks/direct_load.py --device "$DEVICE" ${LOAD_SIZES[@]+"${LOAD_SIZES[@]}"}

"$PY" benchmarks/gpu_summary.py "$LOGS" --prefix gpu_check_offline --json "$LOGS/summary.json"
