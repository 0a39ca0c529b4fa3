"""doc/source/admin/troubleshooting.rst quotes what the code prints: each
fragment of a ``**Message**:`` line must occur in a string of the product
sources (tests excluded), so that the page cannot rot.

The sources' strings are read with :mod:`ast`: adjacent literals are one
string, and the variable parts of f-strings and of ``%`` formats are
holes a fragment cannot span.
"""

from __future__ import annotations

import ast
import os
import re

import testtools

ROOT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
PAGE = os.path.join(ROOT, "doc", "source", "admin", "troubleshooting.rst")
PACKAGES = (
    "verifier",
    "node_agent",
    "nova_plugin",
    "ipsec_puppet_vault_hooks",
    "vtpm_manager",
    "attestation_dashboard",
)
_HOLE = "\x00"
_PERCENT = re.compile(r"%(?:\([a-z_]+\))?[-+ #0]*\d*(?:\.\d+)?[sdrfgx]")


def _strings(tree: ast.AST) -> list[str]:
    """Every string of a module, f-strings with holes for their values."""
    found: list[str] = []
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts = []
            for value in node.values:
                inside.add(id(value))
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    parts.append(value.value)
                else:
                    parts.append(_HOLE)
            found.append("".join(parts))
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in inside
        ):
            found.append(_PERCENT.sub(_HOLE, node.value))
    return found


def source_strings() -> list[str]:
    strings: list[str] = []
    for package in PACKAGES:
        for directory, dirs, files in os.walk(os.path.join(ROOT, package)):
            dirs[:] = [d for d in dirs if d not in ("tests", "__pycache__")]
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(directory, name)) as f:
                        strings.extend(_strings(ast.parse(f.read())))
    return strings


def page_fragments() -> dict[str, list[str]]:
    """Section title -> the fragments its ``**Message**:`` lines quote."""
    with open(PAGE) as f:
        lines = f.read().splitlines()
    sections: dict[str, list[str]] = {}
    title, quoting = "", False
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and re.fullmatch(r"=+", lines[i + 1]) and line:
            title = line
            sections.setdefault(title, [])
            continue
        if line.startswith("**Message**:"):
            quoting = True
        elif not line.strip():
            quoting = False
        if quoting:
            sections[title].extend(re.findall(r"``(.+?)``(?!`)", line))
    return sections


class TroubleshootingPageTest(testtools.TestCase):
    def test_every_section_quotes_a_message(self) -> None:
        sections = page_fragments()
        self.assertGreater(len(sections), 10)
        for title, fragments in sections.items():
            if title == "Troubleshooting":
                continue
            self.assertTrue(fragments, f"section {title!r} quotes no message")

    def test_every_quoted_fragment_is_in_the_code(self) -> None:
        strings = source_strings()
        missing = [
            (title, fragment)
            for title, fragments in page_fragments().items()
            for fragment in fragments
            if not any(fragment in s for s in strings)
        ]
        self.assertEqual([], missing)

    def test_a_fragment_that_is_not_in_the_code_is_found_missing(self) -> None:
        strings = source_strings()
        self.assertTrue(any("an EK certificate is required" in s for s in strings))
        self.assertFalse(any("an EK certificate is requested" in s for s in strings))
        # a fragment cannot span an f-string's value
        self.assertFalse(any("no TCTI module 'swtmp'" in s for s in strings))
