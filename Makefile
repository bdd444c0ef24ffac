# Every target installs what it needs from a clean clone.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install test up down status bench lint proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

install: $(STAMP)

test: install
	$(PY) -m pytest

up: install
	$(VENV)/bin/candlewire up

down:
	@if [ -x $(VENV)/bin/candlewire ]; then $(VENV)/bin/candlewire down; fi

status: install
	$(VENV)/bin/candlewire status

bench: install
	$(PY) -m bench.relay

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

proto: install
	$(PY) -m proto.generate

clean: down
	rm -rf $(VENV) .candlewire
