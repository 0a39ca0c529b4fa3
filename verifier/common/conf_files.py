"""What a command's configuration files set that nothing reads: misspelt
options and sections.

oslo.config ignores an option or a section no code registered
(``qoute_interval = 5`` leaves ``quote_interval`` at its default without a
word). :func:`unknown_settings` reads the files a
:class:`~oslo_config.cfg.ConfigOpts` parsed (``--config-file`` and
``--config-dir``, with oslo.config's own parser, keeping line numbers) and
returns each setting that is neither an option registered on it nor one of
another command of the project or of a library the project configures
(:data:`NAMESPACES`, oslo-config-generator's namespaces: a file shared by
several commands, or with ``[keystone_authtoken]``, is not reported).
Options that keystoneauth registers only when it loads a plugin (``[...]
auth_type = password`` brings ``username``, ``password``, ...) are checked
against the plugin the file names; without keystoneauth, or for a plugin
it does not know, such a section's options are not checked.

The namespaces are loaded only for what the registered options leave
unexplained (a file with only the command's own options loads nothing).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import glob
import importlib
import logging
import os
import warnings
from collections.abc import Iterable, Iterator
from importlib import metadata
from typing import Any

from oslo_config import cfg, iniparser

__all__ = ["NAMESPACES", "PROJECT_NAMESPACES", "UnknownSetting", "unknown_settings"]

#: The ``oslo.config.opts`` namespaces whose options a configuration file of
#: the project may set: the project's packages', then the libraries' (as
#: in ``etc/oslo-config-generator/``), cheapest to load first.
PROJECT_NAMESPACES = (
    "verifier",
    "node_agent",
    "ipsec_puppet_vault_hooks",
    "vtpm_manager",
)
NAMESPACES = (
    *PROJECT_NAMESPACES,
    "oslo.log",
    "oslo.policy",
    "keystonemiddleware.auth_token",
    "oslo.limit",
    "oslo.messaging",
)

_DEFAULT = "DEFAULT"


@dataclasses.dataclass(frozen=True)
class UnknownSetting:
    """A section or option of a file that no registered option reads.

    Attributes:
        path: the file.
        line: its line number (1-based) of the section header or option.
        section: the section as written.
        option: the option as written; None: the whole section is unknown.
        suggestion: the closest known name, if one is close.
    """

    path: str
    line: int
    section: str
    option: str | None
    suggestion: str | None = None

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}: [{self.section}]"
        what = "unknown section" if self.option is None else "unknown option"
        if self.option is not None:
            where += f" {self.option}"
        hint = f" (did you mean {self.suggestion}?)" if self.suggestion else ""
        return f"{where}: {what}, ignored{hint}"


@dataclasses.dataclass
class _Setting:
    section: str
    option: str | None  # None: the section header
    line: int
    value: str = ""


class _Locator(iniparser.BaseParser):
    """oslo.config's parser, keeping where each section and key starts."""

    def __init__(self) -> None:
        self.section = ""
        self.found: list[_Setting] = []
        self._key_line = 0

    def _split_key_value(self, line: str) -> tuple[str, list[str]]:
        self._key_line = self.lineno
        return super()._split_key_value(line)

    def new_section(self, section: str) -> None:
        self.section = section
        self.found.append(_Setting(section, None, self.lineno))

    def assignment(self, key: str, value: list[str]) -> None:
        joined = "\n".join(value)
        self.found.append(_Setting(self.section, key, self._key_line, joined))


def _group_key(section: str) -> str:
    """The group a section sets (oslo.config: case-insensitive but DEFAULT)."""
    return section if section == _DEFAULT else section.lower()


def _files(conf: cfg.ConfigOpts) -> list[str]:
    paths = list(conf.config_file or ())
    dirs = getattr(conf, "config_dir", None) or ()
    for config_dir in [dirs] if isinstance(dirs, str) else dirs:
        paths += sorted(glob.glob(os.path.join(config_dir, "*.conf")))
    return paths


def _names(opt: cfg.Opt, group: str) -> Iterator[tuple[str, str]]:
    """(group, name) of an option and of its deprecated names."""
    yield group, opt.dest
    for old in opt.deprecated_opts:
        old_group = _group_key(old.group) if old.group else group
        yield old_group, old.name or opt.dest


def _registered(conf: cfg.ConfigOpts) -> dict[str, set[str]]:
    known: dict[str, set[str]] = {_DEFAULT: set()}
    # oslo.config has no public listing of the registered options
    for info, group in conf._all_opt_infos():
        key = _DEFAULT if group is None else _group_key(group.name)
        known.setdefault(key, set())
        for g, name in _names(info["opt"], key):
            known.setdefault(g, set()).add(name)
    return known


