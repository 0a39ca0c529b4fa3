"""The documentation and the release notes build cleanly.

This is how CI builds them (``.ci/run`` only runs ``make test``): Sphinx
with warnings as errors, and reno over ``releasenotes/notes``.

reno reads notes from git history, so ``reno report`` and the release-notes
page only show notes once they are committed; ``reno lint`` reads the notes
directory itself and so checks uncommitted notes too. The tests need the
checkout to be a git repository (CI's fresh clone is one).
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import fixtures
import testtools
import yaml
from dulwich.object_store import tree_lookup_path
from dulwich.repo import Repo

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.path.dirname(sys.executable)
NOTES = os.path.join(REPO, "releasenotes", "notes")
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


class SphinxTest(testtools.TestCase):
    def _build(self, source: str) -> None:
        out = self.useFixture(fixtures.TempDir()).path
        proc = _run(
            os.path.join(BIN, "sphinx-build"),
            "-W",
            "--keep-going",
            "-q",
            "-E",
            "-b",
            "html",
            source,
            out,
        )
        self.assertEqual(
            0, proc.returncode, f"sphinx-build {source}:\n{proc.stdout}{proc.stderr}"
        )
        self.assertTrue(os.path.isfile(os.path.join(out, "index.html")))

    def test_docs_build_without_warnings(self) -> None:
        self._build("doc/source")

    def test_release_notes_build_without_warnings(self) -> None:
        self._build("releasenotes/source")


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
