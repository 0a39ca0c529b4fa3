"""Driving ``trusted-nova`` in-process from the Nova-backed tests."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping

from nova_plugin import nova_cmd


def tenant_argv(
    env: Mapping[str, str], endpoint: str, verifier: str | None = None
) -> list[str]:
    """The tenant's services and credentials (``LocalCluster.tenant_env``)
    and a Nova API reached without Keystone."""
    return [
        "--registrar",
        env["TRUSTED_REGISTRAR_URL"],
        "--verifier",
        verifier or env["TRUSTED_VERIFIER_URL"],
        "--cert",
        env["TRUSTED_CERT"],
        "--key",
        env["TRUSTED_KEY"],
        "--ca",
        env["TRUSTED_CA"],
        "--os-auth-type",
        "none",
        "--os-endpoint",
        endpoint,
    ]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """Run ``trusted-nova`` with ``argv``: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = nova_cmd.main(argv)
    return code, out.getvalue(), err.getvalue()
