# The two commands of README.rst. Both install what they need first.
.PHONY: demo test deps lint bench clean

deps:
	@tools/install-deps.sh

# make demo VM=1: the same story in a real VM (qemu + OVMF + vTPM; builds
# the guest image once, ~6 min, then 3-6 min per run).
demo: deps
ifeq ($(VM),1)
	.venv/bin/python tools/demo_vm.py
else
	.venv/bin/python tools/demo.py
endif

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
