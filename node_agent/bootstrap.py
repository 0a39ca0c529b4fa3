"""What a freshly booted VM tells its agent (ARCHITECTURE "Flows" 3).

``trusted-nova boot`` puts into the instance's user-data a cloud-config
part that makes cloud-init write the bootstrap configuration
(``/etc/trusted-cloud/bootstrap.json``: registrar URL, operator CA, boot
id) and the sealed payload. This module reads them, and the node UUID
from cloud-init's instance id, and merges them with ``[agent]`` options:

* options set in ``agent.conf`` (or ``agent.conf.d``) win; the bootstrap
  file fills ``registrar_url`` and ``ca_file`` left unset (its ``ca_pem``
  is written to ``<work_dir>/bootstrap-ca.pem``);
* ``uuid`` unset: ``v1.instance_id`` of cloud-init's
  ``instance-data.json``, else ``/var/lib/cloud/data/instance-id``; it must
  be a UUID (Nova's instance UUID);
* the payload envelope comes from cloud-init's copy of the user-data,
  bound to the boot id written beside it;
* ``push_url`` in the bootstrap file (``trusted-nova boot --mode push``)
  makes the agent push to it when ``[agent] push_url`` is unset.

The formats are parsed by :mod:`verifier.protocol.userdata`; this module
only reads files and turns failures into :class:`BootstrapError`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import logging
import os
import socket
from urllib.parse import urlsplit

from oslo_config import cfg

from node_agent.exceptions import BootstrapError, NodeAgentError
from node_agent.payload import write_file
from verifier.protocol import MalformedError, canonical_uuid
from verifier.protocol.userdata import (
    MAX_BOOTSTRAP_BYTES,
    BootstrapConfig,
    parse_user_data,
)

__all__ = ["BootPayload", "Settings", "contact_address", "read_bootstrap", "resolve"]

LOG = logging.getLogger(__name__)
BOOTSTRAP_CA = "bootstrap-ca.pem"
#: cloud-init's user-data copy is at most Nova's 49,149 bytes; leave room.
_MAX_USER_DATA = 1 << 20


@dataclasses.dataclass(frozen=True)
class BootPayload:
    """The sealed payload from the user-data and the UUID it is bound to."""

    envelope: bytes
    boot_id: str


@dataclasses.dataclass(frozen=True)
class Settings:
    """The agent's identity and contacts once options and files are merged.

    Attributes:
        uuid: the node UUID.
        registrar_url: the registrar (None: not configured anywhere).
        ca_file: the operator CA file (None: not configured anywhere).
        boot_payload: the payload from the user-data, if there is one.
        no_payload_reason: why there is none (for the tenant's refusal).
        contact_host: the address registered for verifiers and tenants.
        push_url: the verifier's push endpoint the tenant's bootstrap file
            names (the node was enrolled in push mode), else None.
    """

    uuid: str
    registrar_url: str | None
    ca_file: str | None
    boot_payload: BootPayload | None
    no_payload_reason: str
    contact_host: str
    push_url: str | None = None


def _read(path: str, limit: int) -> bytes | None:
    """The file's bytes, None if it does not exist.

    Raises:
        BootstrapError: unreadable or larger than ``limit``.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BootstrapError(f"cannot read {path}: {exc.strerror or exc}")
    if len(data) > limit:
        raise BootstrapError(f"{path} is larger than {limit} bytes")
    return data


def read_bootstrap(path: str) -> BootstrapConfig | None:
    """The bootstrap configuration, None if ``path`` is empty or absent.

    Raises:
        BootstrapError: unreadable or malformed.
    """
    if not path:
        return None
    raw = _read(path, MAX_BOOTSTRAP_BYTES)
    if raw is None:
        return None
    try:
        return BootstrapConfig.from_json(raw)
    except MalformedError as exc:
        raise BootstrapError(f"bootstrap file {path}: {exc}")


def instance_uuid(instance_data_file: str, instance_id_file: str) -> str:
    """The node UUID from cloud-init's instance id.

    Raises:
        BootstrapError: neither file gives one, or it is not a UUID.
    """
    raw = _read(instance_data_file, 4 << 20) if instance_data_file else None
    source = instance_data_file
    value: object = None
    if raw is not None:
        try:
            value = json.loads(raw)["v1"]["instance_id"]
        except (ValueError, KeyError, TypeError) as exc:
            raise BootstrapError(f"{instance_data_file} has no v1.instance_id: {exc!r}")
    else:
        raw = _read(instance_id_file, 4096) if instance_id_file else None
        source = instance_id_file
        if raw is None:
            raise BootstrapError(
                "[agent] uuid is not set and cloud-init wrote no instance id "
                f"({instance_data_file or '-'}, {instance_id_file or '-'})"
            )
        value = raw.decode("utf-8", "replace").strip()
    try:
        return canonical_uuid(str(value))
    except MalformedError:
        raise BootstrapError(
            f"the instance id {value!r} in {source} is not a UUID (is this a "
            "Nova instance? set [agent] uuid)"
        )


def read_boot_payload(path: str) -> tuple[BootPayload | None, str]:
    """The payload of trusted-boot user-data, or None and why not.

    A missing or foreign user-data is not an error of the agent: the
    tenant may still send the payload along with U.
    """
    if not path:
        return None, "the agent reads no user-data ([agent] user_data_file)"
    try:
        raw = _read(path, _MAX_USER_DATA)
    except BootstrapError as exc:
        return None, str(exc)
    if raw is None:
        return None, f"no user-data at {path}"
    try:
        parsed = parse_user_data(raw)
    except MalformedError as exc:
        return None, f"user-data {path} carries no trusted-boot payload: {exc}"
    return BootPayload(parsed.envelope, parsed.config.boot_id), ""


def contact_address(host: str, registrar_url: str | None) -> str:
    """The address others reach the agent at when it listens on ``host``.

    A wildcard ``host`` (``0.0.0.0``, ``::``) is not an address: the agent
    then registers the local address of its route to the registrar (the
    instance's address on the cloud network). Behind NAT or port forwarding
    set ``[agent] contact_host`` and ``contact_port`` instead (e.g. in
    ``/etc/trusted-cloud/agent.conf.d/`` from vendor-data).

    Raises:
        NodeAgentError: no route to the registrar (the network is not up
            yet; the agent is restarted).
    """
    try:
        wildcard = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        wildcard = False
    if not wildcard:
        return host
    target = urlsplit(registrar_url or "").hostname
    if not target:
        raise BootstrapError(
            f"[agent] host is {host}, and without contact_host or a registrar "
            "URL the agent does not know which address to register"
        )
    try:
        info = socket.getaddrinfo(target, 443, type=socket.SOCK_DGRAM)
        family, _, _, _, address = info[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)  # no packet is sent: only a route lookup
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise NodeAgentError(
            f"no route to the registrar {target} to find this node's address: {exc}"
        )


def resolve(opts: cfg.ConfigOpts.GroupAttr) -> Settings:
    """Merge the ``[agent]`` options with what cloud-init wrote.

    Raises:
        BootstrapError: a bootstrap file that is unreadable or malformed, no
            usable node UUID, or a CA that cannot be written.
        NodeAgentError: no route to the registrar to find the address to
            register (see :func:`contact_address`).
    """
    config = read_bootstrap(opts.bootstrap_file)
    uuid = opts.uuid or instance_uuid(opts.instance_data_file, opts.instance_id_file)
    registrar_url = opts.registrar_url or (config.registrar_url if config else None)
    ca_file = opts.ca_file
    if not ca_file and config is not None and config.ca_pem is not None:
        ca_file = os.path.join(opts.work_dir, BOOTSTRAP_CA)
        try:
            os.makedirs(opts.work_dir, mode=0o700, exist_ok=True)
            write_file(ca_file, config.ca_pem.encode(), 0o644)
        except OSError as exc:
            raise BootstrapError(f"cannot write {ca_file}: {exc.strerror or exc}")
    payload, reason = read_boot_payload(opts.user_data_file)
    if payload is not None and config is not None and payload.boot_id != config.boot_id:
        LOG.warning(
            "the boot id of %s (%s) differs from the user-data's (%s); the "
            "payload is opened with the user-data's",
            opts.bootstrap_file,
            config.boot_id,
            payload.boot_id,
        )
    contact = opts.contact_host or contact_address(opts.host, registrar_url)
    push_url = config.push_url if config is not None else None
    return Settings(uuid, registrar_url, ca_file, payload, reason, contact, push_url)
