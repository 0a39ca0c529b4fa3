"""The ``vault`` action: cut a revoked node off from Vault (or OpenBao).

For a revoked node it, in this order:

1. finds the node's tokens: every token whose metadata key
   ``[action_vault] node_metadata_key`` (default ``node_uuid``) equals the
   node UUID (``auth/token/accessors`` + ``lookup-accessor``);
2. finds each transit key those tokens could read, asking Vault itself
   (``sys/capabilities-accessor`` on ``<transit>/decrypt/<key>``,
   ``<transit>/export/encryption-key/<key>`` and ``<transit>/backup/<key>``),
   and records that plan (``state_file``) before anything is revoked, so
   a retry still knows the keys once the tokens are gone;
3. rotates each of those keys once per event and, with ``keep_versions``,
   raises its ``min_decryption_version``;
4. revokes the tokens by accessor (Vault revokes their child tokens and
   leases with them) and every lease under ``lease_prefixes``;
5. revokes the node's PKI certificates: those whose subject CN is
   ``cert_common_name`` (``{uuid}`` = node UUID) or that carry the URI SAN
   ``urn:uuid:<node uuid>``.

Every step is idempotent: a second run finds no live token, skips keys
already rotated for the event and leaves revoked certificates revoked.
"""

from __future__ import annotations

import threading
from typing import Any

import hvac
from cryptography import x509
from cryptography.x509.oid import NameOID
from oslo_config import cfg
from oslo_log import log as logging

from ipsec_puppet_vault_hooks import _jsonl
from ipsec_puppet_vault_hooks.actions.base import Action
from ipsec_puppet_vault_hooks.conf import action_vault as vault_conf
from ipsec_puppet_vault_hooks.exceptions import HooksError
from verifier.protocol import RevocationEvent

__all__ = ["VaultAction"]

LOG = logging.getLogger(__name__)

_DECRYPT_CAPS = {"update", "create", "root", "sudo"}
_READ_CAPS = {"read", "root", "sudo"}


