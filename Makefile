# shardbench: `make help` lists every target. The first target that needs the environment creates it.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
LOCK ?= requirements/cpu.lock
STAMP := $(VENV)/.installed-$(notdir $(LOCK))
ARGS ?=
# make test's pytest-xdist workers: 2 (tests/workers.py keeps the fp32 launch on one worker while the other runs the
# in-process tests); JOBS=0 runs it in one process. make test-launches runs in one process: its launches are one group
JOBS ?= 2
# where the studies write: results/local/ (ignored by git) unless SNAPSHOT=1, which writes the committed results/,
# a change to commit on purpose (harness/core/paths.results_dir; `shardbench <command> --snapshot` alone)
SNAPSHOT ?=
export SHARDBENCH_SNAPSHOT := $(SNAPSHOT)
RESULTS := results$(if $(filter-out 0,$(SNAPSHOT)),,/local)
# DeepSpeed's JIT ops, built once per clone (~2 min for both, measured 115 s) and reused by every run and test
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.DEFAULT_GOAL := help
.PHONY: help install warm demo demo-snapshot compare sweep report run estimate bench advise memory-check time-check time-extrapolate device-costs scale-check hybrid checkpoint gpu-review gpu-check gpu-capacity gpu-axes axes published advise-field capacity collectives finetune faults browser docs test test-launches test-drills test-all clean lock

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'
	@echo "  backends (backend=<name>, conf/backend/): $$(ls conf/backend | sed 's/\.yaml$$//' | tr '\n' ' ')"
	@echo "  the studies write results/local/<study>/ (ignored by git); SNAPSHOT=1 writes the committed results/ (and experiments/published/README.md), to commit on purpose"
	@echo "  hybrid ones (fsdp_hsdp, fsdp_partial, ds_zeropp) group ranks by node and gain nothing over their flat form on one: run them with parallelism.nnodes>1"

install: $(STAMP) ## create .venv with the pinned CPU stack (torch 2.13.0 CPU; never the CUDA build)
$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	# torch first, pinned, so that no later requirement can pull the multi-GB CUDA build
	$(PY) -m pip install -q -c $(LOCK) torch==2.13.0
	$(PY) -m pip install -q -c $(LOCK) -e '.[dev]'
	touch $@

warm: install ## build DeepSpeed's JIT ops once into .cache/torch_extensions (~2 min the first time, safe to interrupt; then a 0.2 s check)
	$(PY) -m harness warm-ops

demo: install warm ## the main job: every backend on the default CPU setting, then its report -> results/sweeps/compare_all/ (ignored by git)
	$(PY) -m harness train experiment=compare_all $(ARGS)

demo-snapshot: demo ## refresh the committed demo (results/demo/) from the last make demo: a change to commit on purpose
	rm -rf results/demo/plots && mkdir -p results/demo
	cp -r results/sweeps/compare_all/{summary.md,summary.csv,report.md,report.html,plots} results/demo/

compare: install warm ## every backend side by side (Hydra multirun of experiment=compare_all)
	$(PY) -m harness train experiment=compare_all $(ARGS)

sweep: install warm ## any experiment: make sweep EXP=model_scaling [ARGS="force=true ..."] (conf/experiment/)
	@test -n "$(EXP)" || { echo "usage: make sweep EXP=<$$(ls conf/experiment | sed 's/.yaml//' | paste -sd'|')>"; exit 2; }
	$(PY) -m harness train experiment=$(EXP) $(ARGS)

report: install ## rebuild a finished sweep's summary.csv and report: make report SWEEP=results/sweeps/<name>
	@test -n "$(SWEEP)" || { echo "usage: make report SWEEP=results/sweeps/<name>"; exit 2; }
	$(PY) -m harness report $(SWEEP)

run: install warm ## one run: make run ARGS="backend=ds_zero3 model=tiny_gpt2"
	$(PY) -m harness train $(ARGS)

ESTIMATE_MODELS ?= qwen2_5_0_5b mistral_7b llama3_8b
estimate: install ## predict memory and comm for every backend, no training: the published-model presets on 8 GPUs in bf16, or make estimate ARGS="model=llama_7b parallelism=gpu8"
	@if [ -n "$(ARGS)" ]; then $(PY) -m harness estimate $(ARGS); else \
	  for m in $(ESTIMATE_MODELS); do $(PY) -m harness estimate model=$$m parallelism=gpu8 train.precision=bf16 || exit 1; done; fi

