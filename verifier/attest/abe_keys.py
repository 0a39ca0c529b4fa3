"""The verifier as Excalibur's monitor: CP-ABE keys for attested nodes.

A node's attributes come only from what the verifier attested and what
the provider knows, never from the node or the tenant:

* the operator's per-node entry in ``[abe] provider_attributes_file``
  (host, hypervisor version, region, availability zone, image, ...);
* ``pcrs=<hex>``: the SHA-256 PCR digest of the node's latest verified
  quote (the TPMS_ATTEST pcrDigest the AK signed);
* ``epoch=<n>``: the key epoch (see below);
* ``project=<id>``: the Keystone project that owns the node. Tenants seal
  to ``... and project=<their project>`` (the tool adds it, with the
  project :meth:`AbeAuthority.params` names), so a node of another project
  with the same configuration cannot open it. A node without a project
  (enrolled before projects) gets no key.

After each valid quote :meth:`AbeAuthority.after_quote` makes sure the
node holds the key for its current attribute set: keys are cached per
attribute set (identical configurations share one key), sealed to the
node's quoted transport key NK and posted to the agent. A revoked node is
no longer quoted, so it gets no new key.

CP-ABE cannot take back a key already issued. So each revocation starts a
new epoch: tenants seal to ``(policy) and epoch=<current>``, every
attested node receives the new epoch's key at its next quote, and the
revoked node does not. Data sealed after the revocation is closed to it;
data sealed before stays open to the keys it already had.

The master key and the epoch live in one file, 0600, written atomically.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import threading

from verifier.attest.clients import VerifierAgentClient
from verifier.attest.node import LiveNode
from verifier.exceptions import AgentUnreachableError, ConfigError
from verifier.protocol import MalformedError, ShareKind, TpmAttest, seal_share
from verifier.protocol.abe import (
    AbeError,
    MasterKey,
    PublicParams,
    keygen,
    parse_attribute,
    setup,
)
from verifier.protocol.messages.abe import AbeKeyDelivery, AbeParams

__all__ = ["AbeAuthority", "ProviderAttributes", "load_master_key"]

LOG = logging.getLogger(__name__)
RESERVED = frozenset({"pcrs", "epoch", "project"})


def _write_secret(path: str, data: bytes) -> None:
    tmp = f"{path}.tmp.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_master_key(path: str) -> tuple[PublicParams, MasterKey, int]:
    """Read (or create, 0600) the master key file.

    Returns:
        The public parameters, the master key and the current epoch.

    Raises:
        ConfigError: unreadable, readable by group/others, or malformed.
    """
    if not os.path.exists(path):
        pp, msk = setup()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        _store(path, pp, msk, 0)
        return pp, msk, 0
    try:
        mode = os.stat(path).st_mode
        if mode & 0o077:
            raise ConfigError(
                f"[abe] master_key_file {path} is readable by others "
                f"(mode {mode & 0o777:o}); chmod 600 it"
            )
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        pp = PublicParams.from_bytes(base64.b64decode(data["public_params"]))
        msk = MasterKey.from_bytes(base64.b64decode(data["master_key"]))
        epoch = int(data["epoch"])
    except (OSError, ValueError, KeyError, TypeError, MalformedError) as exc:
        raise ConfigError(f"[abe] master_key_file {path}: {exc}")
    if msk.pp_id != pp.id:
        raise ConfigError(f"[abe] master_key_file {path}: keys do not match")
    return pp, msk, epoch


def _store(path: str, pp: PublicParams, msk: MasterKey, epoch: int) -> None:
    body = {
        "public_params": base64.b64encode(pp.to_bytes()).decode(),
        "master_key": base64.b64encode(msk.to_bytes()).decode(),
        "epoch": epoch,
    }
    _write_secret(path, json.dumps(body).encode())


class ProviderAttributes:
    """The operator's node UUID -> attributes file, re-read when it changes.

    Raises (on read):
        ConfigError: the file is not a JSON object of objects of strings,
            or an attribute cannot be encoded.
    """

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._stamp: tuple[int, int] | None = None
        self._table: dict[str, frozenset[str]] = {}

    def get(self, uuid: str) -> frozenset[str] | None:
        if self._path is None:
            return None
        st = os.stat(self._path)
        if self._stamp != (st.st_mtime_ns, st.st_size):
            self._table = self._load(self._path)
            self._stamp = (st.st_mtime_ns, st.st_size)
        return self._table.get(uuid)

    @staticmethod
    def _load(path: str) -> dict[str, frozenset[str]]:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"[abe] provider_attributes_file {path}: {exc}")
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: must map node UUIDs to attribute objects")
        table = {}
        for uuid, attrs in data.items():
            if not isinstance(attrs, dict):
                raise ConfigError(f"{path}: node {uuid}: attributes must be an object")
            items = set()
            for name, value in attrs.items():
                if name in RESERVED or not isinstance(value, str):
                    raise ConfigError(
                        f"{path}: node {uuid}: {name!r} is reserved or not a string"
                    )
                try:
                    items.add(str(parse_attribute(f"{name}={value}")))
                except (AbeError, MalformedError) as exc:
                    raise ConfigError(f"{path}: node {uuid}: {exc}")
            table[str(uuid).lower()] = frozenset(items)
        return table


#: epoch, attributes and NK of a key a node holds
_Delivered = tuple[int, frozenset[str], bytes]


class AbeAuthority:
    """Issues and caches CP-ABE keys; keeps the epoch.

    Args:
        path: the master key file (see :func:`load_master_key`).
        provider: the provider-known attributes.
        agents: the verifier's client for node agents.
    """

    def __init__(
        self, path: str, provider: ProviderAttributes, agents: VerifierAgentClient
    ) -> None:
        self._path = path
        self.pp, self._msk, self.epoch = load_master_key(path)
        self._provider = provider
        self._agents = agents
        self._cache: dict[frozenset[str], bytes] = {}
        #: node -> (epoch, attributes, NK) of the key it holds; a new NK
        #: (the node was re-enrolled) gets the key again
        self._delivered: dict[str, tuple[int, frozenset[str], bytes]] = {}
        self._lock = threading.Lock()
        self.keygens = 0  # distinct keys made (tests and operators)

    def params(self, project: str | None = "") -> AbeParams:
        """What tenants fetch to seal: the public parameters, the epoch and
        ``project``, the caller's project its nodes' keys name."""
        return AbeParams(self.pp, self.epoch, project or "")

    def attributes(
        self, uuid: str, pcr_digest: bytes, project: str
    ) -> frozenset[str] | None:
        """The attribute set of node ``uuid`` of ``project``, or None
        without a provider entry or a project.

        Raises:
            ConfigError: the project cannot be an attribute value.
        """
        provider = self._provider.get(uuid)
        if provider is None or not project:
            return None
        try:
            owner = str(parse_attribute(f"project={project}"))
        except (AbeError, MalformedError) as exc:
            raise ConfigError(f"project {project!r} is no attribute value: {exc}")
        return provider | {f"pcrs={pcr_digest.hex()}", f"epoch={self.epoch}", owner}

    def key_for(self, attributes: frozenset[str]) -> bytes:
        """The (cached) encoded key for exactly ``attributes``."""
        with self._lock:
            key = self._cache.get(attributes)
            if key is None:
                key = keygen(self._msk, sorted(attributes)).to_bytes()
                self._cache[attributes] = key
                self.keygens += 1
            return key

    def revoked(self, uuid: str) -> None:
        """A node was revoked: start a new epoch (persisted first)."""
        with self._lock:
            _store(self._path, self.pp, self._msk, self.epoch + 1)
            self.epoch += 1
            self._cache.clear()
            self._delivered.pop(uuid, None)
        LOG.info("Node %s revoked: CP-ABE key epoch is now %d", uuid, self.epoch)

    def owed(
        self, node: LiveNode, attest: TpmAttest, nk: bytes
    ) -> tuple[AbeKeyDelivery, _Delivered] | None:
        """The key a node that just passed a quote (``attest``, bound to
        its transport key ``nk``) is owed, sealed to ``nk``, and what to
        pass :meth:`delivered` once it is handed over; None when it holds
        it already or has no provider attributes."""
        try:
            attrs = self.attributes(node.uuid, attest.pcr_digest, node.project_id)
        except (ConfigError, OSError) as exc:
            LOG.error("No CP-ABE key for %s: provider attributes: %s", node.uuid, exc)
            return None
        if attrs is None or self._delivered.get(node.uuid) == (self.epoch, attrs, nk):
            return None
        epoch = self.epoch
        key = self.key_for(attrs)
        delivery = AbeKeyDelivery(
            seal_share(nk, key, ShareKind.ABE, node.uuid), self.pp.to_bytes(), epoch
        )
        return delivery, (epoch, attrs, nk)

    def delivered(self, uuid: str, marker: _Delivered) -> None:
        """The key of :meth:`owed` reached the node."""
        epoch, attrs, _ = marker
        if epoch == self.epoch:
            self._delivered[uuid] = marker
            LOG.info(
                "Node %s holds the CP-ABE key for %d attributes (epoch %d)",
                uuid,
                len(attrs),
                epoch,
            )

    async def after_quote(self, node: LiveNode, attest: TpmAttest, nk: bytes) -> None:
        """Give a node that just passed a quote (``attest``, bound to its
        transport key ``nk``) the key for its attributes."""
        owed = self.owed(node, attest, nk)
        if owed is None:
            return
        delivery, marker = owed
        try:
            await self._agents.call(
                "POST",
                node.base_url,
                node.tls_cert,
                "/v1/keys/abe",
                body=delivery.to_dict(),
            )
        except (AgentUnreachableError, MalformedError) as exc:  # retried next quote
            LOG.warning("Could not deliver a CP-ABE key to %s yet: %s", node.uuid, exc)
            return
        self.delivered(node.uuid, marker)
