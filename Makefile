# The two commands of README.rst. Both install what they need first.
.PHONY: demo test deps lint bench clean

deps:
	@tools/install-deps.sh

demo: deps
	.venv/bin/python tools/demo.py

test: deps
	tools/run-tests.sh

lint: deps
	.venv/bin/ruff check .
	.venv/bin/mypy

bench: deps
	.venv/bin/python tools/bench/quote_verify.py
	.venv/bin/python tools/bench/bootstrap.py
	.venv/bin/python tools/bench/rekey.py
	.venv/bin/python tools/bench/blocks.py
	.venv/bin/python tools/bench/capability.py

clean:
	rm -rf .demo .stestr
