"""The ``trusted-tenant`` and ``trusted-nova boot`` commands of
doc/source/user/boot.rst, as the page writes them, parse with the real
command lines and send what the page says (issue 33: its ``policy add
measured-boot FILE`` form did not parse)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from typing import Any

import fixtures
import testtools

from nova_plugin import cmd, nova_cmd
from nova_plugin.commands.base import HANDLER
from nova_plugin.tenant import Tenant, TenantConfig

PAGE = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "doc", "source", "user", "boot.rst"
)
#: The files the page's commands name, with a content of their kind.
FILES = {
    "image-runtime.json": {"name": "image", "version": 1, "digests": {}},
    "seabios.json": {"boot_applications": [], "firmware": None, "secure_boot": False},
}


def page_commands(program: str) -> list[list[str]]:
    """Each command of the page's literal blocks that starts with
    ``program`` (continuation lines joined), split as a shell would."""
    with open(PAGE) as f:
        lines = f.read().splitlines()
    commands, current = [], ""
    for line in lines:
        text = line.strip()
        if current:
            current += " " + text.rstrip("\\")
        elif text.startswith(program + " ") and line.startswith("    "):
            current = text.rstrip("\\")
        if current and not text.endswith("\\"):
            commands.append(shlex.split(current)[1:])
            current = ""
    return commands


class _Recorder:
    """The verifier's side of the session: records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def call(self, method: str, path: str, body: Any = None) -> Any:
        self.calls.append((method, path, body))
        return {"name": body.get("name") or "image", "version": 1, "entries": 0,
                "digest": "00" * 32, "base": None}  # fmt: skip


class BootPageCommandsTest(testtools.TestCase):
    def setUp(self) -> None:
        super().setUp()
        work = self.useFixture(fixtures.TempDir()).path
        for name, document in FILES.items():
            with open(os.path.join(work, name), "w") as f:
                json.dump(document, f)
        cwd = os.getcwd()
        os.chdir(work)
        self.addCleanup(os.chdir, cwd)

    def test_policy_add_commands_parse_and_store_their_kind(self) -> None:
        commands = [
            c for c in page_commands("trusted-tenant") if c[:2] == ["policy", "add"]
        ]
        self.assertEqual(2, len(commands), commands)
        sent = []
        for argv in commands:
            args = cmd.parser(argv).parse_args(argv)  # exits 2 if it does not parse
            command = getattr(args, HANDLER).resolve(args)
            command.check(args)
            recorder = _Recorder()
            config = TenantConfig("https://r.test", "https://v.test", None, None, None)
            tenant = Tenant(config, verifier=recorder)  # type: ignore[arg-type]
            asyncio.run(command.run(tenant, args))
            ((method, path, body),) = recorder.calls
            self.assertEqual("POST", method)
            sent.append((path, body["name"] if "name" in body else None))
        paths = [p for p, _ in sent]
        self.assertIn("/runtime", paths[0])
        self.assertIn("/measured-boot", paths[1])
        self.assertEqual("seabios", sent[1][1])

    def test_boot_commands_parse(self) -> None:
        commands = page_commands("trusted-nova")
        self.assertEqual(2, len(commands), commands)
        for argv in commands:
            nova_cmd.parser(argv).parse_args(argv)  # exits 2 if it does not parse
        args = nova_cmd.parser(commands[-1]).parse_args(commands[-1])
        self.assertEqual("image", args.runtime_policy)
        self.assertEqual("seabios", args.mb_policy)
