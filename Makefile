# Two commands on a fresh machine: `make demo` (the whole DAG on the embedded demo) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch is enough for the demo and the tests; GPU nodes install their own (see README).
TORCH_SPEC ?= torch==2.13.0
CORES ?= all

.PHONY: setup demo demo-fp8 test lint clean

$(BIN)/activate:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --cores $(CORES)
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --report results/report.html
	@echo "done: see results/ (report: results/report.html)"

demo-fp8: demo
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --cores $(CORES) --configfile configs/demo-fp8.yaml
	@echo "done: results/fp8/bench/summary.md shows tau with fp8 storage next to bf16"

test: setup
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/python -m pytest -q tests

lint: setup
	$(BIN)/ruff check draftsmith scripts tests
	$(BIN)/snakefmt --check Snakefile workflow
	PATH=$(CURDIR)/$(BIN):$$PATH $(BIN)/snakemake --lint

clean:
	rm -rf results .snakemake
