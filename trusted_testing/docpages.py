"""Commands taken from the documentation's pages, for the tests that run a
page as written (so the page cannot rot)."""

from __future__ import annotations

import os
import re

__all__ = ["DOC", "bash_blocks", "named_block"]

#: doc/source of this checkout
DOC = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "doc", "source"
)


def named_block(page: str, name: str) -> list[str]:
    """The command lines of ``page``'s ``.. code-block:: console`` with
    ``:name: name`` (``page`` relative to doc/source)."""
    path = os.path.join(DOC, page)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found = re.search(
        rf"\.\. code-block:: console\n   :name: {re.escape(name)}\n\n"
        r"((?:    .*\n|\n)+)",
        text,
    )
    if found is None:
        raise AssertionError(f"{path}: no code block named {name}")
    return [line[4:] for line in found.group(1).splitlines() if line.strip()]


def bash_blocks(text: str) -> list[str]:
    """The ``.. code-block:: bash`` blocks of a page's ``text``, dedented,
    in order."""
    blocks: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() != ".. code-block:: bash":
            i += 1
            continue
        indent = len(lines[i]) - len(lines[i].lstrip()) + 3
        i += 1
        body: list[str] = []
        while i < len(lines) and (
            not lines[i].strip() or lines[i].startswith(" " * indent)
        ):
            body.append(lines[i][indent:])
            i += 1
        blocks.append("\n".join(body).strip("\n"))
    return blocks