def _namespace_opts(namespace: str) -> list[tuple[Any, list[cfg.Opt]]]:
    """A namespace's ``list_opts()`` ([] if its package is not installed)."""
    points = metadata.entry_points(group="oslo.config.opts", name=namespace)
    for point in points:
        quiet = logging.root.manager.disable
        logging.disable(logging.INFO)  # oslo.messaging's backend, on import
        try:
            with warnings.catch_warnings():  # eventlet's, from oslo.messaging
                warnings.simplefilter("ignore")
                return list(point.load()())
        except ImportError:  # another role's (or a driver's) extra
            return []
        finally:
            logging.disable(quiet)
    return []


def _add(
    known: dict[str, set[str]], listed: Iterable[tuple[Any, list[cfg.Opt]]]
) -> None:
    for group, opts in listed:
        name = getattr(group, "name", group) or _DEFAULT
        key = _group_key(str(name))
        known.setdefault(key, set())
        for opt in opts:
            for g, n in _names(opt, key):
                known.setdefault(g, set()).add(n)


@functools.cache
def _plugin_options(plugin: str) -> frozenset[str] | None:
    """keystoneauth's options of auth plugin ``plugin`` (None: keystoneauth
    is not installed or does not know the plugin)."""
    try:
        loading: Any = importlib.import_module("keystoneauth1.loading")
        errors: Any = importlib.import_module("keystoneauth1.exceptions")
    except ImportError:
        return None
    try:
        opts = loading.get_auth_plugin_conf_options(plugin)
    except errors.NoMatchingPlugin:
        return None
    return frozenset(name for opt in opts for _, name in _names(opt, ""))


def _plugin_sections(found: list[_Setting]) -> dict[str, str | None]:
    """Section -> auth plugin name, for keystoneauth-configured sections
    (those with ``auth_type``, and those an ``auth_section`` names)."""
    plugins: dict[str, str | None] = {}
    for s in found:
        if s.option == "auth_type":
            plugins[_group_key(s.section)] = s.value.strip() or None
    for s in found:
        if s.option == "auth_section" and s.value.strip():
            section = _group_key(s.value.strip())
            plugins.setdefault(section, plugins.get(_group_key(s.section)))
    return plugins


def _explained(
    s: _Setting, known: dict[str, set[str]], plugins: dict[str, str | None]
) -> bool:
    key = _group_key(s.section)
    if key not in known and key not in plugins:
        return False
    if s.option is None:
        return True
    option = s.option
    if option in known.get(key, set()):
        return True
    if key in plugins:
        if option in ("auth_type", "auth_section"):
            return True
        extra = _plugin_options(plugins[key] or "password")
        return extra is None or option in extra
    return False


def _suggest(
    s: _Setting, known: dict[str, set[str]], plugins: dict[str, str | None]
) -> str | None:
    if s.option is None:
        pool = [k for k in known if k != _DEFAULT]
        word = _group_key(s.section)
    else:
        key = _group_key(s.section)
        pool = sorted(known.get(key, set()))
        if key in plugins:
            pool += sorted(_plugin_options(plugins[key] or "password") or ())
        word = s.option
    close = difflib.get_close_matches(word, pool, n=1, cutoff=0.75)
    return close[0] if close else None


def unknown_settings(conf: cfg.ConfigOpts) -> list[UnknownSetting]:
    """The sections and options of ``conf``'s files that nothing reads.

    Args:
        conf: parsed (its files read without error), its options registered.

    Returns:
        One :class:`UnknownSetting` per unknown section (its options are
        not listed) and per unknown option of a known section, in file
        order.

    Raises:
        OSError: a file cannot be read again.
        ValueError: a file is not UTF-8 text.
        iniparser.ParseError: a file no longer parses.
    """
    known = _registered(conf)
    per_file: list[tuple[str, list[_Setting]]] = []
    for path in _files(conf):
        locator = _Locator()
        with open(path, encoding="utf-8") as handle:
            locator.parse(handle)
        per_file.append((path, locator.found))
    plugins = _plugin_sections([s for _, found in per_file for s in found])
    pending = [
        (path, s)
        for path, found in per_file
        for s in found
        if not _explained(s, known, plugins)
    ]
    own = set(known) - {_DEFAULT}
    for namespace in NAMESPACES:
        if namespace not in PROJECT_NAMESPACES:
            # a library adds its own groups and [DEFAULT] options, never
            # options to a group of ours
            pending_keys = {_group_key(s.section) for _, s in pending}
            if not pending_keys - own:
                break
        elif not pending:
            break
        _add(known, _namespace_opts(namespace))
        pending = [(p, s) for p, s in pending if not _explained(s, known, plugins)]
    # an unknown section is reported once, not with each of its options
    sections = known.keys() | plugins.keys()
    pending = [
        (p, s)
        for p, s in pending
        if s.option is None or _group_key(s.section) in sections
    ]
    return [
        UnknownSetting(path, s.line, s.section, s.option, _suggest(s, known, plugins))
        for path, s in pending
    ]
