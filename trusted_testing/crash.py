"""A revocation pipeline to crash: the real registrar and verifier
processes on a private PostgreSQL cluster, an emulated fleet attested by
them, one notifier driver of the verifier, and its consumer (a
``trusted-revocation-listener`` process for ``webhook`` and
``messaging`` with a private RabbitMQ node; the hooks inside the verifier
for ``inprocess``). Every part can be SIGKILLed and restarted
(``tests/functional/test_revocation_crashes.py``).

What is checked after each crash (:meth:`CrashRig.delivered_once`):
every tampered node has exactly one revocation event in the outbox, it is
marked delivered, the consumer processed its id exactly once, and no other
node was revoked.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from trusted_testing.cluster import LocalCluster, free_port, wait_until
from trusted_testing.fleet import FleetProcess
from trusted_testing.fleet_run import FleetApi
from trusted_testing.keyservice import capability_sections, start_keyservice
from trusted_testing.postgres import PrivatePostgres
from trusted_testing.rabbitmq import PrivateRabbit
from trusted_testing.revocation import RABBIT_FAST_RECONNECT, Pipeline
from verifier import db

__all__ = ["CrashRig"]

DEDUP_FILE = "processed_events.jsonl"


class CrashRig:
    """Everything for one notifier driver.

    Args:
        workdir: an empty directory owned by the caller.
        driver: ``webhook``, ``messaging``, ``inprocess`` or ``keyservice``.
        nodes: size of the emulated fleet.
    """

    def __init__(self, workdir: str, driver: str, nodes: int = 16) -> None:
        self.workdir = workdir
        self.driver = driver
        self._cleanups: list[Callable[[], None]] = []
        self.pg = PrivatePostgres()
        self._cleanups.append(self.pg.cleanup)
        self.rabbit: PrivateRabbit | None = None
        if driver == "messaging":
            self.rabbit = PrivateRabbit()
            self._cleanups.append(self.rabbit.cleanup)
            self.rabbit.start()
        os.makedirs(os.path.join(workdir, "pipeline"))
        self.pipeline = Pipeline(
            os.path.join(workdir, "pipeline"),
            self.rabbit.url if self.rabbit else None,
            topic="revocation_crash",
            db_url=self.pg.url,
        )
        self._cleanups.append(self.pipeline.close)
        self.inprocess_state = os.path.join(workdir, "inprocess-state")
        self.keyservice_port = free_port()
        options: dict[str, Any] = {
            "outbox_retry_delay": 0.2,
            "outbox_max_retry_delay": 0.5,
            "max_unreachable": 10_000,
        }
        if driver != "keyservice":  # which trusts the cluster's own key
            options["signing_key"] = self.pipeline.signing_key_file
        self.cluster = LocalCluster(
            os.path.join(workdir, "cluster"),
            nodes=0,
            interval=0.5,
            notifiers=(driver,),
            verifier_options=options,
            verifier_sections=self._sections(),
            database_url=self.pg.url,
        )
        self._cleanups.append(self.cluster.stop)
        self.fleet = FleetProcess(
            nodes, self.cluster.registrar_url, self.cluster.pki, workdir
        )
        self._cleanups.append(self.fleet.stop)
        self.tampered: set[str] = set()

    def _sections(self) -> dict[str, dict[str, Any]]:
        p = self.pipeline
        sections: dict[str, dict[str, Any]] = {"quota": {"nodes": -1}}
        if self.driver == "webhook":
            sections["notifier_webhook"] = p.webhook_section()
        elif self.driver == "messaging":
            assert self.rabbit is not None
            sections["notifier_messaging"] = {
                "transport_url": self.rabbit.url,
                "topic": p.topic,
            }
            sections["oslo_messaging_rabbit"] = dict(RABBIT_FAST_RECONNECT)
        elif self.driver == "keyservice":
            sections.update(
                capability_sections(
                    os.path.join(self.workdir, "cluster"), self.keyservice_port
                )
            )
        else:
            sections["revocation_hooks"] = {
                "actions": ["log"],
                "retry_delay": 0.1,
                "state_dir": self.inprocess_state,
            }
            sections["action_log"] = {
                "record_file": os.path.join(self.workdir, "inprocess-actions.jsonl")
            }
        return sections

    # -- start ----------------------------------------------------------

    def start(self) -> None:
        """Start the services, the consumer and the fleet; enrol every node
        and wait until all are attested."""
        self.cluster.start_services()
        self.fleet.registrar_url = self.cluster.registrar_url
        self.fleet.start()
        self.start_consumer()
        asyncio.run(self._enrol())

    async def _enrol(self) -> None:
        api = FleetApi(self.cluster, self.cluster.verifier_url)
        try:
            await api.enrol(self.fleet.uuids, self.fleet.pcr16)
            await api.wait_attested(len(self.fleet.uuids), 300)
        finally:
            await api.close()

    def close(self) -> None:
        for cleanup in reversed(self._cleanups):
            try:
                cleanup()
            except Exception:  # noqa: S110 -- best effort: clean up the rest
                pass

    # -- the consumer -------------------------------------------------------

    def start_consumer(self) -> None:
        """The listener process (webhook, messaging), the key service
        process (keyservice); nothing for inprocess (the verifier is the
        consumer)."""
        if self.driver == "inprocess":
            return
        if self.driver == "keyservice":
            start_keyservice(self.cluster, self.keyservice_port)
            return
        self.pipeline.start_listener(
            ["messaging", "webhook"] if self.driver == "messaging" else ["webhook"]
        )

    def consumer_alive(self) -> bool:
        if self.driver == "inprocess":
            return True
        proc = (
            self.cluster.procs.get("keyservice")
            if self.driver == "keyservice"
            else self.pipeline.listener
        )
        return proc is not None and proc.poll() is None

    def stop_consumer(self) -> None:
        if self.driver == "keyservice":
            proc = self.cluster.procs.get("keyservice")
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
            return
        self.pipeline.stop_listener()

    def _consumer_pid(self) -> int:
        proc = (
            self.cluster.procs["keyservice"]
            if self.driver == "keyservice"
            else self.pipeline.listener
        )
        assert proc is not None
        return proc.pid

    def pause_consumer(self) -> None:
        """SIGSTOP the listener or key service: it takes connections but
        answers nothing."""
        os.killpg(self._consumer_pid(), signal.SIGSTOP)

    def resume_consumer(self) -> None:
        os.killpg(self._consumer_pid(), signal.SIGCONT)

    def _keyservice_state(self) -> dict[str, Any]:
        path = os.path.join(self.cluster.workdir, "keyservice.json")
        try:
            with open(path, encoding="utf-8") as f:
                return dict(json.load(f))
        except FileNotFoundError:
            return {}

    def processed(self) -> list[str]:
        """Event ids in the consumer's processed-events file, as written
        (a duplicate would appear twice). For the key service: the events
        it handled, each node's once more for every extra capability epoch
        bump (a revocation handled twice bumps twice)."""
        if self.driver == "keyservice":
            saved = self._keyservice_state()
            handled: dict[str, str] = saved.get("handled", {})
            epochs: dict[str, int] = saved.get("epochs", {})
            return [
                event_id
                for event_id, node in handled.items()
                for _ in range(max(1, epochs.get(node, 1)))
            ]
        state = (
            self.inprocess_state
            if self.driver == "inprocess"
            else os.path.join(self.pipeline.workdir, "listener-state")
        )
        try:
            with open(os.path.join(state, DEDUP_FILE), encoding="utf-8") as f:
                return [json.loads(line)["event_id"] for line in f if line.strip()]
        except FileNotFoundError:
            return []

    # -- the verifier and the database ------------------------------------

    def kill_verifier(self) -> None:
        self.cluster.kill_verifier(0)

    def restart_verifier(self) -> None:
        self.cluster.start_verifier(0)

    def verifier_alive(self) -> bool:
        return self.cluster.procs[self.cluster.verifier_name(0)].poll() is None

    def _engine(self) -> sa.Engine:
        return db.make_engine(self.pg.url)

    def outbox(self) -> list[db.OutboxEvent]:
        engine = self._engine()
        try:
            with Session(engine) as session:
                rows = list(session.scalars(sa.select(db.OutboxEvent)))
                session.expunge_all()
                return rows
        finally:
            engine.dispose()

    def staged(self, uuids: set[str]) -> bool:
        """Whether an event is in the outbox for each of ``uuids`` (the
        revocation committed); False while the database is down."""
        try:
            return uuids <= {row.node_uuid for row in self.outbox()}
        except sa.exc.OperationalError:
            return False

    # -- the fleet ------------------------------------------------------------

    def tamper(self, count: int) -> set[str]:
        """Extend PCR 16 of ``count`` nodes not tampered with yet."""
        fresh = [u for u in self.fleet.uuids if u not in self.tampered][:count]
        if len(fresh) < count:
            raise RuntimeError("the fleet has no untampered nodes left")
        for uuid in fresh:
            self.fleet.tamper(uuid)
        self.tampered.update(fresh)
        return set(fresh)

    def wait_staged(self, uuids: set[str], timeout: float = 120) -> None:
        wait_until(
            lambda: self.staged(uuids), timeout, 0.01, what="a revocation committed"
        )

    def delivered_once(self, timeout: float = 180) -> dict[str, Any]:
        """Wait until the outbox is drained, then check exactly-once.

        Returns:
            Figures for the report: events, processed lines.

        Raises:
            AssertionError: an event lost, duplicated or false.
        """

        def drained() -> bool:
            try:
                rows = self.outbox()
            except sa.exc.OperationalError:
                return False
            return (
                {r.node_uuid for r in rows} >= self.tampered
                and all(r.delivered_at is not None for r in rows)
                and set(self.processed()) >= {r.id for r in rows}
            )

        def rows_now() -> list[db.OutboxEvent]:
            try:
                return self.outbox()
            except sa.exc.OperationalError:
                return []

        deadline = time.monotonic() + timeout
        while not drained():
            if time.monotonic() > deadline:
                state = [
                    (r.node_uuid, r.delivered_at, r.last_error) for r in rows_now()
                ]
                raise AssertionError(
                    f"not delivered in {timeout} s: outbox {state}, "
                    f"processed {self.processed()}"
                )
            time.sleep(0.2)
        rows = self.outbox()
        per_node: dict[str, int] = {}
        for row in rows:
            per_node[row.node_uuid] = per_node.get(row.node_uuid, 0) + 1
        false = set(per_node) - self.tampered
        if false:
            raise AssertionError(f"events for untampered nodes: {sorted(false)}")
        twice = {u: n for u, n in per_node.items() if n != 1}
        if twice:
            raise AssertionError(f"nodes with more than one event: {twice}")
        processed = self.processed()
        dup = {i for i in processed if processed.count(i) > 1}
        if dup:
            raise AssertionError(f"events processed twice: {sorted(dup)}")
        return {"events": len(rows), "processed": len(processed)}
