"""One exception tree per shipped package (STYLE rule 3, issue 27).

Every module of the shipped packages is imported, then every exception
class they define is checked: it derives from its package's root, its
name ends in ``Error``, and no other exception class of the project has
the same name. The protocol core and the shared plumbing are packages of
their own here, with their own roots; the rest of ``verifier`` is under
:class:`verifier.exceptions.VerifierError`.

A class may also extend a base from outside our tree (the standard
library's, a third party's, another package of ours) only when that base
is listed for it in :data:`EXTRA_BASES`, with the reason.
"""

from __future__ import annotations

import importlib
import pkgutil
import ssl
from collections.abc import Iterator

import testtools

from attestation_dashboard.exceptions import DashboardError
from ipsec_puppet_vault_hooks.exceptions import HooksError
from node_agent.exceptions import NodeAgentError
from nova_plugin.exceptions import TenantError
from verifier.common.errors import CommonError, RequestError
from verifier.exceptions import VerifierError
from verifier.protocol.errors import ProtocolError
from vtpm_manager.exceptions import VtpmError

#: Package prefix -> its root; the longest matching prefix wins.
ROOTS: dict[str, type[Exception]] = {
    "verifier": VerifierError,
    "verifier.protocol": ProtocolError,
    "verifier.common": CommonError,
    "node_agent": NodeAgentError,
    "nova_plugin": TenantError,
    "ipsec_puppet_vault_hooks": HooksError,
    "vtpm_manager": VtpmError,
    "attestation_dashboard": DashboardError,
}

#: Modules that are not imported: alembic runs this one as a script (it
#: opens a migration context at import time).
NOT_IMPORTED = frozenset({"verifier.db.migrations.env"})

#: Class -> the bases from outside its package's tree it may also extend.
EXTRA_BASES: dict[str, tuple[type[BaseException], ...]] = {
    # a wrong pinned certificate fails the connection like any other TLS
    # failure: the connection code raises and handles it as an OSError
    "verifier.common.tls.PinMismatchError": (ssl.SSLError,),
    # verifier-side refusals answered with the shared JSON error body
    "verifier.attest.monitor.MonitorUnavailableError": (RequestError,),
    "verifier.attest.quotas.QuotaExceededError": (RequestError,),
}


#: Always fine in a class's ancestry.
_BUILTIN_TOP = (BaseException, Exception, object)


def _is_test_module(name: str) -> bool:
    return ".tests." in name + "."


def _module_names(package: str) -> Iterator[str]:
    """``package`` and every module below it, tests left out."""
    yield package
    module = importlib.import_module(package)
    for info in pkgutil.iter_modules(module.__path__, package + "."):
        if _is_test_module(info.name) or info.name in NOT_IMPORTED:
            continue
        if info.ispkg:
            yield from _module_names(info.name)
        else:
            yield info.name


def _all_subclasses(cls: type[BaseException]) -> Iterator[type[BaseException]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def _package_of(module: str) -> str | None:
    """The longest :data:`ROOTS` prefix that ``module`` is under."""
    matches = [p for p in ROOTS if module == p or module.startswith(p + ".")]
    return max(matches, key=len) if matches else None


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _shipped_exceptions() -> list[type[BaseException]]:
    """Every exception class defined in a shipped module (all imported)."""
    # the dashboard's views import Horizon, which needs Django set up
    importlib.import_module("attestation_dashboard.tests.unit")
    for top in ("verifier", *(p for p in ROOTS if "." not in p)):
        for name in _module_names(top):
            importlib.import_module(name)
    found = {
        cls
        for cls in _all_subclasses(BaseException)
        if _package_of(cls.__module__) is not None
        and not _is_test_module(cls.__module__)
    }
    return sorted(found, key=_qualname)


class ExceptionRootsTest(testtools.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        cls.classes = _shipped_exceptions()

    def test_every_package_is_walked(self) -> None:
        # a walk that finds nothing would make every check below pass
        modules = {c.__module__ for c in self.classes}
        for prefix in ROOTS:
            self.assertTrue(
                any(_package_of(m) == prefix for m in modules),
                f"no exception class found under {prefix}",
            )
        self.assertGreater(len(self.classes), 50)

    def test_every_exception_derives_from_its_package_root(self) -> None:
        offenders = set()
        for cls in self.classes:
            package = _package_of(cls.__module__)
            assert package is not None
            if not issubclass(cls, ROOTS[package]):
                offenders.add(_qualname(cls))
        unexpected = sorted(offenders)
        self.assertEqual(
            [],
            unexpected,
            "not under their package's root: "
            + ", ".join(
                f"{name} (root {ROOTS[_package_of(name) or ''].__name__})"
                for name in unexpected
            ),
        )

    def test_extra_bases_are_listed(self) -> None:
        unlisted = []
        for cls in self.classes:
            package = _package_of(cls.__module__)
            assert package is not None
            root = ROOTS[package]
            if not issubclass(cls, root):
                continue  # reported by the test above
            allowed: list[type[BaseException]] = []
            for ancestor in cls.__mro__:
                allowed.extend(EXTRA_BASES.get(_qualname(ancestor), ()))
            for ancestor in cls.__mro__:
                if ancestor in _BUILTIN_TOP or (
                    isinstance(ancestor, type) and issubclass(ancestor, root)
                ):
                    continue
                if not any(issubclass(extra, ancestor) for extra in allowed):
                    unlisted.append(f"{_qualname(cls)} extends {_qualname(ancestor)}")
        self.assertEqual([], unlisted)

    def test_extra_bases_name_existing_classes(self) -> None:
        names = {_qualname(c) for c in self.classes}
        self.assertEqual([], sorted(set(EXTRA_BASES) - names))

    def test_names_end_in_error(self) -> None:
        bad = [_qualname(c) for c in self.classes if not c.__name__.endswith("Error")]
        self.assertEqual([], bad)

    def test_no_two_exception_classes_share_a_name(self) -> None:
        by_name: dict[str, list[str]] = {}
        for cls in self.classes:
            by_name.setdefault(cls.__name__.lstrip("_"), []).append(_qualname(cls))
        shared = {name: where for name, where in by_name.items() if len(where) > 1}
        self.assertEqual({}, shared)
