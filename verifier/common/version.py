"""``--version`` for every console script: ``<prog> <version>``, exit 0.

The version is the installed distribution's (pbr writes it into the
package metadata from git at build time), read with the standard library
so that every install role has it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import metadata

__all__ = ["exit_if_asked", "version_string"]

DISTRIBUTION = "trusted-cloud"


def version_string() -> str:
    """The installed version of trusted-cloud ("unknown" if not installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def exit_if_asked(argv: Sequence[str] | None, prog: str) -> None:
    """Print ``prog version`` and exit 0 when the command line is exactly
    ``--version`` (a subcommand's own ``--version`` option is left alone)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if args == ["--version"]:
        print(f"{prog} {version_string()}")
        raise SystemExit(0)
