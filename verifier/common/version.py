"""``--version`` for every console script: ``<prog> <version>``, exit 0.

The version is pbr's for the installed distribution (``pbr`` is a
runtime requirement of every role), as OpenStack services report it.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import metadata

__all__ = ["exit_if_asked", "version_string"]

DISTRIBUTION = "trusted-cloud"


def version_string() -> str:
    """pbr's release string of trusted-cloud ("unknown" if not installed)."""
    try:
        from pbr.version import VersionInfo

        return str(VersionInfo(DISTRIBUTION).release_string())
    except Exception:  # pbr missing or no distribution: the metadata's
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
