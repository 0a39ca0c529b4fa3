"""The documentation and the release notes build cleanly.

This is how CI builds them (``.ci/run`` only runs ``make test``): Sphinx
with warnings as errors, and reno over ``releasenotes/notes``.

The documentation is built twice: in the project's venv (every extra) and
in a venv with only the ``client`` extra and ``doc/requirements.txt``, as a
reader building the docs from a checkout would (the server modules the
generated option and policy pages import are mocked in ``conf.py``). That
venv is made with ``python3 -m venv`` and pip's own configuration (the
package index ``make deps`` uses) and kept under
``~/.cache/trusted-cloud/docs-venvs/``, keyed by the interpreter, the
wheel's requirements and ``doc/requirements.txt``: a rerun reinstalls only
the project, a change of requirements makes a fresh venv.

reno reads notes from git history, so ``reno report`` and the release-notes
page only show notes once they are committed; ``reno lint`` reads the notes
directory itself and so checks uncommitted notes too. The tests need the
checkout to be a git repository (CI's fresh clone is one).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from typing import IO

import fixtures
import testtools
import yaml
from dulwich.object_store import tree_lookup_path
from dulwich.repo import Repo

from verifier.policies import list_rules
from verifier.tests.functional.test_install_roles import built_wheel, wheel_requirements

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.path.dirname(sys.executable)
NOTES = os.path.join(REPO, "releasenotes", "notes")
DOC_REQUIREMENTS = os.path.join(REPO, "doc", "requirements.txt")
DOCS_VENVS = os.path.join(
    os.path.expanduser("~"), ".cache", "trusted-cloud", "docs-venvs"
)
#: Modules of the server extras that a client-only venv must not have (or
#: the build in it would prove nothing about the mocks).
SERVER_ONLY = (
    "sqlalchemy",
    "alembic",
    "uvloop",
    "prometheus_client",
    "keystonemiddleware",
)
# reno's default sections, plus the prelude.
SECTIONS = {
    "prelude",
    "features",
    "issues",
    "upgrade",
    "deprecations",
    "critical",
    "security",
    "fixes",
    "other",
}


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )


def _sphinx_build(sphinx_build: str, source: str, out: str) -> None:
    proc = _run(
        sphinx_build, "-W", "--keep-going", "-q", "-E", "-b", "html", source, out
    )
    if proc.returncode != 0:
        raise AssertionError(f"{sphinx_build} {source}:\n{proc.stdout}{proc.stderr}")
    if not os.path.isfile(os.path.join(out, "index.html")):
        raise AssertionError(f"{sphinx_build} {source}: no index.html in {out}")


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return re.sub(r"<[^>]+>", " ", f.read())


def assert_generated_pages(case: testtools.TestCase, out: str) -> None:
    """The policy page lists every rule of the code, and the option
    reference names no mock object in place of a real default."""
    policy = _text(os.path.join(out, "admin", "policy.html"))
    names = [rule.name for rule in list_rules()]
    case.assertEqual([], [n for n in names if n not in policy])
    options = _text(os.path.join(out, "admin-guide.html"))
    case.assertIn("quote_interval", options)
    case.assertNotIn("_MockObject", options)
    case.assertNotIn("_MockModule", options)


class SphinxTest(testtools.TestCase):
    def _build(self, source: str) -> str:
        out = self.useFixture(fixtures.TempDir()).path
        _sphinx_build(os.path.join(BIN, "sphinx-build"), source, out)
        return out

    def test_docs_build_without_warnings(self) -> None:
        assert_generated_pages(self, self._build("doc/source"))

    def test_release_notes_build_without_warnings(self) -> None:
        self._build("releasenotes/source")


class DocsVenv:
    """A venv with the wheel and its ``client`` extra, and
    ``doc/requirements.txt`` (see the module doc). Holds an exclusive lock
    on the cache until :meth:`close`."""

    def __init__(self, wheel: str) -> None:
        os.makedirs(DOCS_VENVS, exist_ok=True)
        self._lock: IO[str] = open(os.path.join(DOCS_VENVS, "lock"), "w")  # noqa: SIM115
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        with open(DOC_REQUIREMENTS, encoding="utf-8") as f:
            doc_requirements = f.read()
        key = hashlib.sha256(
            json.dumps(
                [sys.version, wheel_requirements(wheel), doc_requirements]
            ).encode()
        ).hexdigest()[:16]
        self.path = os.path.join(DOCS_VENVS, f"client-{key}")
        if os.path.exists(os.path.join(self.path, ".complete")):
            self.pip("install", "--force-reinstall", "--no-deps", wheel)
        else:
            for name in os.listdir(DOCS_VENVS):  # older requirements
                if name.startswith("client-"):
                    shutil.rmtree(os.path.join(DOCS_VENVS, name), ignore_errors=True)
            self._check(sys.executable, "-m", "venv", self.path)
            self.pip("install", "--upgrade", "pip")
        self.pip("install", f"{wheel}[client]", "-r", DOC_REQUIREMENTS)
        self.pip("check")
        open(os.path.join(self.path, ".complete"), "w").close()  # noqa: SIM115

    def bin(self, name: str) -> str:
        return os.path.join(self.path, "bin", name)

    def pip(self, *args: str) -> None:
        self._check(self.bin("python"), "-m", "pip", "-q", *args)

    @staticmethod
    def _check(*argv: str) -> None:
        proc = _run(*argv)
        if proc.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}:\n{proc.stderr[-3000:]}")

    def close(self) -> None:
        self._lock.close()


class ClientOnlySphinxTest(testtools.TestCase):
    """``sphinx-build -W`` with only the ``client`` extra and the docs
    requirements installed (issue 33)."""

    venv: DocsVenv

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        wheel, _ = built_wheel()
        cls.venv = DocsVenv(wheel)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.venv.close()
        super().tearDownClass()

    def test_the_venv_has_no_server_module(self) -> None:
        code = (
            "import importlib.util as u, sys; "
            "print([m for m in sys.argv[1:] if u.find_spec(m)])"
        )
        proc = _run(self.venv.bin("python"), "-c", code, *SERVER_ONLY)
        self.assertEqual(0, proc.returncode, proc.stderr)
        self.assertEqual("[]", proc.stdout.strip())

    def test_docs_build_without_warnings(self) -> None:
        out = self.useFixture(fixtures.TempDir()).path
        _sphinx_build(self.venv.bin("sphinx-build"), "doc/source", out)
        assert_generated_pages(self, out)


class RenoTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        self.notes = sorted(glob.glob(os.path.join(NOTES, "*.yaml")))
        self.assertNotEqual([], self.notes, "no release notes")

    def test_reno_lint(self) -> None:
        proc = _run(os.path.join(BIN, "reno"), "lint")
        self.assertEqual(0, proc.returncode, proc.stdout + proc.stderr)

    def test_notes_are_yaml_with_known_sections(self) -> None:
        for path in self.notes:
            with open(path) as f:
                note = yaml.safe_load(f)
            self.assertIsInstance(note, dict, path)
            self.assertEqual(set(), set(note) - SECTIONS, path)
            for section, value in note.items():
                if section == "prelude":
                    self.assertIsInstance(value, str, path)
                else:
                    self.assertIsInstance(value, list, f"{path}: {section}")
                    for item in value:
                        self.assertIsInstance(item, str, f"{path}: {section}")

    def test_reno_report_shows_the_committed_notes(self) -> None:
        proc = _run(os.path.join(BIN, "reno"), "report")
        self.assertEqual(0, proc.returncode, proc.stderr)
        repo = Repo(REPO)
        self.addCleanup(repo.close)
        tree = repo[repo.head()].tree
        for path in self.notes:
            rel = os.path.relpath(path, REPO).encode()
            try:
                tree_lookup_path(repo.__getitem__, tree, rel)
            except KeyError:
                continue  # not committed yet: reno cannot see it
            with open(path) as f:
                note = yaml.safe_load(f)
            first = note.get("prelude") or next(iter(note.get("features", [])), "")
            # compared word by word: the report may wrap lines differently
            words = " ".join(first.split()[:8])
            self.assertIn(words, " ".join(proc.stdout.split()), path)
