# `make train` and `make test` each set everything up on a fresh clone (a virtual environment in
# .venv with the CPU build of torch) and then run. On a GPU machine, put a CUDA build of torch in
# the environment first, e.g. `make TORCH="torch==2.13.0 --index-url <PyTorch's CUDA wheel index>" install`.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install train test format repro bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check $(TORCH) -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

## the main job: GPT on the default text corpus (the Python standard library's sources)
train: $(STAMP)
	$(PY) -m src.train model=gpt data=text $(ARGS)

## lint, format check and the test suite (what CI runs); it writes nothing into the clone
test: $(STAMP)
	$(PY) -m ruff check --no-cache .
	$(PY) -m ruff format --no-cache --check .
	$(PY) -m pytest $(ARGS)

format: $(STAMP)
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

## the DVC pipeline (dvc.yaml): fetch the raw data, tokenise the default corpus, train GPT,
## prepare the graph, speaker and translation datasets
repro: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/dvc repro $(ARGS)

## the benchmarks behind the README's tables (bench/dvc.yaml, hours on a CPU), after the pipeline
bench: $(STAMP)
	$(PY) -m pip install -q --disable-pip-version-check -e ".[dev,bench]"
	PATH="$(abspath $(VENV))/bin:$$PATH" $(VENV)/bin/dvc repro bench/dvc.yaml $(ARGS)

clean:
	rm -rf outputs data/processed wandb
