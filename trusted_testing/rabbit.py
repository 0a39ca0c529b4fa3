"""A RabbitMQ virtual host of its own for a test or benchmark.

The machine-wide broker (Debian ``rabbitmq-server``, 127.0.0.1:5672,
guest/guest) is shared: each user gets a fresh vhost, removed afterwards;
the broker itself is never restarted or reconfigured.
"""

from __future__ import annotations

import socket
import subprocess
import uuid as uuid_mod

HOST, PORT = "127.0.0.1", 5672


def missing() -> str | None:
    """What is missing to use RabbitMQ here, or None."""
    with socket.socket() as s:
        s.settimeout(1)
        if s.connect_ex((HOST, PORT)) == 0:
            return None
    return (
        "RabbitMQ on 127.0.0.1:5672 (apt-get install rabbitmq-server; "
        "rabbitmq-server -detached)"
    )


def _ctl(*args: str) -> None:
    subprocess.run(
        ["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60
    )


def scratch_vhost() -> tuple[str, str]:
    """Create a vhost for guest; returns (transport URL, vhost name)."""
    name = f"trusted-{uuid_mod.uuid4().hex[:12]}"
    _ctl("add_vhost", name)
    _ctl("set_permissions", "-p", name, "guest", ".*", ".*", ".*")
    return f"rabbit://guest:guest@{HOST}:{PORT}/{name}", name


def drop_vhost(name: str) -> None:
    _ctl("delete_vhost", name)