class VaultAction(Action):
    """Revokes a node's Vault tokens, leases and certificates and rotates
    the transit keys it could use.

    Raises:
        HooksError: if ``[action_vault] url`` or ``token_file`` is unset or
            the token file cannot be read.
    """

    name = "vault"

    def __init__(self, conf: cfg.ConfigOpts) -> None:
        super().__init__(conf)
        vault_conf.register_opts(conf)
        group = conf.action_vault
        if not group.url or not group.token_file:
            raise HooksError("[action_vault] url and token_file are required")
        try:
            with open(group.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise HooksError(f"[action_vault] token_file: {exc}") from exc
        cert = (group.cert_file, group.key_file) if group.cert_file else None
        self.client = hvac.Client(
            url=group.url,
            token=token,
            namespace=group.namespace,
            verify=group.ca_file or True,
            cert=cert,
            timeout=group.timeout,
        )
        self._group = group
        self._memory: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        # A token's metadata and a certificate's names never change, so
        # each accessor and serial is looked up once, not once per event.
        self._accessor_node: dict[str, str | None] = {}
        self._serial_names: dict[str, tuple[set[str], set[str]]] = {}

    # -- per-event progress ----------------------------------------------
    def _records(self, event_id: str) -> list[dict[str, Any]]:
        path = self._group.state_file
        records = _jsonl.read(path) if path else list(self._memory)
        return [r for r in records if r.get("event_id") == event_id]

    def _record(self, record: dict[str, Any]) -> None:
        if self._group.state_file:
            _jsonl.append(self._group.state_file, record)
        else:
            self._memory.append(record)

    # -- the action --------------------------------------------------------
    def _handle(self, event: RevocationEvent) -> None:
        with self._lock:
            node = event.node_uuid
            accessors = self._node_accessors(node)
            records = self._records(event.id)
            plans = [r for r in records if r.get("kind") == "plan"]
            if plans:
                keys = sorted({k for p in plans for k in p["keys"]})
            else:
                keys = self._readable_keys(accessors)
                self._record({"event_id": event.id, "kind": "plan", "keys": keys})
            rotated = {r["key"] for r in records if r.get("kind") == "rotated"}
            for key in keys:
                if key not in rotated:
                    self._rotate(key)
                    self._record({"event_id": event.id, "kind": "rotated", "key": key})
            for accessor in accessors:
                self.client.auth.token.revoke_accessor(accessor)
            for template in self._group.lease_prefixes:
                self.client.sys.revoke_prefix(template.format(uuid=node))
            revoked = self._revoke_certificates(node)
            LOG.warning(
                "Vault: node %s cut off: %d token(s) revoked, key(s) rotated %s, "
                "%d certificate(s) revoked",
                node,
                len(accessors),
                keys,
                revoked,
            )

    def _node_accessors(self, node: str) -> list[str]:
        try:
            listed = self.client.auth.token.list_accessors()
        except hvac.exceptions.InvalidPath:
            return []
        live = listed["data"]["keys"]
        known = self._accessor_node
        for accessor in set(known) - set(live):
            del known[accessor]  # revoked or expired
        found = []
        for accessor in live:
            if accessor not in known:
                try:
                    info = self.client.auth.token.lookup_accessor(accessor)
                except (hvac.exceptions.InvalidRequest, hvac.exceptions.Forbidden):
                    continue  # revoked or expired meanwhile
                meta = info["data"].get("meta") or {}
                known[accessor] = meta.get(self._group.node_metadata_key)
            if known[accessor] == node:
                found.append(accessor)
        return found

    def _transit_keys(self) -> list[str]:
        mount = self._group.transit_mount
        if not mount:
            return []
        try:
            listed = self.client.secrets.transit.list_keys(mount_point=mount)
        except hvac.exceptions.InvalidPath:
            return []  # no key yet
        return sorted(listed["data"]["keys"])

    def _readable_keys(self, accessors: list[str]) -> list[str]:
        if not accessors:
            return []
        mount = self._group.transit_mount
        paths = {
            key: (
                f"{mount}/decrypt/{key}",
                f"{mount}/export/encryption-key/{key}",
                f"{mount}/backup/{key}",
            )
            for key in self._transit_keys()
        }
        if not paths:
            return []
        readable: set[str] = set()
        for accessor in accessors:
            # One request per token, all keys' paths at once.
            answer = self.client.adapter.post(
                "/v1/sys/capabilities-accessor",
                json={
                    "accessor": accessor,
                    "paths": [p for triple in paths.values() for p in triple],
                },
            )
            caps = answer["data"]
            for key, (decrypt, *reads) in paths.items():
                if _DECRYPT_CAPS & set(caps.get(decrypt, ())) or any(
                    _READ_CAPS & set(caps.get(p, ())) for p in reads
                ):
                    readable.add(key)
        return sorted(readable)

    def _rotate(self, key: str) -> None:
        mount = self._group.transit_mount
        self.client.secrets.transit.rotate_key(key, mount_point=mount)
        keep = self._group.keep_versions
        if keep:
            latest = self.client.secrets.transit.read_key(key, mount_point=mount)[
                "data"
            ]["latest_version"]
            self.client.secrets.transit.update_key_configuration(
                key,
                min_decryption_version=max(1, latest - keep + 1),
                mount_point=mount,
            )

    def _revoke_certificates(self, node: str) -> int:
        mount = self._group.pki_mount
        if not mount:
            return 0
        try:
            serials = self.client.secrets.pki.list_certificates(mount_point=mount)
        except hvac.exceptions.InvalidPath:
            return 0
        common_name = self._group.cert_common_name.format(uuid=node)
        revoked = 0
        for serial in serials["data"]["keys"]:
            names = self._serial_names.get(serial)
            if names is None:
                data = self.client.secrets.pki.read_certificate(
                    serial, mount_point=mount
                )["data"]
                names = _names(
                    x509.load_pem_x509_certificate(data["certificate"].encode())
                )
                self._serial_names[serial] = names
            common_names, uris = names
            if common_name in common_names or f"urn:uuid:{node}" in uris:
                # Revoking a revoked certificate is a no-op in Vault.
                self.client.secrets.pki.revoke_certificate(serial, mount_point=mount)
                revoked += 1
        return revoked


def _names(cert: x509.Certificate) -> tuple[set[str], set[str]]:
    """The certificate's subject common names and URI SANs."""
    common_names = {
        str(n.value) for n in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    }
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return common_names, set()
    return common_names, set(
        san.value.get_values_for_type(x509.UniformResourceIdentifier)
    )
