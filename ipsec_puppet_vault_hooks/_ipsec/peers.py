"""Peer mappings: which IPsec connection and certificate belong to a node.

Provisioning writes one JSON file per IPsec peer, ``<peers_dir>/<node
UUID>.json``::

    {
      "connection": "node-0b6b8d5e",
      "certificate": "certs/0b6b8d5e.pem",
      "swanctl": {"remote_addrs": "192.0.2.7", "local": {...}, ...}
    }

``connection`` is the name of the peer's connection in charon (default:
the node UUID). ``certificate`` is the peer's certificate (PEM; a relative
path is taken from ``peers_dir``); instead of it, ``serial`` may give the
certificate serial number as a hex string. ``swanctl`` is optional: the
connection's settings as nested objects with swanctl.conf's key names,
rendered by :func:`render_swanctl` for the peers that are still trusted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from cryptography import x509

from ipsec_puppet_vault_hooks.exceptions import HooksError

__all__ = ["Peer", "PeerError", "load_peer", "load_peers", "render_swanctl"]

_SUFFIX = ".json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_BARE = re.compile(r"^[A-Za-z0-9._/:@+-]+$")


class PeerError(HooksError):
    """A peer mapping file is unreadable or malformed."""


@dataclasses.dataclass(frozen=True)
class Peer:
    """One IPsec peer.

    Attributes:
        node_uuid: the node the peer runs on.
        connection: its connection name in charon.
        serial: serial number of its certificate.
        swanctl: its swanctl connection settings, if provisioning gave them.
    """

    node_uuid: str
    connection: str
    serial: int
    swanctl: Mapping[str, Any] | None = None


def _serial(path: str, peers_dir: str, raw: Mapping[str, Any]) -> int:
    if "certificate" in raw:
        cert_path = raw["certificate"]
        if not isinstance(cert_path, str) or not cert_path:
            raise PeerError(f"{path}: 'certificate' must be a file name")
        cert_path = os.path.join(peers_dir, cert_path)
        try:
            with open(cert_path, "rb") as f:
                return x509.load_pem_x509_certificate(f.read()).serial_number
        except OSError as exc:
            raise PeerError(f"{path}: cannot read {cert_path}: {exc.strerror}")
        except ValueError as exc:
            raise PeerError(f"{path}: {cert_path} is not a PEM certificate: {exc}")
    serial = raw.get("serial")
    if isinstance(serial, str):
        try:
            return int(serial.replace(":", ""), 16)
        except ValueError:
            pass
    raise PeerError(f"{path}: give 'certificate' or 'serial' (hex)")


def _parse(path: str, peers_dir: str, node_uuid: str) -> Peer:
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as exc:
        raise PeerError(f"cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise PeerError(f"{path} is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise PeerError(f"{path} must hold a JSON object")
    connection = raw.get("connection", node_uuid)
    if not isinstance(connection, str) or not _NAME.match(connection):
        raise PeerError(f"{path}: bad connection name {connection!r}")
    swanctl = raw.get("swanctl")
    if swanctl is not None:
        if not isinstance(swanctl, dict):
            raise PeerError(f"{path}: 'swanctl' must be an object")
        try:
            render_swanctl([(connection, swanctl)])
        except PeerError as exc:
            raise PeerError(f"{path}: {exc}") from exc
    return Peer(node_uuid, connection, _serial(path, peers_dir, raw), swanctl)


def load_peer(peers_dir: str, node_uuid: str) -> Peer | None:
    """The peer mapping of ``node_uuid``, or None if the node has none.

    Raises:
        PeerError: if the mapping exists but is unusable.
    """
    if not _NAME.match(node_uuid):
        return None
    path = os.path.join(peers_dir, node_uuid + _SUFFIX)
    if not os.path.exists(path):
        return None
    return _parse(path, peers_dir, node_uuid)


def load_peers(peers_dir: str) -> list[Peer]:
    """Every peer mapping in ``peers_dir``, sorted by node UUID.

    Raises:
        PeerError: if the directory or a mapping in it is unusable.
    """
    try:
        names = sorted(os.listdir(peers_dir))
    except OSError as exc:
        raise PeerError(f"cannot list {peers_dir}: {exc.strerror}") from exc
    peers = []
    for name in names:
        node_uuid = name[: -len(_SUFFIX)]
        if name.endswith(_SUFFIX) and _NAME.match(node_uuid):
            peers.append(_parse(os.path.join(peers_dir, name), peers_dir, node_uuid))
    return peers


def _value(key: str, value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return ", ".join(_value(key, v) for v in value)
    if isinstance(value, str) and "\n" not in value and '"' not in value:
        return value if _BARE.match(value) else f'"{value}"'
    raise PeerError(f"unusable value for {key!r}: {value!r}")


def _section(name: str, body: Mapping[str, Any], depth: int) -> list[str]:
    if not _NAME.match(name):
        raise PeerError(f"bad swanctl key {name!r}")
    pad = "    " * depth
    lines = [f"{pad}{name} {{"]
    for key, value in body.items():
        if isinstance(value, dict):
            lines.extend(_section(key, value, depth + 1))
        else:
            if not _NAME.match(key):
                raise PeerError(f"bad swanctl key {key!r}")
            lines.append(f"{pad}    {key} = {_value(key, value)}")
    lines.append(f"{pad}}}")
    return lines


def render_swanctl(connections: Iterable[tuple[str, Mapping[str, Any]]]) -> str:
    """swanctl.conf text with a ``connections`` section of the given
    ``(name, settings)`` pairs.

    Raises:
        PeerError: on a key or value swanctl.conf cannot express.
    """
    body = {name: dict(settings) for name, settings in connections}
    header = "# Written by the trusted-cloud ipsec revocation action.\n"
    return header + "\n".join(_section("connections", body, 0)) + "\n"
