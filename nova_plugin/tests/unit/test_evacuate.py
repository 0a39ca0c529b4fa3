"""``openstack attestation host evacuate``: how each guest is moved, what
is said, and bad input (the moves themselves run against Nova with two
emulated hosts in ``tests/functional/test_compute_pools``)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import testtools

from nova_plugin.evacuate import Evacuation, Move, Outcome, move_of
from nova_plugin.exceptions import ServiceError, UsageError

NODE = "1b4e28ba-2fa1-41d2-883f-0016d3cca427"
_OPENSTACK = os.path.join(os.path.dirname(sys.executable), "openstack")


def _server(uuid: str, status: str, security: str | None = None) -> dict[str, Any]:
    specs = {"hw:tpm_version": "2.0"}
    if security is not None:
        specs["hw:tpm_secret_security"] = security
    return {
        "id": uuid,
        "name": f"vm-{uuid}",
        "status": status,
        "OS-EXT-STS:task_state": None,
        "OS-EXT-SRV-ATTR:host": "h1",
        "flavor": {"extra_specs": specs},
    }


class _Nova:
    """An in-memory compute API: guests that never finish moving."""

    def __init__(self, servers: list[dict[str, Any]]) -> None:
        self.servers = {s["id"]: s for s in servers}
        self.actions: list[tuple[str, str]] = []

    def compute_host_exists(self, host: str) -> bool:
        return host == "h1"

    def host_of_node(self, node: str) -> str | None:
        return "h1" if node == NODE else None

    def servers_on(self, host: str) -> list[dict[str, Any]]:
        return list(self.servers.values())

    def server(self, uuid: str) -> dict[str, Any]:
        return self.servers[uuid]

    def action(self, uuid: str, body: dict[str, Any]) -> None:
        (name,) = body
        if name == "os-migrateLive" and self.servers[uuid]["status"] == "PAUSED":
            raise ServiceError("Cannot 'os-migrateLive' instance", status=409)
        self.actions.append((uuid, name))
        self.servers[uuid]["OS-EXT-STS:task_state"] = "migrating"

    def failure(self, uuid: str, action: str) -> str | None:
        return None


class _FailingNova(_Nova):
    """Nova whose moves end with the guest in ERROR where it was (as a
    failed live migration of Nova 34 leaves it)."""

    def action(self, uuid: str, body: dict[str, Any]) -> None:
        self.actions.append((uuid, next(iter(body))))
        self.servers[uuid]["status"] = "ERROR"

    def failure(self, uuid: str, action: str) -> str | None:
        return "Unsafe migration" if action == "live-migration" else None


class MoveTest(testtools.TestCase):
    def test_host_secret_security_is_live_migrated(self) -> None:
        self.assertIs(Move.LIVE, move_of(_server("1", "ACTIVE", "host")))

    def test_user_and_deployment_secret_security_are_cold_migrated(self) -> None:
        # Nova 34 live-migrates a vTPM only with hw:tpm_secret_security=host
        for security in (None, "user", "deployment"):
            self.assertIs(Move.COLD, move_of(_server("1", "ACTIVE", security)))

    def test_a_server_without_its_flavor_is_cold_migrated(self) -> None:
        self.assertIs(Move.COLD, move_of({"id": "1", "status": "ACTIVE"}))

    def test_lines_say_what_happened(self) -> None:
        base = Outcome("u", "vm", Move.COLD)
        self.assertEqual(
            "u (vm): moved to h2 by cold migration",
            Outcome("u", "vm", Move.COLD, moved_to="h2").line(),
        )
        self.assertEqual(
            "u (vm): could not: No valid host was found.",
            Outcome("u", "vm", Move.LIVE, reason="No valid host was found.").line(),
        )
        self.assertEqual(
            "u (vm): would move by cold migration",
            Outcome("u", "vm", Move.COLD, dry_run=True).line(),
        )
        self.assertFalse(base.failed)


class EvacuationTest(testtools.TestCase):
    def test_unknown_host_is_a_usage_error_and_moves_nothing(self) -> None:
        nova = _Nova([_server("1", "ACTIVE")])
        evacuation = Evacuation(nova)  # type: ignore[arg-type]
        self.assertRaises(UsageError, evacuation.run, "h9", dry_run=False, wait=False)
        self.assertEqual([], nova.actions)

    def test_a_host_is_named_by_its_compute_node_uuid_too(self) -> None:
        nova = _Nova([_server("1", "ACTIVE")])
        evacuation = Evacuation(nova)  # type: ignore[arg-type]
        self.assertEqual("h1", evacuation.resolve(NODE))
        self.assertEqual("h1", evacuation.resolve("h1"))
        other = "2b4e28ba-2fa1-41d2-883f-0016d3cca427"
        self.assertRaises(UsageError, evacuation.resolve, other)

    def test_a_guest_in_error_is_not_moved_and_says_why(self) -> None:
        nova = _Nova([_server("1", "ERROR"), _server("2", "ACTIVE")])
        outcomes = Evacuation(nova).run(  # type: ignore[arg-type]
            "h1", dry_run=False, wait=False
        )
        self.assertEqual("its status is ERROR", outcomes[0].reason)
        self.assertTrue(outcomes[1].requested)
        self.assertEqual([("2", "migrate")], nova.actions)

    def test_dry_run_asks_nothing_of_nova(self) -> None:
        nova = _Nova([_server("1", "ACTIVE", "host"), _server("2", "SHUTOFF")])
        outcomes = Evacuation(nova).run(  # type: ignore[arg-type]
            "h1", dry_run=True, wait=True
        )
        self.assertEqual([Move.LIVE, Move.COLD], [o.move for o in outcomes])
        self.assertTrue(all(o.dry_run for o in outcomes))
        self.assertEqual([], nova.actions)

    def test_nova_s_refusal_is_the_reason(self) -> None:
        nova = _Nova([_server("1", "PAUSED", "host")])
        (outcome,) = Evacuation(nova).run(  # type: ignore[arg-type]
            "h1", dry_run=False, wait=True
        )
        self.assertEqual("Cannot 'os-migrateLive' instance", outcome.reason)

    def test_a_guest_left_in_error_says_so_with_nova_s_reason(self) -> None:
        nova = _FailingNova([_server("1", "ACTIVE", "host"), _server("2", "ACTIVE")])
        live, cold = Evacuation(nova).run(  # type: ignore[arg-type]
            "h1", dry_run=False, wait=True
        )
        self.assertEqual("the guest is in ERROR on h1: Unsafe migration", live.reason)
        self.assertEqual("the guest is in ERROR on h1: no reason given", cold.reason)

    def test_a_move_that_never_ends_is_reported_after_the_timeout(self) -> None:
        now = [0.0]
        nova = _Nova([_server("1", "ACTIVE")])
        evacuation = Evacuation(
            nova,  # type: ignore[arg-type]
            timeout=10,
            clock=lambda: now[0],
            sleep=lambda s: now.__setitem__(0, now[0] + s),
        )
        (outcome,) = evacuation.run("h1", dry_run=False, wait=True)
        self.assertEqual("still ACTIVE (migrating) after 10 s", outcome.reason)


class CommandLineTest(testtools.TestCase):
    def openstack(self, *argv: str) -> tuple[int, str, str]:
        proc = subprocess.run(
            [_OPENSTACK, "--os-auth-type", "none", "--os-endpoint",
             "http://127.0.0.1:9/v2.1", "attestation", "host", "evacuate", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={k: v for k, v in os.environ.items() if not k.startswith("OS_")},
        )  # fmt: skip
        return proc.returncode, proc.stdout, proc.stderr

    def test_an_empty_host_name_is_one_line_and_exit_2(self) -> None:
        code, out, err = self.openstack("")
        self.assertEqual((2, ""), (code, out))
        self.assertEqual("give a host name and a positive --timeout\n", err)

    def test_a_timeout_that_is_not_positive_is_one_line_and_exit_2(self) -> None:
        code, _, err = self.openstack("h1", "--timeout", "0")
        self.assertEqual(2, code)
        self.assertEqual(1, len(err.splitlines()), err)
        self.assertNotIn("Traceback", err)

    def test_nova_unreachable_is_one_line_and_exit_1(self) -> None:
        code, out, err = self.openstack("h1", "--wait")
        self.assertEqual((1, ""), (code, out))
        self.assertEqual(1, len(err.splitlines()), err)
        self.assertIn("h1: Nova's API cannot be reached", err)
        self.assertNotIn("Traceback", err)
