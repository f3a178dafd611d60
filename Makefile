# The two commands of the README: `make demo` and `make test`. Both build .venv themselves.

PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-latest bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[postgres]' --group test
	touch $(STAMP)

demo: $(STAMP)
	scripts/demo.sh

test: $(STAMP)
	scripts/run-tests.sh

# The suite on the newest Django (6.x needs Python 3.12 or later), in its own .venv-latest.
test-latest:
	scripts/test-latest.sh

bench: $(STAMP)
	scripts/run-bench.sh

clean:
	rm -rf $(VENV) .venv-latest dist build db.sqlite3 db.sqlite3-*