bench: install warm ## harness overhead (~60 min): 48 pairs of a harness run and an independent loop a backend, both in the same ranks of a launch, over 12 launches (ddp, fsdp, fsdp_grad_op, ds_zero2, ds_zero3, accelerate's DDP), median paired ratio with its 95% interval over launches and pairs; ARGS="--profile fsdp" diffs the two loops' profiles, ARGS=--processes runs each its own launch -> results/bench/
	$(PY) -m harness bench $(ARGS)

advise: install warm ## which strategy? theory prunes, real runs decide: make advise ARGS="model=small_llama --device-gib 0.0625" -> results/advise/
	$(PY) -m harness advise $(ARGS)

memory-check: install warm ## the memory model against measured peaks: every backend x model x precision x checkpointing policy, one launch; a states-dominated shape at 4 ranks and at 2; an activation-dominated one (the policies apart); the same matrix at dp 2 x tp 2 -> results/memory_check/
	$(PY) -m harness memory-check $(ARGS)
	$(PY) -m harness memory-check --states-dominated --repeats 2
	$(PY) -m harness memory-check --states-dominated --repeats 2 --out $(RESULTS)/memory_check/states_dominated_2ranks parallelism.nproc_per_node=2
	$(PY) -m harness memory-check --activation-dominated --models tiny_llama,tiny_gpt2 --repeats 2
	$(PY) -m harness memory-check --activation-dominated --backends ddp,fsdp,ds_zero2,ds_zero3 --models tiny_llama,tiny_gpt2 --repeats 2 --out $(RESULTS)/memory_check/compiled train.compile=true
	$(PY) -m harness memory-check --models tiny_llama,tiny_qwen2,tiny_mistral --out $(RESULTS)/memory_check/tp parallelism.nproc_per_node=4 parallelism.tp=2

scale-check: install warm ## 8-512 ranks on fake tensors: llama 1b-70b, FSDP2, bf16/fp32, ckpt off/on, 2-D cells (tp 2-8), long sequences (cp 2-8, 32k-128k) and MoE (Qwen3-30B-A3B, Mixtral, ep 1/8), traced against theory -> results/scale_check/
	$(PY) -m harness scale-check $(ARGS)

hybrid: install warm ## hybrid sharding: every hybrid backend beside ddp, fsdp, ds_zero3 on 2 emulated nodes x 2 ranks, and llama 7b/13b on 4x8 and 16x8 GPUs in theory -> results/hybrid/
	$(PY) -m harness hybrid $(ARGS)

checkpoint: install warm ## checkpoints: every backend saves small_llama (sync, and DCP async), resumes at 2 ranks and reshards to 1: seconds, bytes against theory, host memory -> results/checkpoint/
	$(PY) -m harness checkpoint-costs $(ARGS)

device-costs: install warm ## the time model's device costs, once per machine: rates, copy curve, collectives in busy processes at 2-4 ranks, host costs calibrated on 2-rank tiny_llama runs -> results/device_costs/
	$(PY) -m harness device-costs $(ARGS)

time-check: install warm ## the time model against measured steps: every backend x tiny_llama, small_llama, tiny_gpt2 x fp32, bf16 on 2 ranks, each part within 30% or named -> results/time_check/
	$(PY) -m harness time-check $(ARGS)

time-extrapolate: install warm ## the time model predicts runs it was not calibrated on (3 and 4 ranks, small_llama), before they run, then runs them -> results/time_model/
	$(PY) -m harness time-extrapolate $(ARGS)

published: install ## published runs at 4 to 256 GPUs (torchtitan, llm-foundry, Hugging Face) against the theory: peak, counted-work and roofline tokens/s, counted MFU -> experiments/published/
	$(PY) -m harness published $(ARGS)

advise-field: install ## the advisor's dry run on every published row: does its frontier hold what the source ran? (~2.5 min, theory only) -> experiments/published/
	$(PY) -m harness advise-field $(ARGS)

capacity: install warm ## largest model per backend under a budget: make capacity ARGS="--budget-mib 256 logger=none" -> results/capacity/
	$(PY) -m harness capacity $(ARGS)

collectives: install ## all-reduce, reduce-scatter, all-gather, broadcast: time and busbw, 1 KiB-256 MiB -> results/collectives/
	$(PY) -m harness collectives $(ARGS)

