"""Runtime policies from Debian packages (``trusted-tenant policy generate
runtime --deb FILE... | --apt-repo DIR|URL --keyring FILE ...``).

What installing a package makes root read or run on the node, under
``ima_policy=tcb``, and how the policy admits it:

by digest (:func:`package_allowlist`)
    every regular file of the package's data archive at its installed path
    (also under ``/usr`` for one shipped in ``/bin``, ``/sbin``, ``/lib*``:
    on a merged-/usr system those are symbolic links and IMA records the
    resolved path); its maintainer scripts and the control files dpkg keeps
    in ``/var/lib/dpkg/info/PKG[:ARCH].*`` and unpacks first in
    ``/var/lib/dpkg/tmp.ci/``; each conffile at ``<conffile>.dpkg-new``
    and ``.dpkg-dist`` (where dpkg puts the new version before it decides);
    the downloaded ``.deb`` in ``/var/cache/apt/archives`` (apt names it
    ``NAME_VERSION_ARCH.deb``, an epoch's ``:`` written ``%3a``).

by narrow named rules (:data:`RULES`)
    the data files apt and dpkg regenerate (their content depends on the
    whole node, not on one package): each rule is a list of excludes
    anchored at both ends that name data files, never a directory where a
    program could be put.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from nova_plugin.aptindex import (
    IndexEntry,
    installed_set,
    load_index,
    load_release,
    select,
    select_installed,
)
from nova_plugin.aptrepo import Repository, read_local
from nova_plugin.debs import DebPackage, Limits, read_deb
from nova_plugin.exceptions import PackageError, UsageError

__all__ = [
    "DEFAULT_RULES",
    "RULES",
    "Rule",
    "add_package_arguments",
    "extra_files",
    "from_debs",
    "from_repository",
    "package_allowlist",
    "rule_digests",
    "rule_excludes",
]

#: Directories that are symbolic links into /usr on a merged-/usr system.
MERGED_USR = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
APT_ARCHIVES = "/var/cache/apt/archives"
DPKG_INFO = "/var/lib/dpkg/info"
DPKG_TMP_CI = "/var/lib/dpkg/tmp.ci"


@dataclasses.dataclass(frozen=True)
class Rule:
    """A named set of excludes (and fixed digests) for what apt and dpkg
    regenerate.

    Attributes:
        name: its name on the command line (``--rules``).
        lets_through: what it admits unchecked, for the docs and ``--help``.
        excludes: the excludes, given the packages of the policy.
        digests: (path, SHA-256) pairs it admits: files of known content.
        default: whether ``--rules`` takes it by default.
    """

    name: str
    lets_through: str
    excludes: Callable[[Sequence[DebPackage]], list[str]]
    digests: tuple[tuple[str, bytes], ...] = ()
    default: bool = True


_EMPTY = hashlib.sha256(b"").digest()
#: The random suffix of a temporary file apt makes (mkstemp's XXXXXX).
_TEMP = r"\.[A-Za-z0-9]{6}"


def _alternatives(names: Iterable[str]) -> str:
    return "|".join(re.escape(n) for n in sorted(set(names)))


def _dpkg_db(packages: Sequence[DebPackage]) -> list[str]:
    out = [r"^/var/lib/dpkg/status$"]
    if packages:
        names = _alternatives(p.dpkg_name for p in packages)
        out.append(rf"^/var/lib/dpkg/info/({names})\.list$")
    return out


def _dpkg_extra(packages: Sequence[DebPackage]) -> list[str]:
    out = [
        r"^/var/lib/dpkg/(available|diversions|statoverride)$",
        r"^/var/lib/dpkg/(arch|cmethopt)$",
        r"^/var/lib/dpkg/updates/[0-9]{4}$",
        r"^/var/lib/dpkg/triggers/(File|Unincorp)$",
    ]
    interests = [i for p in packages for i in p.trigger_interests]
    if interests:
        out.append(rf"^/var/lib/dpkg/triggers/({_alternatives(interests)})$")
    return out


def _apt_lists(_: Sequence[DebPackage]) -> list[str]:
    partial = r"/var/(lib/apt/lists|cache/apt/archives)/partial"
    return [
        r"^/var/lib/apt/lists/(partial/)?[^/]+_(InRelease|Release|Release\.gpg)$",
        r"^/var/lib/apt/lists/[^/]+_(Packages|Translation-[A-Za-z_]+)$",
        rf"^{partial}/\.apt-acquire-privs-test{_TEMP}$",
        rf"^/var/cache/apt/(pkgcache|srcpkgcache)\.bin({_TEMP})?$",
        rf"^/var/lib/apt/extended_states({_TEMP})?$",
    ]


RULES: dict[str, Rule] = {
    rule.name: rule
    for rule in (
        Rule(
            "ld-cache",
            "/etc/ld.so.cache and /var/cache/ldconfig/aux-cache, which "
            "ldconfig (libc-bin's trigger) rewrites",
            lambda _: [r"^/etc/ld\.so\.cache$", r"^/var/cache/ldconfig/aux-cache$"],
        ),
        Rule(
            "dpkg-db",
            "dpkg's /var/lib/dpkg/status, and /var/lib/dpkg/info/PKG.list "
            "(PKG:ARCH.list) of each package of the policy",
            _dpkg_db,
        ),
        Rule(
            "apt-lists",
            "apt's indexes /var/lib/apt/lists/HOST_..._InRelease, _Release, "
            "_Release.gpg (also in lists/partial), _Packages and "
            "_Translation-LANG; its caches /var/cache/apt/pkgcache.bin and "
            "srcpkgcache.bin and /var/lib/apt/extended_states (each also as "
            "a temporary NAME.XXXXXX); its probe files "
            "partial/.apt-acquire-privs-test.XXXXXX in lists and archives; "
            "/var/lib/apt/lists/lock by digest (empty)",
            _apt_lists,
            digests=(("/var/lib/apt/lists/lock", _EMPTY),),
        ),
        Rule(
            "debconf",
            "debconf's databases /var/cache/debconf/config.dat and templates.dat",
            lambda _: [r"^/var/cache/debconf/(config|templates)\.dat$"],
        ),
        Rule(
            "packagekit",
            "PackageKit's /var/lib/PackageKit/transactions.db and its "
            "-journal (its apt hook wakes it after each apt run)",
            lambda _: [r"^/var/lib/PackageKit/transactions\.db(-journal)?$"],
        ),
        Rule(
            "dpkg-extra",
            "the rest of dpkg's database, for packages that divert files, "
            "override modes or add architectures: available, diversions, "
            "statoverride, arch, cmethopt, the journal updates/NNNN, "
            "triggers/File and Unincorp, and triggers/NAME for each trigger "
            "the packages are interested in",
            _dpkg_extra,
            default=False,
        ),
        Rule(
            "initramfs",
            "/boot/initrd.img-VERSION, which update-initramfs rewrites",
            lambda _: [r"^/boot/initrd\.img-[^/]+$"],
            default=False,
        ),
    )
}
#: The rules ``--rules`` defaults to: what an ``apt-get install`` and
#: ``apt-get upgrade`` of ordinary packages made root read in a Debian 12
#: guest under ``ima_policy=tcb``.
DEFAULT_RULES = tuple(name for name, rule in RULES.items() if rule.default)


def _rules(names: Iterable[str]) -> list[Rule]:
    rules = []
    for name in names:
        rule = RULES.get(name)
        if rule is None:
            known = ", ".join(RULES)
            raise UsageError(f"--rules: unknown rule {name!r} (known: {known})")
        rules.append(rule)
    return rules


def rule_excludes(names: Iterable[str], packages: Sequence[DebPackage]) -> list[str]:
    """The excludes of the named rules for these packages.

    Raises:
        UsageError: an unknown rule name.
    """
    out: list[str] = []
    for rule in _rules(names):
        out += [e for e in rule.excludes(packages) if e not in out]
    return out


def rule_digests(names: Iterable[str]) -> list[tuple[str, bytes]]:
    """The (path, SHA-256) pairs the named rules admit.

    Raises:
        UsageError: an unknown rule name.
    """
    return [pair for rule in _rules(names) for pair in rule.digests]


def package_allowlist(
    packages: Iterable[DebPackage],
) -> dict[str, set[tuple[str, bytes]]]:
    """path -> allowed digests of what installing ``packages`` makes root
    read or run (see the module doc)."""
    allow: dict[str, set[tuple[str, bytes]]] = {}

    def add(path: str, digest: bytes) -> None:
        allow.setdefault(path, set()).add(("sha256", digest))

    for package in packages:
        for path, digest in package.files.items():
            add(path, digest)
            if path.startswith(tuple(d + "/" for d in MERGED_USR)):
                add("/usr" + path, digest)
        for member, digest in package.control.items():
            add(f"{DPKG_TMP_CI}/{member}", digest)
            if member != "control":
                add(f"{DPKG_INFO}/{package.dpkg_name}.{member}", digest)
        for conffile in package.conffiles:
            if conffile in package.files:
                add(conffile + ".dpkg-new", package.files[conffile])
                add(conffile + ".dpkg-dist", package.files[conffile])
        add(f"{APT_ARCHIVES}/{package.deb_name}", package.sha256)
    return allow


def from_debs(paths: Sequence[str], limits: Limits) -> list[DebPackage]:
    """Read the ``.deb`` files named on the command line.

    Raises:
        PackageError: one does not read (named).
    """
    return [read_deb(path, limits) for path in paths]


def _fetch_debs(
    repo: Repository, entries: Sequence[IndexEntry]
) -> Iterator[DebPackage]:
    with tempfile.TemporaryDirectory(prefix="trusted-debs-") as work:
        for entry in entries:
            where = repo.where(entry.filename)
            local = os.path.join(work, "package.deb")
            with open(local, "wb") as out:
                digest = repo.fetch_to(entry.filename, out, entry.size)
            if digest != entry.sha256:
                raise PackageError(where, "digest differs from the Packages index")
            try:
                package = read_deb(local, repo.limits)
            except PackageError as exc:
                raise PackageError(where, exc.reason) from None
            index = (entry.package, entry.version, entry.architecture)
            if (package.package, package.version, package.architecture) != index:
                raise PackageError(where, "control paragraph differs from the index")
            yield package


def from_repository(
    repo: Repository,
    keyring: str,
    *,
    suite: str | None = None,
    components: Sequence[str] = (),
    arch: str = "amd64",
    packages: Sequence[str] = (),
    dpkg_status: str | None = None,
    now: float | None = None,
) -> list[DebPackage]:
    """The packages selected from a verified repository.

    Args:
        repo: the repository.
        keyring: the only keys trusted to sign its Release.
        suite: its suite (default: its only one if it is a local directory
            with one, else ``stable``).
        components: the components to read (default: the Release's).
        arch: the node's architecture (``all`` packages are read too).
        packages: ``NAME`` (newest) or ``NAME=VERSION``; every package if
            empty and ``dpkg_status`` is None.
        dpkg_status: a node's ``/var/lib/dpkg/status``: exactly the
            versions it has installed.
        now: the time to judge ``Valid-Until`` by (default: the clock).

    Raises:
        PackageError: anything that does not verify or is missing (named).
    """
    if suite is None:
        found = repo.suites()
        suite = found[0] if len(found) == 1 else "stable"
    release = load_release(repo, suite, keyring, time.time() if now is None else now)
    where = repo.where(f"dists/{suite}")
    entries: list[IndexEntry] = []
    for component in components or release.components or ("main",):
        for architecture in dict.fromkeys((arch, "all")):
            entries += load_index(repo, release, component, architecture)
    entries = list(
        {(e.package, e.version, e.architecture): e for e in entries}.values()
    )
    if not entries:
        raise PackageError(where, f"no Packages index for {arch}")
    if dpkg_status is not None:
        status = read_local(dpkg_status, repo.limits.max_bytes)
        wanted = installed_set(status, dpkg_status)
        chosen = select_installed(entries, wanted, where)
    else:
        chosen = select(entries, packages, where)
    return list(_fetch_debs(repo, chosen))


def extra_files(specs: Sequence[str]) -> list[tuple[str, bytes]]:
    """``--file GUEST_PATH=FILE``: (guest path, SHA-256 of the local file).

    Raises:
        UsageError: not an absolute, normalized guest path, or an unreadable
            file.
    """
    out = []
    for spec in specs:
        guest, sep, local = spec.partition("=")
        if not sep or not guest.startswith("/") or os.path.normpath(guest) != guest:
            raise UsageError(f"--file {spec!r}: want GUEST_PATH=FILE, GUEST_PATH "
                             "absolute and normalized")  # fmt: skip
        try:
            with open(local, "rb") as handle:
                out.append((guest, hashlib.file_digest(handle, "sha256").digest()))
        except OSError as exc:
            raise UsageError(f"--file {spec!r}: {exc}") from None
    return out


def _split(values: Sequence[str]) -> list[str]:
    return [item for value in values for item in re.split(r"[,\s]+", value) if item]


def add_package_arguments(
    run: argparse.ArgumentParser, source: argparse._MutuallyExclusiveGroup
) -> None:
    """The package sources of ``policy generate runtime``."""
    source.add_argument(
        "--deb", nargs="+", action="extend", metavar="FILE",
        help="Debian packages: the digest of every file they install",
    )  # fmt: skip
    source.add_argument(
        "--apt-repo", metavar="DIR|URL",
        help="an apt repository (a directory laid out as one, or an "
        "http(s) URL): its signed Release is verified with --keyring",
    )  # fmt: skip
    group = run.add_argument_group("package sources (--deb, --apt-repo)")
    group.add_argument(
        "--keyring", metavar="FILE",
        help="the OpenPGP keys (binary, armored or keybox) trusted to sign "
        "the repository's Release: no other key is (needs gpgv)",
    )  # fmt: skip
    group.add_argument(
        "--suite", help="default: the repository's only suite, or stable"
    )
    group.add_argument(
        "--components", action="append", default=[], metavar="C,...",
        help="default: those the Release lists",
    )  # fmt: skip
    group.add_argument("--arch", default="amd64", help="default: amd64")
    which = group.add_mutually_exclusive_group()
    which.add_argument(
        "--packages", action="append", default=[], metavar="LIST",
        help="NAME (its newest version) or NAME=VERSION, comma or space "
        "separated (default: every package)",
    )  # fmt: skip
    which.add_argument(
        "--dpkg-status", metavar="FILE",
        help="a node's /var/lib/dpkg/status: exactly the versions installed",
    )  # fmt: skip
    rules = "; ".join(f"{r.name}: {r.lets_through}" for r in RULES.values())
    group.add_argument(
        "--rules", default=",".join(DEFAULT_RULES), metavar="NAME,...",
        help=f"what apt and dpkg regenerate, admitted unchecked (default: "
        f"{','.join(DEFAULT_RULES)}; '' for none): {rules}",
    )  # fmt: skip
    group.add_argument(
        "--file", action="append", default=[], metavar="GUEST_PATH=FILE",
        help="also admit FILE's digest at GUEST_PATH: the node's own apt "
        "configuration, e.g. /etc/apt/sources.list.d/repo.list (repeatable)",
    )  # fmt: skip
    group.add_argument(
        "--boot-excludes", action="store_true",
        help="also the excludes of state written at boot (as for an image; "
        "not needed in a delta over an image's policy)",
    )  # fmt: skip
    group.add_argument(
        "--max-bytes", type=int, default=Limits().max_bytes, metavar="N",
        help="the most bytes one archive, index or download may decompress "
        "to (default: 4 GiB)",
    )  # fmt: skip


def packages_from_args(args: argparse.Namespace) -> list[DebPackage]:
    """The packages ``args`` name.

    Raises:
        UsageError: options that do not go together.
        PackageError: a source that does not verify.
    """
    if args.max_bytes < 1:
        raise UsageError("--max-bytes must be positive")
    limits = Limits(max_bytes=args.max_bytes)
    if args.deb:
        if args.keyring or args.packages or args.dpkg_status or args.suite:
            raise UsageError(
                "--keyring, --suite, --packages and --dpkg-status go with --apt-repo"
            )
        return from_debs(args.deb, limits)
    if not args.keyring:
        raise UsageError("--apt-repo needs --keyring (the keys that sign its Release)")
    return from_repository(
        Repository(args.apt_repo, limits),
        args.keyring,
        suite=args.suite,
        components=_split(args.components),
        arch=args.arch,
        packages=_split(args.packages),
        dpkg_status=args.dpkg_status,
    )
