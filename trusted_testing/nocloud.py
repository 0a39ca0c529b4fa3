"""A NoCloud seed for cloud-init: an ISO 9660 volume labelled ``cidata``
holding ``user-data``, ``meta-data`` and optionally ``vendor-data``."""

from __future__ import annotations

import os
import subprocess
import tempfile

__all__ = ["SeedError", "make_seed"]


class SeedError(Exception):
    """xorriso is missing or failed."""


def make_seed(
    path: str,
    user_data: str | bytes,
    meta_data: str,
    vendor_data: str | None = None,
) -> None:
    """Write a NoCloud seed: an ISO 9660 volume labelled ``cidata``.

    Args:
        path: The ISO file to create.
        user_data: The user-data (a cloud-config, or a MIME multipart).
        meta_data: The meta-data (YAML: ``instance-id``, ``local-hostname``).
        vendor_data: The vendor-data, if any (the cloud provider's part).

    Raises:
        SeedError: If xorriso is missing or fails.
    """
    with tempfile.TemporaryDirectory(prefix="seed-") as tree:
        files = [("user-data", user_data), ("meta-data", meta_data)]
        if vendor_data is not None:
            files.append(("vendor-data", vendor_data))
        for name, text in files:
            with open(os.path.join(tree, name), "wb") as handle:
                handle.write(text.encode() if isinstance(text, str) else text)
        argv = ["xorriso", "-as", "mkisofs", "-quiet", "-o", path]
        argv += ["-volid", "cidata", "-joliet", "-rock", tree]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
        except FileNotFoundError as exc:
            raise SeedError(
                "xorriso is missing: install the Debian package xorriso"
            ) from exc
        if done.returncode:
            raise SeedError(f"xorriso failed ({done.returncode}): {done.stderr[-500:]}")
