# Two commands do all set-up on a fresh machine with Python >= 3.11 and git:
#   make demo   create .venv if missing, install sleuth, run the demo on the simulated node
#   make test   same install, then run the whole test suite (every lane)
#   make test-fast  the unit and strategy tests only: no Ray, no sleuth command, no server runs,
#                   and the many-seed statistical tests on a few seeds
#   make test-stats the many-seed statistical tests alone (make test runs them too)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast test-stats lint install bench-localize bench-isolate bench-cost clean

# constraints.txt: the versions the suite was tested with (pyproject.toml's ranges are what
# sleuth accepts); every install here takes exactly those.
$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade -c constraints.txt pip

$(STAMP): $(BIN)/python pyproject.toml constraints.txt
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/sleuth demo

# pytest exits 5 when it collects nothing: that is a failure here, never a silent pass.
# Three workers (pytest-xdist) on any machine: most of an end-to-end test's time is the
# simulated node's modeled sleeps and processes starting, so three share two cores well
# (docs/reliability.md, "The test suite on a busy machine"); each worker has its own Ray.
# `worksteal` hands a finished worker tests queued on a busy one (a few take minutes).
XDIST  := -n 3 --dist worksteal
test: $(STAMP)
	$(BIN)/python -m pytest tests -q $(XDIST)

# The end-to-end tests (marker `e2e`: Ray, the sleuth command, real server runs) and the
# many-seed statistical tests (marker `stats`; their few-seed versions stay) left out.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests -q -m "not e2e and not stats" -n 2

test-stats: $(STAMP)
	$(BIN)/python -m pytest tests -q -m stats -n 2

# ruff, then the layers contract (pyproject.toml [tool.importlinter], docs/design.md)
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench-localize: $(STAMP)
	$(BIN)/python -m experiments.bench_localize

bench-cost: $(STAMP)
	$(BIN)/python -m experiments.bench_cost

bench-isolate: $(STAMP)
	$(BIN)/python experiments/bench_isolate.py
	$(BIN)/python experiments/bench_isolate.py --system

clean:
	rm -rf $(VENV) build *.egg-info
