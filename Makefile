# Each target sets up .venv by itself: `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build this machine carries; an unpinned torch would pull gigabytes of CUDA packages.
TORCH := torch==2.13.0
# pip warns about every absent local index folder; keep the output readable.
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check

.PHONY: venv demo test lint bench fuzz docs clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) $(TORCH) 2>&1 | grep -v "is ignored: it is neither" || true
	$(PIP) -e '.[dev,runtime,docs]' $(TORCH) 2>&1 | grep -v "is ignored: it is neither" || true
	$(BIN)/python -c "import torch, torchdoctor, pytest" 
	touch $@

demo: venv
	@echo "== 1. torchdoctor check examples/buggy --extend-select advice  (static: finds the bugs before anything runs)"
	@$(BIN)/torchdoctor check examples/buggy --no-cache --extend-select advice; test $$? -eq 1
	@echo
	@echo "== 2. torchdoctor run --simulate cuda --keep-going examples/buggy/train.py  (a virtual GPU on this CPU machine)"
	@cd examples/buggy && PYTHONWARNINGS=ignore::FutureWarning \
		../../$(BIN)/torchdoctor run --simulate cuda --keep-going --no-guard train.py; test $$? -le 1
	@echo
	@echo "== 3. the same project with every mistake fixed: examples/fixed"
	@$(BIN)/torchdoctor check examples/fixed --no-cache
	@cd examples/fixed && ../../$(BIN)/torchdoctor run --simulate cuda train.py
	@echo
	@echo "demo done: examples/buggy fails the check and crashes on the virtual GPU; examples/fixed passes both."

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

bench: venv
	$(BIN)/python benchmarks/run_all.py

# The robustness campaign (tests/robustness/campaign.py): generated programs, mutated real
# files, explain inputs and checkpoint byte flips for FUZZ_SECONDS in all; failing inputs
# are saved in fuzz-failures/. `make test` runs a few seconds of it (test_campaign.py).
FUZZ_SECONDS ?= 240
fuzz: venv
	$(BIN)/python -m tests.robustness.campaign --seconds $(FUZZ_SECONDS)

# The documentation site (mkdocs + Material) into site/; pages for rules, the API and the
# explain catalogue are generated from the code by scripts/gen_docs.py on every build.
docs: venv
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .torchdoctor_cache .pytest_cache .mypy_cache .ruff_cache
