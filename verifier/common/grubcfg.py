"""What GRUB would boot from its configuration: each ``menuentry``'s
kernel, the command line GRUB measures for it, and its initrds.

This runs the statements :mod:`verifier.common.grubscript` parses the way
GRUB 2 does for the parts that decide a boot, and nothing more:

* ``set``/``NAME=VALUE``, ``unset``, ``export``; ``$var``/``${var}``
  expansion (split on white space outside double quotes);
* ``search`` (``--fs-uuid``, ``--label``, ``--file``, ``--set[=VAR]``),
  ``search.fs_uuid``/``search.fs_label``/``search.file KEY [VAR]``;
* ``configfile`` (a new context holding only exported variables, as GRUB
  opens one) and ``source``; ``load_env`` (the ``grubenv`` block);
* ``if`` with ``[``/``test`` conditions on strings and files, decided
  when their operands are known; a condition that cannot be decided
  (``if loadfont $font``) runs its branches only if they change nothing
  that decides a boot, else the line is refused;
* ``function`` definitions and calls; ``menuentry`` and ``submenu``, each
  entry run when the menu is complete in a context of the exported
  variables (as GRUB runs a chosen entry);
* in an entry, ``linux``/``linuxefi PATH ARGS...`` and
  ``initrd``/``initrdefi PATH...``. GRUB measures the kernel command line
  as ``grub_create_loader_cmdline`` builds it (``grub-core/lib/cmdline.c``):
  the path as written then the arguments, joined by single spaces, an
  argument with a space double-quoted and ``\\``, ``'``, ``"`` escaped.

Entries that boot no Linux kernel (``fwsetup``, ``chainloader``) are
listed as skipped. Any other command, or one that cannot be decided,
raises :class:`~verifier.common.diskimage.DiskImageError` naming the file
and line: an honest refusal, never a guess.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Protocol

from verifier.common.diskimage import DiskImageError, MissingFileError
from verifier.common.grubscript import Block, Command, If, Statement, Word, parse

__all__ = ["Devices", "GrubMenu", "MenuEntry", "grub_menu", "loader_cmdline"]

_MAX_DEPTH = 16
_MAX_STEPS = 100_000
_MAX_WORDS = 1 << 16
#: Variables never known here: ``$?`` (no command's status is known).
_UNKNOWN = frozenset({"?"})
_ASSIGN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)", re.DOTALL)
_HARMLESS = frozenset(
    "insmod rmmod echo terminal_output terminal_input terminal serial loadfont "
    "play sleep background_image background_color save_env true false clear "
    "gettext font lsfonts [ test set_background_image recordfail".split()
)
_NOT_LINUX = frozenset(
    "fwsetup chainloader multiboot multiboot2 module module2 reboot halt "
    "exit normal appleloader kfreebsd knetbsd kopenbsd".split()
)
_LINUX, _INITRD = ("linux", "linuxefi"), ("initrd", "initrdefi")
_BOOT = frozenset(
    [*_LINUX, *_INITRD, "configfile", "source", "load_env", "search",
     "search.fs_uuid", "search.fs_label", "search.file", "menuentry", "submenu"]
)  # fmt: skip
_FEATURES = (
    "feature_chainloader_bpb feature_ntldr feature_platform_search_hint "
    "feature_default_font_path feature_all_video_module feature_menuentry_id "
    "feature_menuentry_options feature_200_final feature_nativedisk_cmd "
    "feature_timeout_style"
).split()


class Devices(Protocol):
    """The disk's file systems as GRUB names them (``hd0,gpt2``)."""

    def read(self, device: str, path: str) -> bytes:
        """A file's contents.

        Raises:
            MissingFileError: no such file or device.
            DiskImageError: unreadable.
        """

    def exists(self, device: str, path: str) -> bool:
        """Whether the file exists."""

    def search(self, kind: str, key: str) -> str | None:
        """The first device whose ``kind`` (``fs_uuid``, ``fs_label``,
        ``file``) matches ``key``."""


