#!/usr/bin/env bash
# Downloads, on a machine with the package index, the wheels benchmarks/gpu_check_offline.sh installs on a GPU
# machine that has none: CPython 3.12, manylinux x86_64, a torch (CUDA) already installed there, plus
# transformers' other needs, peft, pandas, pyarrow, pillow, pyyaml, typer, rich, psutil, py-cpuinfo, msgpack,
# ninja, nvidia-ml-py, numpy, safetensors, tokenizers, einops, accelerate. What protege's RL path and DeepSpeed
# need beyond that comes from here:
#
#   deepspeed 0.19.8   no wheel on PyPI: built here as a pure-Python wheel (DS_BUILD_OPS=0: its CUDA ops, unused
#                      by the check, would JIT-build on first use) against this checkout's .venv torch
#   hjson              DeepSpeed's config parser
#   pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions   protege.config, DeepSpeed
#   transformers 5.19.0, regex   protege needs transformers >= 5.19 (pyproject.toml; the `gpu` extra's vLLM
#                      takes < 5.20, so 5.19 is what the GPU environment gets); regex at the version it asks for
#   einops             DeepSpeed imports it (small; carried in case the machine lacks it)
#
#   bash benchmarks/gpu_wheels.sh            # into .whl (git must ignore it: echo /.whl/ >> .git/info/exclude)
#   WHEELS=/tmp/w bash benchmarks/gpu_wheels.sh
#   EXTRA_WHEELS="pandas==2.3.3" bash benchmarks/gpu_wheels.sh   # more NAME==VERSION, same platform
#
# Prints each wheel and the total size, which must stay within the 64 MiB a call to the GPU machine carries.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=${WHEELS:-.whl}
PY=${PROTEGE_PY:-.venv/bin/python}
LIMIT_MIB=${LIMIT_MIB:-64}
DEEPSPEED_SPEC=${DEEPSPEED_SPEC:-deepspeed==0.19.8}
# the versions this checkout's environment tests with (typing-extensions >= 4.16 for that pydantic-core)
PINNED="hjson==3.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
typing-extensions==4.16.0 einops==0.8.2 transformers==5.19.0 regex==2026.12.2"

mkdir -p "$WHEELS"
for spec in $PINNED ${EXTRA_WHEELS:-}; do
    name=${spec%%==*}
    version=${spec#*==}
    if ls "$WHEELS"/"$(echo "$name" | tr - _)"-"$version"-*.whl >/dev/null 2>&1; then
        continue  # already there
    fi
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$WHEELS" "$spec"
done

if ! ls "$WHEELS"/deepspeed-*.whl >/dev/null 2>&1; then
    # setup.py imports torch: built without isolation, with the torch of this checkout's environment; no ops
    DS_BUILD_OPS=0 DS_ACCELERATOR=cpu "$PY" -m pip wheel -q --no-deps --no-build-isolation "$DEEPSPEED_SPEC" \
        -w "$WHEELS"
fi

# one version of each package: two would stop the whole install there
dupes=$(ls "$WHEELS"/*.whl | xargs -n1 basename | cut -d- -f1 | tr A-Z a-z | sort | uniq -d)
[ -z "$dupes" ] || { echo "gpu_wheels: two versions of: $dupes (remove one from $WHEELS)" >&2; exit 1; }

ls -l "$WHEELS"/*.whl | awk '{printf "%10d  %s\n", $5, $NF}'
total=$(du -cb "$WHEELS"/*.whl | tail -n 1 | cut -f1)
echo "gpu_wheels: $(ls "$WHEELS"/*.whl | wc -l) wheels, $((total / 1024)) KiB in $WHEELS (limit $LIMIT_MIB MiB)"
[ "$total" -le $((LIMIT_MIB * 1024 * 1024)) ] || { echo "gpu_wheels: over $LIMIT_MIB MiB" >&2; exit 1; }
