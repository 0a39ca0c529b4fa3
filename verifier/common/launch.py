"""The console scripts' entry points: each checks its role's extra before
its command is imported.

Every console script is installed in every role (one distribution, one
extra per role: ``setup.cfg``). A script of another role must say in one
line which extra it needs, not die in a traceback on the first import of a
module that extra brings (``No module named 'sqlalchemy'``). Each entry
point here looks for the modules of its role's extra
(:data:`verifier.common.extras.ROLE_MODULES`) without importing any, then
imports its command module by name, as an entry point names it, and runs
its ``main``. A missing one ends the script with one line (here folded)::

    trusted-verifier: needs the 'server' extra:
    pip install 'trusted-cloud[server]' (missing module sqlalchemy)

on stderr and exit status 2 (:data:`EXIT_MISSING_EXTRA`), whatever the
arguments (``--version`` and ``--help`` included).

This module imports nothing outside the standard library but
:mod:`verifier.common.extras`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable

from verifier.common import extras

__all__ = [
    "EXIT_MISSING_EXTRA",
    "SCRIPTS",
    "launch",
    "missing_module",
]

#: The exit status of a script whose role's extra is not installed (a
#: configuration error, as the services' ``configuration error: ...``).
EXIT_MISSING_EXTRA = 2

#: Console script -> (the module whose ``main`` it runs, the role extra it
#: needs; None: the base install runs it, in every role).
SCRIPTS: dict[str, tuple[str, str | None]] = {
    "trusted-registrar": ("verifier.cmd.registrar", "server"),
    "trusted-verifier": ("verifier.cmd.verifier", "server"),
    "trusted-keyservice": ("verifier.cmd.keyservice", "server"),
    "trusted-nova-listener": ("verifier.cmd.nova_listener", "server"),
    "trusted-certs": ("verifier.cmd.certs", None),
    "trusted-ima-policy": ("verifier.cmd.ima_policy", None),
    "trusted-agent": ("node_agent.cmd", "agent"),
    "trusted-trial": ("node_agent.trial.cli", "agent"),
    "trusted-tenant": ("nova_plugin.cmd", "client"),
    "trusted-nova": ("nova_plugin.nova_cmd", "client"),
    "trusted-revocation-listener": ("ipsec_puppet_vault_hooks.cmd.listener", "hooks"),
    "trusted-puppet-autosign": ("ipsec_puppet_vault_hooks.autosign", "hooks"),
    "trusted-vtpm-manager": ("vtpm_manager.cmd", "vtpm"),
}


def missing_module(role: str) -> str | None:
    """The first module of ``role``'s extra that is not installed (found
    without importing it), or None.

    Args:
        role: a key of :data:`verifier.common.extras.ROLE_MODULES`.
    """
    for module in extras.ROLE_MODULES[role]:
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a broken or half-removed install
            spec = None
        if spec is None:
            return module
    return None


def launch(script: str, argv: list[str] | None = None) -> int:
    """Run ``script``'s command if its role's extra is installed.

    Args:
        script: a key of :data:`SCRIPTS`.
        argv: the arguments (None: ``sys.argv[1:]``).

    Returns:
        The command's exit status, or :data:`EXIT_MISSING_EXTRA` after the
        one line on stderr naming the extra.
    """
    module, role = SCRIPTS[script]
    if role is not None:
        absent = missing_module(role)
        if absent is not None:
            print(
                f"{script}: needs the '{role}' extra: "
                f"pip install '{extras.DIST}[{role}]' (missing module {absent})",
                file=sys.stderr,
            )
            return EXIT_MISSING_EXTRA
    main: Callable[[list[str] | None], int] = importlib.import_module(module).main
    return main(argv)


# One function per console script (setup.cfg [entry_points] console_scripts).
def trusted_registrar() -> int:
    return launch("trusted-registrar")


def trusted_verifier() -> int:
    return launch("trusted-verifier")


def trusted_keyservice() -> int:
    return launch("trusted-keyservice")


def trusted_nova_listener() -> int:
    return launch("trusted-nova-listener")


def trusted_certs() -> int:
    return launch("trusted-certs")


def trusted_ima_policy() -> int:
    return launch("trusted-ima-policy")


def trusted_agent() -> int:
    return launch("trusted-agent")


def trusted_trial() -> int:
    return launch("trusted-trial")


def trusted_tenant() -> int:
    return launch("trusted-tenant")


def trusted_nova() -> int:
    return launch("trusted-nova")


def trusted_revocation_listener() -> int:
    return launch("trusted-revocation-listener")


def trusted_puppet_autosign() -> int:
    return launch("trusted-puppet-autosign")


def trusted_vtpm_manager() -> int:
    return launch("trusted-vtpm-manager")