@dataclasses.dataclass(frozen=True, slots=True)
class MenuEntry:
    """A menu entry that boots Linux.

    Attributes:
        title: its title.
        kernel: (device, path) of the kernel.
        cmdline: what GRUB measures as ``kernel_cmdline``.
        initrds: (device, path) of each initrd, in order.
    """

    title: str
    kernel: tuple[str, str]
    cmdline: str
    initrds: tuple[tuple[str, str], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class GrubMenu:
    """Every Linux entry GRUB would offer, and the titles of the others."""

    entries: tuple[MenuEntry, ...]
    skipped: tuple[str, ...]


def loader_cmdline(args: Sequence[str]) -> str:
    """The command line ``grub_create_loader_cmdline`` builds from ``args``."""
    out = []
    for arg in args:
        text = re.sub(r"([\\'\"])", r"\\\1", arg)
        out.append(f'"{text}"' if " " in arg else text)
    return " ".join(out)


@dataclasses.dataclass(slots=True)
class _Context:
    vars: dict[str, str]
    exported: set[str]
    uncertain: set[str]
    blocks: list[tuple[Block, bool]] = dataclasses.field(default_factory=list)

    def child(self) -> _Context:
        names = self.exported - self.uncertain
        values = {n: self.vars.get(n, "") for n in names}
        return _Context(values, set(names), set(_UNKNOWN))


@dataclasses.dataclass(slots=True)
class _Entry:
    kernel: tuple[str, str] | None = None
    cmdline: str = ""
    initrds: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    other: bool = False


class _Runner:
    def __init__(self, devices: Devices) -> None:
        self._devices = devices
        self._functions: dict[str, Block] = {}
        self._steps = 0
        self.entries: list[MenuEntry] = []
        self.skipped: list[str] = []

    # -- words ----------------------------------------------------------------

    def _expand(self, words: Sequence[Word], ctx: _Context) -> tuple[list[str], bool]:
        """The arguments of ``words``, and whether an uncertain variable
        went into them."""
        out: list[str] = []
        tainted = False
        for word in words:
            current: str | None = None  # None: no field started
            for seg in word.segments:
                if seg.is_var:
                    tainted |= seg.text in ctx.uncertain
                    value = ctx.vars.get(seg.text, "")
                else:
                    value = seg.text
                if not seg.is_var or seg.quoted:
                    current = (current or "") + value
                    continue
                if value[:1].isspace() and current is not None:
                    out.append(current)
                    current = None
                for i, piece in enumerate(value.split()):
                    if i and current is not None:
                        out.append(current)
                        current = None
                    current = (current or "") + piece
                if value[-1:].isspace() and current is not None:
                    out.append(current)
                    current = None
            if current is not None:
                out.append(current)
        if sum(len(a) for a in out) > _MAX_WORDS:
            raise DiskImageError(f"GRUB: a command expands to over {_MAX_WORDS} bytes")
        return out, tainted

    def _error(self, where: tuple[str, int], detail: str) -> DiskImageError:
        return DiskImageError(f"GRUB: {where[0]} line {where[1]}: {detail}")

    def _path(
        self, text: str, ctx: _Context, where: tuple[str, int]
    ) -> tuple[str, str]:
        if text.startswith("("):
            device, sep, path = text[1:].partition(")")
            if not sep:
                raise self._error(where, f"bad device in {text!r}")
        else:
            device, path = ctx.vars.get("root", ""), text
            if "root" in ctx.uncertain:
                raise self._error(where, "$root is set in an undecided condition")
        if not device or not path.startswith("/"):
            raise self._error(where, f"{text!r} names no device and absolute path")
        return device, path

    # -- statements -----------------------------------------------------------

    def run_file(self, device: str, path: str, ctx: _Context, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise DiskImageError(f"GRUB: configuration files nested over {_MAX_DEPTH}")
        name = f"({device}){path}"
        try:
            raw = self._devices.read(device, path)
        except MissingFileError:
            raise DiskImageError(f"GRUB: {name} not found") from None
        text = raw.decode("utf-8", "replace")
        self._run(parse(text, name), ctx, name, True, None, depth)

    def _run(
        self,
        body: Sequence[Statement],
        ctx: _Context,
        name: str,
        certain: bool,
        entry: _Entry | None,
        depth: int,
    ) -> None:
        for stmt in body:
            self._steps += 1
            if self._steps > _MAX_STEPS:
                raise DiskImageError(f"GRUB: {name}: over {_MAX_STEPS} steps")
            where = (name, stmt.line)
            if isinstance(stmt, If):
                self._if(stmt, ctx, name, certain, entry, depth)
            elif isinstance(stmt, Block):
                self._block(stmt, ctx, where, certain)
            elif stmt.words:
                self._command(stmt, ctx, name, certain, entry, depth)

    def _block(
        self, block: Block, ctx: _Context, where: tuple[str, int], certain: bool
    ) -> None:
        if block.kind == "function":
            fname = block.words[0].literal
            if fname is None:
                raise self._error(where, "function name is not literal")
            self._functions[fname] = block
        else:
            ctx.blocks.append((block, certain))

    def _if(
        self,
        stmt: If,
        ctx: _Context,
        name: str,
        certain: bool,
        entry: _Entry | None,
        depth: int,
    ) -> None:
        for i, (cond, body) in enumerate(stmt.branches):
            decided = self._decide(cond, ctx, name) if certain else None
            if decided is None:
                rest = [b for _, b in stmt.branches[i:]] + [stmt.orelse]
                for branch in rest:
                    self._run(branch, ctx, name, False, entry, depth)
                return
            if decided:
                self._run(body, ctx, name, certain, entry, depth)
                return
        self._run(stmt.orelse, ctx, name, certain, entry, depth)

    def _decide(
        self, cond: Sequence[Statement], ctx: _Context, name: str
    ) -> bool | None:
        if len(cond) != 1 or not isinstance(cond[0], Command) or not cond[0].words:
            return None
        args, tainted = self._expand(cond[0].words, ctx)
        if tainted or not args:
            return None
        if args[0] in ("true", "false") and len(args) == 1:
            return args[0] == "true"
        if args[0] == "[" and args[-1] == "]":
            args = args[1:-1]
        elif args[0] == "test":
            args = args[1:]
        else:
            return None
        negate = bool(args) and args[0] == "!"
        result = self._test(args[1:] if negate else args, ctx, (name, cond[0].line))
        return None if result is None else result != negate

    def _test(
        self, args: list[str], ctx: _Context, where: tuple[str, int]
    ) -> bool | None:
        if not args:
            return False
        if len(args) == 1:
            return args[0] != ""
        if len(args) == 2 and args[0] in ("-z", "-n"):
            return (args[1] == "") == (args[0] == "-z")
        if len(args) == 3 and args[1] in ("=", "==", "!="):
            return (args[0] == args[2]) != (args[1] == "!=")
        if len(args) == 2 and args[0] in ("-e", "-f", "-d", "-s"):
            device, path = self._path(args[1], ctx, where)
            if args[0] != "-s":
                return self._devices.exists(device, path)
            try:
                return bool(self._devices.read(device, path))
            except MissingFileError:
                return False
        return None

    def _command(
        self,
        stmt: Command,
        ctx: _Context,
        name: str,
        certain: bool,
        entry: _Entry | None,
        depth: int,
    ) -> None:
        where = (name, stmt.line)
        args, tainted = self._expand(stmt.words, ctx)
        if not args:
            return
        cmd = args[0]
        assign = _ASSIGN.fullmatch(cmd) if len(args) == 1 else None
        if cmd == "set" or assign:
            pairs = [_ASSIGN.fullmatch(a) for a in (args[1:] if cmd == "set" else args)]
            for pair in pairs:
                if pair is None:
                    continue
                var, value = pair.groups()
                if not certain and var in ("root", "prefix"):
                    raise self._error(where, f"${var} set in an undecided condition")
                ctx.vars[var] = value
                if certain and not tainted:
                    ctx.uncertain.discard(var)
                else:
                    ctx.uncertain.add(var)
            return
        if cmd in ("unset", "export"):
            for var in args[1:]:
                if cmd == "unset" and certain:
                    ctx.vars.pop(var, None)
                    ctx.uncertain.discard(var)
                elif cmd == "unset":
                    ctx.uncertain.add(var)
                elif certain:
                    ctx.exported.add(var)
            return
        if cmd in _HARMLESS or (cmd == "fwsetup" and entry is None):
            return
        if cmd in self._functions:
            if depth > _MAX_DEPTH:
                raise self._error(where, "functions nested too deep")
            self._run(self._functions[cmd].body, ctx, name, certain, entry, depth + 1)
            return
        if cmd in _BOOT and (not certain or tainted):
            raise self._error(where, f"{cmd} depends on what this reader cannot decide")
        self._boot_command(cmd, args, ctx, where, entry, depth)

    def _boot_command(
        self,
        cmd: str,
        args: list[str],
        ctx: _Context,
        where: tuple[str, int],
        entry: _Entry | None,
        depth: int,
    ) -> None:
        if cmd.startswith("search"):
            self._search(cmd, args[1:], ctx, where)
        elif cmd in ("configfile", "source") and len(args) == 2:
            device, path = self._path(args[1], ctx, where)
            if cmd == "source":
                self.run_file(device, path, ctx, depth + 1)
            else:
                child = ctx.child()
                self.run_file(device, path, child, depth + 1)
                self.menu(child, depth + 1)
        elif cmd == "load_env":
            self._load_env(args[1:], ctx, where)
        elif entry is not None and cmd in _LINUX and len(args) >= 2:
            if entry.kernel is not None:
                raise self._error(where, "a second linux command in one entry")
            entry.kernel = self._path(args[1], ctx, where)
            entry.cmdline = loader_cmdline(args[1:])
            entry.initrds.clear()
        elif entry is not None and cmd in _INITRD and len(args) >= 2:
            if entry.kernel is None:
                raise self._error(where, "initrd before linux")
            if any(a.startswith("-") for a in args[1:]):
                raise self._error(where, "initrd options are not supported")
            entry.initrds += [self._path(a, ctx, where) for a in args[1:]]
        elif entry is not None and cmd in _NOT_LINUX:
            entry.other = True
        else:
            raise self._error(where, f"command {cmd!r} is not supported here")

    def _search(
        self, cmd: str, args: list[str], ctx: _Context, where: tuple[str, int]
    ) -> None:
        kinds = {"--fs-uuid": "fs_uuid", "-u": "fs_uuid", "--label": "fs_label",
                 "-l": "fs_label", "--file": "file", "-f": "file"}  # fmt: skip
        kind, var, keys = cmd.partition(".")[2], "", []
        for arg in args:
            if arg in kinds:
                kind = kinds[arg]
            elif arg in ("--set", "-s"):
                var = "root"
            elif arg.startswith("--set="):
                var = arg[6:]
            elif arg.startswith("-"):
                continue  # --no-floppy, --hint*
            else:
                keys.append(arg)
        if cmd != "search":
            var = keys[1] if len(keys) > 1 else "root"
        if not kind or not keys or not var:
            raise self._error(where, f"{cmd} without a kind, key or variable")
        device = self._devices.search(kind, keys[0])
        if device is None:
            raise self._error(where, f"{cmd}: no file system has {kind} {keys[0]!r}")
        ctx.vars[var] = device
        ctx.uncertain.discard(var)

    def _load_env(self, args: list[str], ctx: _Context, where: tuple[str, int]) -> None:
        path = ctx.vars.get("prefix", "") + "/grubenv"
        names = []
        for i, arg in enumerate(args):
            if arg in ("-f", "--file") and i + 1 < len(args):
                path = args[i + 1]
            elif not arg.startswith("-") and (i == 0 or args[i - 1] not in ("-f",)):
                names.append(arg)
        device, file = self._path(path, ctx, where)
        try:
            raw = self._devices.read(device, file)
        except MissingFileError:
            return
        for line in raw.decode("utf-8", "replace").split("\n")[1:]:
            pair = _ASSIGN.fullmatch(line)
            if pair is not None and (not names or pair.group(1) in names):
                ctx.vars[pair.group(1)] = re.sub(r"\\(.)", r"\1", pair.group(2))
                ctx.uncertain.discard(pair.group(1))

    # -- menus ----------------------------------------------------------------

    def menu(self, ctx: _Context, depth: int) -> None:
        blocks, ctx.blocks = ctx.blocks, []
        for block, certain in blocks:
            child = ctx.child()
            title = self._expand(block.words[:1], ctx)[0]
            label = title[0] if title else "?"
            if block.kind == "submenu" and not certain:
                raise self._error(
                    (label, block.line), "submenu in an undecided condition"
                )
            if block.kind == "submenu":
                where = f"submenu {label!r}"
                self._run(block.body, child, where, True, None, depth + 1)
                self.menu(child, depth + 1)
                continue
            entry = _Entry()
            where = f"menuentry {label!r}"
            self._run(block.body, child, where, True, entry, depth + 1)
            if entry.kernel is not None and not certain:
                raise self._error(
                    (where, block.line), "defined in an undecided condition"
                )
            if entry.kernel is None:
                self.skipped.append(label)
            else:
                self.entries.append(
                    MenuEntry(label, entry.kernel, entry.cmdline, tuple(entry.initrds))
                )


def grub_menu(devices: Devices, device: str, path: str, prefix: str) -> GrubMenu:
    """The menu GRUB offers after reading ``path`` on ``device``.

    Args:
        devices: the disk's file systems.
        device: where GRUB starts (the ESP: ``$root``).
        path: the first configuration file on it (``/EFI/debian/grub.cfg``).
        prefix: GRUB's ``$prefix`` (``(hd0,gpt1)/EFI/debian``).

    Raises:
        DiskImageError: a file not found, a construct not supported, a
            command that cannot be decided, naming the file and line.
    """
    env = {f: "y" for f in _FEATURES}
    env.update(root=device, prefix=prefix, cmdpath=prefix)
    env.update(grub_platform="efi", grub_cpu="x86_64")
    ctx = _Context(env, set(env), set(_UNKNOWN))
    runner = _Runner(devices)
    runner.run_file(device, path, ctx, 0)
    runner.menu(ctx, 0)
    return GrubMenu(tuple(runner.entries), tuple(runner.skipped))