finetune: install warm ## full fine-tuning vs LoRA, every backend, from a checkpoint written here first -> results/sweeps/finetune/
	# the weights are not committed (only their index, config and pretrain.json are): write them when absent
	# into results/local/ unless SNAPSHOT=1: its record differs in the 5th digit from run to run, and the committed
	# one is the record of the committed results
	compgen -G '$(RESULTS)/finetune/checkpoint/*.safetensors' >/dev/null || \
	  $(PY) -m harness pretrain --out $(RESULTS)/finetune/checkpoint model=small_llama
	$(PY) -m harness train experiment=finetune model.pretrained_path=$(CURDIR)/$(RESULTS)/finetune/checkpoint $(ARGS)

# no install step: a GPU machine keeps its own CUDA torch (and, with no network, the wheels of the README's
# "On a GPU machine"); GPU_PYTHON is the interpreter that has them
GPU_PYTHON ?= python3
gpu-review: ## on a lent GPU, first (carry .whl/ from ../shared/tools/device-wheels.sh): every check still waiting for a GPU, in order of value, none started past --budget-s (540), each recorded as it ends and skipped once settled for this code; ARGS=--dry-run prints the queue here -> results/gpu/<device>/review.md
	PYTHONPATH=$(CURDIR):$$PYTHONPATH $(GPU_PYTHON) -m harness gpu-review $(ARGS)

gpu-check: ## on a GPU machine: every backend on gpt2_124m and llama_1b (bf16), a real CUDA OOM, checks -> results/gpu/<device>/
	PYTHONPATH=$(CURDIR):$$PYTHONPATH $(GPU_PYTHON) -m harness gpu-check $(ARGS)

gpu-capacity: ## on a GPU machine: the largest Llama (1B-38B ladder, bf16, mb 1, seq 2048, ckpt) each backend trains on the card, the theory's boundary probed first; ARGS="--backends ddp,fsdp" splits it into calls under 9 minutes -> results/gpu/<device>/capacity.md
	PYTHONPATH=$(CURDIR):$$PYTHONPATH $(GPU_PYTHON) -m harness gpu-capacity $(ARGS)

gpu-axes: ## on a GPU machine: llama_1b bf16 mb 8 under fsdp eager, compiled, compiled+float8 (tensorwise, rowwise), selective_op, every_2, ds_zero3 with and without DeepCompile, ddp compiled; at most 8 minutes -> results/gpu/<device>/axes.md
	PYTHONPATH=$(CURDIR):$$PYTHONPATH $(GPU_PYTHON) -m harness gpu-axes $(ARGS)

axes: install warm ## the axes sweep on CPU (checkpointing policy x compile x backend, small_llama, 50 steps) and its table -> results/axes/
	$(PY) -m harness train experiment=axes $(ARGS)
	$(PY) -m harness axes

faults: install warm ## fault drill: OOM, exception, NaN, kill, hang, then re-run + Ctrl-C: status and time to detect -> results/faults/
	$(PY) -m harness fault-drill $(ARGS)

browser: ## install headless Chromium (Debian's `chromium`), which the report test opens report.html in
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

docs: install ## the docs/ pages as a site in site/ (mkdocs build --strict: a broken link between pages fails it)
	$(PY) -m mkdocs build --strict --quiet

test: install warm browser ## the test suite (~4.5 min on 2 pytest-xdist workers): unit tests, in-process strategies, and every backend's real 3-rank fp32 run against DDP's losses (gloo, CPU); the other launches are make test-launches
	$(PY) -m pytest -m "not drill and not launch" -n $(JOBS) $(ARGS)

# test-launches' first test sets up the whole chain of session launches (fp32, 4 ranks, 2 ranks) inside
# pytest-timeout's bound: over 600 s on a slower 2-core machine (2026-12-02), so the bound there is 30 min
test-launches: install warm browser ## the tests that read the session's other launches (~9 min): every backend resumed, bf16, LoRA, resharding, user data, tp, cp, ep and MoE cells at 2 and 4 ranks, and the memory check's matrix
	$(PY) -m pytest -m "launch and not drill" --timeout=1800 $(ARGS)

test-drills: install warm ## the launcher drills (~40 min): faults, Ctrl-C, racing launches, killed launcher and op builds; the longest study runs
	$(PY) -m pytest -m drill $(ARGS)

test-all: test test-launches test-drills ## all three, as CI runs them

lock: ## re-pin requirements/cpu.lock from the current .venv
	{ echo "# Exact versions CI and the CPU install use (pip constraints). Regenerate with: make lock"; \
	  $(PY) -m pip freeze --exclude-editable | sed 's/+cpu$$//'; } > $(LOCK)

clean: ## remove raw run and sweep dirs (curated results/ files stay)
	rm -rf results/runs results/sweeps results/fault_drill outputs multirun
