"""Loading a command's configuration: one line and exit status 2 for any
configuration error, never a traceback.

oslo.config reports a missing ``--config-file`` by raising from the parse,
and a value that does not convert (``interval = 1.5 # comment``: oslo.config
has no inline comments) only when the option is first read, perhaps deep in
a running service. :func:`load` parses the command line and the files, then
reads every registered option once, so every such error is reported at
start as ``<prog>: configuration error: <what>, naming the option and file``.
A section or option that nothing reads (a misspelt ``qoute_interval``) is
a warning at start, one line each on stderr, naming the file, the line, the
section and the option (:func:`warn_unknown`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from oslo_config import cfg, iniparser

from verifier.common import conf_files

__all__ = ["check_values", "fail", "fatal", "load", "setup_logging", "warn_unknown"]

#: The exit status of a configuration or usage error (as argparse's).
EXIT_CONFIG = 2


def fail(prog: str, message: str) -> NoReturn:
    """Print ``<prog>: configuration error: <message>`` (one line) to stderr
    and exit with status 2."""
    line = " ".join(str(message).splitlines())
    print(f"{prog}: configuration error: {line}", file=sys.stderr)
    raise SystemExit(EXIT_CONFIG)


def _logs_away_from_the_terminal(conf: cfg.ConfigOpts | None) -> bool:
    """Whether oslo.log writes somewhere the operator at the terminal does
    not look: a file, the journal, syslog (without those it writes to
    standard output)."""
    return conf is not None and any(
        getattr(conf, name, None)
        for name in ("log_file", "log_dir", "use_journal", "use_syslog")
    )


def fatal(
    conf: cfg.ConfigOpts | None,
    prog: str,
    message: object,
    log: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
    kind: str = "configuration error",
) -> int:
    """Report an error that ends the command: ``<prog>: <kind>: <message>``
    (one line) on stderr, always, and the same at ERROR in the log when it
    goes to a file, the journal or syslog (so a ``log_file`` does not hide
    why the command stopped, and the terminal does not get it twice).

    Args:
        conf: the command's parsed configuration (its oslo.log options;
            None: stderr only).
        prog: the command's name.
        message: what went wrong (folded into one line).
        log: the command's logger (None: stderr only).
        kind: what kind of error, for the line.

    Returns:
        :data:`EXIT_CONFIG`, the status to exit with for a configuration
        error.
    """
    line = " ".join(str(message).splitlines())
    print(f"{prog}: {kind}: {line}", file=sys.stderr)
    if log is not None and _logs_away_from_the_terminal(conf):
        log.error("%s: %s", kind, line)
    return EXIT_CONFIG


def setup_logging(conf: cfg.ConfigOpts, prog: str, product: str) -> None:
    """oslo.log's ``setup``; a log destination that cannot be opened (a
    ``log_file`` in a missing directory, ...) is a configuration error:
    one line naming the option and exit status 2, not a traceback. When the
    log goes to a file, the journal or syslog, the warnings :func:`load`
    printed about unknown settings are logged there too.

    Args:
        conf: parsed, with oslo.log's options registered.
        prog: the command's name, for the message.
        product: oslo.log's product name.
    """
    from oslo_log import log  # the client role has no oslo.log

    try:
        log.setup(conf, product)
    except OSError as exc:
        where = "[DEFAULT] log_file" if conf.log_file else "[DEFAULT] log_dir"
        path = exc.filename or conf.log_file or conf.log_dir
        fail(prog, f"{where} {path}: {exc.strerror or exc}")
    if _logs_away_from_the_terminal(conf):
        try:
            found = conf_files.unknown_settings(conf)
        except (OSError, ValueError, iniparser.ParseError):
            found = []
        for setting in found:
            log.getLogger(__name__).warning("%s", setting)


def _value_error(group: str | None, name: str, exc: Exception, files: str) -> str:
    where = f"[{group or 'DEFAULT'}] {name}"
    text = str(exc)
    reason = text.split("is not valid: ", 1)[-1]
    return f"{where} in {files}: {reason}"


def check_values(conf: cfg.ConfigOpts) -> None:
    """Read every registered option once.

    Raises:
        ValueError: naming the first option whose value does not convert
            (``[group] name in FILES: reason``).
    """
    files = ", ".join(conf.config_file or ()) or "the command line"
    groups: list[tuple[str | None, Any]] = [(None, conf)]
    for name in list(conf):
        try:
            value = conf[name]
        except (cfg.Error, ValueError) as exc:
            raise ValueError(_value_error(None, name, exc, files)) from None
        if isinstance(value, cfg.ConfigOpts.GroupAttr):
            groups.append((name, value))
    for group, attr in groups[1:]:
        for name in list(attr):
            try:
                getattr(attr, name)
            except (cfg.Error, ValueError) as exc:
                raise ValueError(_value_error(group, name, exc, files)) from None


def load(
    conf: cfg.ConfigOpts,
    argv: Sequence[str] | None,
    prog: str,
    **kwargs: Any,
) -> None:
    """Parse ``argv`` (default: ``sys.argv[1:]``) and the configuration files
    into ``conf`` and check every option's value; on any error print one line
    naming the option, file or position and exit with status 2.

    Args:
        conf: with its options registered.
        argv: the command line without the program name.
        prog: the command's name, for messages.
        kwargs: more arguments of ``conf()`` (e.g. ``description``).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        conf(args, project="trusted-cloud", prog=prog, **kwargs)
    except cfg.ConfigFilesNotFoundError as exc:
        fail(prog, f"cannot read configuration file(s): {', '.join(exc.config_files)}")
    except cfg.ConfigFileParseError as exc:
        fail(prog, f"{exc.config_file}: {exc.msg}")
    except (cfg.Error, ValueError) as exc:
        fail(prog, str(exc))
    try:
        check_values(conf)
    except ValueError as exc:
        fail(prog, str(exc))
    warn_unknown(conf, prog)


def warn_unknown(conf: cfg.ConfigOpts, prog: str) -> list[str]:
    """Print one line on stderr for each section or option of ``conf``'s
    files that nothing reads (:mod:`verifier.common.conf_files`):
    ``<prog>: warning: FILE:LINE: [section] option: unknown option,
    ignored (did you mean ...?)``.

    Returns:
        The lines printed.
    """
    try:
        found = conf_files.unknown_settings(conf)
    except (OSError, ValueError, iniparser.ParseError):
        return []  # read a moment ago by oslo.config: changed since
    lines = [f"{prog}: warning: {setting}" for setting in found]
    for line in lines:
        print(line, file=sys.stderr)
    return lines
