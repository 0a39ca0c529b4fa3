"""The key service: secrets, group keys and filegroup keys behind capabilities.

The verifier issues capabilities to attested nodes; this service checks
them locally (:class:`~verifier.protocol.capability.CapabilityChecker`),
never calling the verifier. It holds:

* **secrets** (e.g. LUKS volume keys) a tenant stored, released to a node
  holding a read capability for ``secret:<name>``;
* **LKH groups** (Ensemble): a node with a join capability for
  ``group:<id>`` joins (or resyncs) and gets its path keys; every member
  pulls the signed rekey messages;
* **filegroups** (Plutus): a node with a read capability for
  ``filegroup:<id>`` gets the key-regression state of the current version
  and is remembered as a reader.

One signed revocation event (Ed25519, from the verifier) revokes a node
everywhere at once: its capability epoch is bumped, it is removed from every
LKH group (one batch per group) and every filegroup it could read moves to a
new key version (lazy: nothing is re-encrypted now).

Every secret, group and filegroup belongs to a project: the one the
capability names (the verifier puts the node's owning project in it, under
its MAC). Each project has its own namespace: group ``web`` of project
alpha and group ``web`` of project beta are two groups, and a node of one
never reaches the other's. Rekey messages (public: keys wrapped) are served
from the group of the asking node's project, which the service learnt from
the node's capabilities.

State that must survive a restart (epochs, handled events, secrets,
filegroup seeds) is written atomically to a 0600 JSON file. LKH trees live
in memory: after a restart members resync by joining again. A filegroup
stored before projects (no project in its key) is adopted by the project
of the first of its former readers that asks for it again.
"""

from __future__ import annotations

import base64
import collections
import json
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ed25519

from verifier.exceptions import NotFoundError, RequestError
from verifier.protocol import EvidenceError, SignedEvent
from verifier.protocol.capability import Capability, CapabilityChecker, CapabilityError
from verifier.protocol.events import REVOKING_TYPES
from verifier.protocol.lkh import LkhTree, RekeyMessage, Welcome
from verifier.protocol.regression import KeyRegressionOwner, ReaderState

__all__ = ["KeyService"]

