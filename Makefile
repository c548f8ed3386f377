# The two commands of the README, plus a few conveniences.
.PHONY: start test lint bench

start:  ## set up and start the console on 127.0.0.1:8000 (embedded defaults)
	bash scripts/start.sh

test:   ## set up, then ruff, mypy and pytest
	bash scripts/test.sh

lint:
	.venv/bin/ruff format --check . && .venv/bin/ruff check . && .venv/bin/mypy .

bench:
	.venv/bin/python bench/sandbox_lifecycle.py
