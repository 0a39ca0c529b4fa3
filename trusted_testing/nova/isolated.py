"""Run a test module in a Python process of its own and report each test.

Nova's functional fixtures decide at import time between eventlet
monkey-patching and native threads, and refuse native threads once anything
imported eventlet (futurist, used by oslo.messaging and tooz, does when it
is installed). A stestr worker imports every test module, so Nova-backed
cases live in a module stestr does not discover and run here, in a fresh
interpreter with ``OS_NOVA_DISABLE_EVENTLET_PATCHING=1``; each case is
reported back as one test of the wrapper class.

Child side: ``python -m trusted_testing.nova.isolated MODULE OUT``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import traceback
import unittest
from typing import Any

import testtools


def case_names(path: str) -> list[str]:
    """``Class.test_x`` of every test method in the file (without import)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    return [
        f"{node.name}.{item.name}"
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        for item in node.body
        if isinstance(item, ast.FunctionDef) and item.name.startswith("test_")
    ]


class _Recorder(unittest.TestResult):
    def __init__(self) -> None:
        super().__init__()
        self.outcomes: dict[str, dict[str, str]] = {}

    def _key(self, test: Any) -> str:
        return ".".join(test.id().split(".")[-2:])

    def addSuccess(self, test: Any) -> None:
        self.outcomes[self._key(test)] = {"status": "ok", "details": ""}

    def addError(self, test: Any, err: Any) -> None:
        self.outcomes[self._key(test)] = {
            "status": "error",
            "details": "".join(traceback.format_exception(*err)),
        }

    addFailure = addError  # noqa: N815  (unittest.TestResult API)

    def addSkip(self, test: Any, reason: str) -> None:
        self.outcomes[self._key(test)] = {"status": "skip", "details": reason}


def run_isolated(module: str, timeout: float) -> tuple[dict[str, Any], str]:
    """Run ``module`` in a child interpreter; (outcomes, its output)."""
    import tempfile

    env = dict(os.environ, OS_NOVA_DISABLE_EVENTLET_PATCHING="1")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "outcomes.json")
        proc = subprocess.run(
            [sys.executable, "-m", __name__, module, out],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        log = (proc.stdout + proc.stderr)[-20000:]
        try:
            with open(out, encoding="utf-8") as f:
                return json.load(f), log
        except (OSError, ValueError):
            return {}, log


def wrapper(module: str, path: str, timeout: float = 1200.0) -> type:
    """A TestCase class with one test per case of ``module``; the module
    runs once, in a child process, when the class is set up."""

    class Isolated(testtools.TestCase):
        outcomes: dict[str, Any] = {}
        log = ""

        @classmethod
        def setUpClass(cls) -> None:
            super().setUpClass()
            cls.outcomes, cls.log = run_isolated(module, timeout)

    def make(name: str) -> Any:
        def test(self: Any) -> None:
            outcome = self.outcomes.get(name)
            if outcome is None:
                self.fail(f"{name} did not run; the child process said:\n{self.log}")
            self.assertEqual("ok", outcome["status"], outcome["details"])

        return test

    for name in case_names(path):
        setattr(Isolated, name.split(".")[-1], make(name))
    return Isolated


def _main(module: str, out: str) -> int:
    suite = unittest.defaultTestLoader.loadTestsFromName(module)
    result = _Recorder()
    suite.run(result)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(result.outcomes, f)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1], sys.argv[2]))
