# Each target sets up .venv by itself: `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build this machine carries; an unpinned torch would pull gigabytes of CUDA packages.
TORCH := torch==2.13.0
# pip warns about every absent local index folder; keep the output readable.
PIP := $(BIN)/python -m pip install -q --disable-pip-version-check

.PHONY: venv demo test lint bench docs clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) $(TORCH) 2>&1 | grep -v "is ignored: it is neither" || true
	$(PIP) -e '.[dev,runtime,docs]' $(TORCH) 2>&1 | grep -v "is ignored: it is neither" || true
	$(BIN)/python -c "import torch, torchdoctor, pytest" 
	touch $@

demo: venv
	@echo "== torchdoctor check examples/ --extend-select advice  (static: finds the bugs before anything runs)"
	@$(BIN)/torchdoctor check examples/ --no-cache --extend-select advice; test $$? -le 1
	@echo
	@echo "== torchdoctor run --simulate cuda --keep-going examples/buggy/train.py  (a virtual GPU on this CPU machine)"
	@cd examples/buggy && PYTHONWARNINGS=ignore::FutureWarning \
		../../$(BIN)/torchdoctor run --simulate cuda --keep-going --no-guard train.py; test $$? -le 1

lint: venv
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

bench: venv
	$(BIN)/python benchmarks/run_all.py

# The documentation site (mkdocs + Material) into site/; pages for rules, the API and the
# explain catalogue are generated from the code by docs/gen_pages.py on every build.
docs: venv
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(BIN)/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .torchdoctor_cache .pytest_cache .mypy_cache .ruff_cache