_MAX_LOG = 1024  # rekey messages kept per group for members catching up
_MAX_SECRET = 4096


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class KeyService:
    """The key service's state and rules (no HTTP here).

    Args:
        capability_key: MAC key shared with the verifier.
        event_keys: public keys whose revocation events are honoured.
        signing_key: signs LKH rekey messages.
        state_file: where durable state goes (None: memory only).
        degree: d of the LKH trees.
        clock: wall clock (seconds).
    """

    def __init__(
        self,
        capability_key: bytes,
        event_keys: list[ed25519.Ed25519PublicKey],
        signing_key: ed25519.Ed25519PrivateKey,
        state_file: str | None = None,
        degree: int = 4,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.checker = CapabilityChecker(capability_key)
        self._event_keys = event_keys
        self._signing_key = signing_key
        self._state_file = state_file
        self._degree = degree
        self._clock = clock
        self._secrets: dict[str, bytes] = {}
        self._handled: dict[str, str] = {}  # event id -> node
        self._groups: dict[str, LkhTree] = {}
        self._log: dict[str, collections.deque[RekeyMessage]] = {}
        self._filegroups: dict[str, KeyRegressionOwner] = {}
        self._readers: dict[str, set[str]] = {}
        #: node -> the project its capabilities name (to scope rekey reads)
        self._projects: dict[str, str] = {}
        self.revocations = 0
        self._load()

    # -- capabilities --------------------------------------------------------

    def check(
        self, token: object, obj: str, right: str, peer: str | None
    ) -> Capability:
        """Check a capability presented by the mTLS peer ``peer``.

        The capability must name the peer (a node's identity certificate
        has its UUID as CN), so a stolen capability is useless elsewhere.

        Raises:
            RequestError: 403 ``capability_<reason>``.
        """
        try:
            cap = self.checker.check_token(token, obj, right, self._clock())
        except CapabilityError as exc:
            raise RequestError(f"capability_{exc.reason}", exc.detail, 403)
        if peer is not None and peer != cap.node:
            self.checker.rejected["wrong_peer"] += 1
            raise RequestError(
                "capability_wrong_peer",
                f"capability of {cap.node} shown by {peer}",
                403,
            )
        return cap

    # -- revocation -----------------------------------------------------------

    def revoke(self, signed: Mapping[str, Any]) -> dict[str, Any]:
        """Act on one signed revocation event (idempotent by event id).

        Raises:
            MalformedError: the event does not parse.
            RequestError: 403 ``event_signature`` if no trusted key signed it.
        """
        parsed = SignedEvent.from_dict(signed)
        for key in self._event_keys:
            try:
                event = parsed.verify(key)
                break
            except EvidenceError:
                continue  # try the next trusted key
        else:
            raise RequestError(
                "event_signature", "revocation event not signed by a trusted key", 403
            )
        node = event.node_uuid
        if event.id in self._handled:  # write again: a failed write is retried
            self._save()
            return {"node": node, "epoch": self.checker.epoch(node), "duplicate": True}
        if event.type not in REVOKING_TYPES:  # a recovery takes nothing away
            return {"node": node, "epoch": self.checker.epoch(node), "duplicate": False}
        epoch = self.checker.bump(node)
        groups = [g for g, tree in self._groups.items() if node in tree]
        for gid in groups:
            self._append(gid, self._groups[gid].revoke([node]))
        winds = [f for f, readers in self._readers.items() if node in readers]
        for fg in winds:
            self._filegroups[fg].wind()
            self._readers[fg].discard(node)
        self._handled[event.id] = node
        self.revocations += 1
        self._save()
        return {
            "node": node,
            "epoch": epoch,
            "groups_rekeyed": groups,
            "filegroups_rotated": winds,
            "duplicate": False,
        }

    # -- secrets ---------------------------------------------------------------

    def put_secret(self, name: str, secret: bytes, project: str = "") -> None:
        """Store ``secret`` as ``name`` of ``project`` (each project has its
        own names: another project's secret of the same name is another
        secret)."""
        if not 0 < len(secret) <= _MAX_SECRET:
            raise RequestError("bad_field", f"secret must be 1..{_MAX_SECRET} bytes")
        self._secrets[_scoped(project, name)] = secret
        self._save()

    def get_secret(self, name: str, token: object, peer: str | None) -> bytes:
        """The secret ``name`` of the project the capability names.

        Raises: RequestError (403 on a refused capability, 404 if unknown,
        also for another project's).
        """
        cap = self.check(token, f"secret:{name}", "r", peer)
        key = _scoped(cap.project, name)
        if key not in self._secrets:
            raise NotFoundError("unknown_secret", f"no secret {name!r}")
        return self._secrets[key]

    # -- LKH groups -------------------------------------------------------------

    def _append(self, gid: str, message: RekeyMessage) -> None:
        self._log.setdefault(gid, collections.deque(maxlen=_MAX_LOG)).append(message)

    def join(self, gid: str, token: object, peer: str | None) -> Welcome:
        """Join ``gid`` of the capability's project (created on first
        join) or resync if already in it."""
        cap = self.check(token, f"group:{gid}", "j", peer)
        self._projects[cap.node] = cap.project
        key = _scoped(cap.project, gid)
        tree = self._groups.get(key)
        if tree is None:
            tree = self._groups[key] = LkhTree(gid, self._signing_key, self._degree)
        if cap.node in tree:
            return tree.welcome(cap.node)
        message, welcome = tree.join(cap.node)
        self._append(key, message)
        return welcome

    def _group_key(self, gid: str, peer: str | None) -> str:
        """Where the group ``gid`` that ``peer`` reads is kept: in the
        project of the node's capabilities. Without peer binding (no TLS,
        tests) the one group of that name, if it is unique.

        Raises:
            NotFoundError: ``unknown_group`` (also for a group of another
                project, and for a node the service has never seen).
        """
        if peer is not None:
            project = self._projects.get(peer)
            key = None if project is None else _scoped(project, gid)
        else:
            found = [k for k in self._groups if _unscoped(k)[1] == gid]
            key = found[0] if len(found) == 1 else None
        if key is None or key not in self._groups:
            raise NotFoundError("unknown_group", f"no group {gid!r}")
        return key

    def rekey_messages(
        self, gid: str, since: int, peer: str | None = None
    ) -> list[bytes]:
        """Signed rekey messages of ``peer``'s group ``gid`` after epoch
        ``since`` (public: keys wrapped).

        Raises:
            NotFoundError: unknown group (or another project's).
            RequestError: 409 ``resync`` when older messages were dropped.
        """
        key = self._group_key(gid, peer)
        log = self._log.get(key, collections.deque())
        if log and since < log[0].epoch - 1:
            raise RequestError("resync", "messages were dropped: join again", 409)
        return [m.to_bytes() for m in log if m.epoch > since]

    def group_epoch(self, gid: str, peer: str | None = None) -> int:
        return self._groups[self._group_key(gid, peer)].epoch

    # -- filegroups -------------------------------------------------------------

    def filegroup_state(self, fg: str, token: object, peer: str | None) -> ReaderState:
        """The current key-regression state for a reader of ``fg`` of the
        capability's project."""
        cap = self.check(token, f"filegroup:{fg}", "r", peer)
        self._projects[cap.node] = cap.project
        key = _scoped(cap.project, fg)
        owner = self._filegroups.get(key)
        if owner is None and cap.node in self._readers.get(fg, ()) and key != fg:
            # stored before projects: adopted by a former reader's project
            owner = self._filegroups[key] = self._filegroups.pop(fg)
            self._readers[key] = self._readers.pop(fg)
        if owner is None:
            owner = self._filegroups[key] = KeyRegressionOwner(fg)
        self._readers.setdefault(key, set()).add(cap.node)
        self._save()
        return owner.reader_state()

    # -- what a project sees (Keystone) ------------------------------------------

    def groups(self, scope: str | None) -> list[dict[str, Any]]:
        """The LKH groups of project ``scope`` (None: every project)."""
        out = []
        for key, tree in sorted(self._groups.items()):
            project, gid = _unscoped(key)
            if scope is None or project == scope:
                out.append(
                    {"group": gid, "project": project, "epoch": tree.epoch,
                     "members": len(tree.members())}
                )  # fmt: skip
        return out

    def filegroups(self, scope: str | None) -> list[dict[str, Any]]:
        """The filegroups of project ``scope`` (None: every project)."""
        out = []
        for key, owner in sorted(self._filegroups.items()):
            project, fg = _unscoped(key)
            if scope is None or project == scope:
                out.append(
                    {"filegroup": fg, "project": project, "version": owner.version,
                     "readers": len(self._readers.get(key, ()))}
                )  # fmt: skip
        return out

    def find(self, kind: str, name: str, project: str) -> dict[str, Any]:
        """Group or filegroup (``kind``) ``name`` of ``project``.

        Raises:
            NotFoundError: ``unknown_<kind>``, also for another project's.
        """
        listed = self.groups(project) if kind == "group" else self.filegroups(project)
        for item in listed:
            if item[kind] == name:
                return item
        raise NotFoundError(f"unknown_{kind}", f"no {kind} {name!r}")

    # -- stats and persistence ----------------------------------------------------

    def stats(self) -> dict[str, Any]:
        return {
            "capabilities_accepted": self.checker.accepted,
            "capabilities_rejected": dict(self.checker.rejected),
            "revocations": self.revocations,
            "groups": {g: t.epoch for g, t in self._groups.items()},
            "filegroups": {f: o.version for f, o in self._filegroups.items()},
        }

    def _save(self) -> None:
        if self._state_file is None:
            return
        state = {
            "epochs": self.checker.epochs(),
            "handled": self._handled,
            "secrets": {n: _b64(s) for n, s in self._secrets.items()},
            "filegroups": {
                f: {
                    "name": o.group,
                    "seed": _b64(o._seed),
                    "length": o.length,
                    "version": o.version,
                    "readers": sorted(self._readers.get(f, ())),
                }
                for f, o in self._filegroups.items()
            },
        }
        tmp = f"{self._state_file}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._state_file)

    def _load(self) -> None:
        if self._state_file is None or not os.path.exists(self._state_file):
            return
        with open(self._state_file, encoding="utf-8") as f:
            state = json.load(f)
        self.checker = CapabilityChecker(self.checker._key, state["epochs"])
        self._handled = dict(state["handled"])
        self._secrets = {n: base64.b64decode(s) for n, s in state["secrets"].items()}
        for fg, data in state["filegroups"].items():
            self._filegroups[fg] = KeyRegressionOwner(
                data.get("name", fg),  # stored before projects: the key
                base64.b64decode(data["seed"]),
                data["length"],
                data["version"],
            )
            self._readers[fg] = set(data["readers"])


def _scoped(project: str, name: str) -> str:
    """Where a project's secret, group or filegroup is kept ("/" is in
    neither part); those of no project (a ``noauth`` tenant certificate
    without one, or stored before projects) keep their bare name."""
    return f"{project}/{name}" if project else name


def _unscoped(key: str) -> tuple[str, str]:
    """(project, name) of a key made by :func:`_scoped`."""
    project, _, name = key.rpartition("/")
    return project, name
