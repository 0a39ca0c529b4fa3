"""SQLAlchemy models of the registrar and verifier databases."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: Policies can be tens of MiB: MySQL/MariaDB's BLOB stops at 64 KiB.
BIG_BINARY = LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
# a SHA-256 digest as a key: MySQL/MariaDB cannot index a BLOB without a length
DIGEST = LargeBinary(32).with_variant(mysql.VARBINARY(32), "mysql", "mariadb")


class Base(DeclarativeBase):
    pass


class RegisteredAgent(Base):
    """A node's TPM identity as the registrar knows it."""

    __tablename__ = "registrar_agents"

    uuid: Mapped[str] = mapped_column(String(36), primary_key=True)
    ek_public: Mapped[bytes] = mapped_column(LargeBinary)
    ek_certificate: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    ak_public: Mapped[bytes] = mapped_column(LargeBinary)
    tls_cert: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    challenge_digest: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    activated: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class PendingRegistration(Base):
    """A registration waiting for its AK to be activated.

    The registration in force (:class:`RegisteredAgent`) is replaced only
    when the TPM answers this challenge; until then anyone who knows a
    node's public EK can add a pending registration, but cannot disturb the
    one in force. Keyed by the SHA-256 (hex) of the challenge's credential,
    so an activation finds exactly the registration it answers.
    """

    __tablename__ = "registrar_pending"

    challenge_digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    uuid: Mapped[str] = mapped_column(String(36), index=True)
    ek_public: Mapped[bytes] = mapped_column(LargeBinary)
    ek_certificate: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    ak_public: Mapped[bytes] = mapped_column(LargeBinary)
    tls_cert: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class ProviderEk(Base):
    """A vTPM's EK as the cloud provider (the compute host) registered it
    under the instance UUID, before the guest could speak for itself."""

    __tablename__ = "registrar_provider_eks"

    uuid: Mapped[str] = mapped_column(String(36), primary_key=True)
    ek_public: Mapped[bytes] = mapped_column(LargeBinary)
    ek_certificate: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    provider: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)


class HostCa(Base):
    """A compute host's swtpm local CA, enrolled by the provider: the only
    issuer of EK certificates for vTPMs of instances placed on that host."""

    __tablename__ = "registrar_host_cas"

    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    ca_pem: Mapped[str] = mapped_column(Text)
    provider: Mapped[str] = mapped_column(String(255))
    updated_at: Mapped[float] = mapped_column(Float)
    # The verifier's last word on the host (trusted compute pools; all
    # None until it speaks: the host is then untrusted).
    trusted: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    trust_ca_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    trust_provider_uuid: Mapped[str | None] = mapped_column(String(36), nullable=True)
    trust_as_of: Mapped[float | None] = mapped_column(Float, nullable=True)


class InstancePlacement(Base):
    """The compute host Nova placed an instance on (from its notifications).

    ``origin_host`` is the first one: its CA signed the vTPM's EK
    certificate, which Nova's resize and cold migration carry along with
    the vTPM state to ``host``.
    """

    __tablename__ = "registrar_instance_hosts"

    uuid: Mapped[str] = mapped_column(String(36), primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    origin_host: Mapped[str] = mapped_column(String(255))
    provider: Mapped[str] = mapped_column(String(255))
    updated_at: Mapped[float] = mapped_column(Float)


class Node(Base):
    """A node under continuous attestation by the verifier."""

    __tablename__ = "verifier_nodes"

    uuid: Mapped[str] = mapped_column(String(36), primary_key=True)
    state: Mapped[str] = mapped_column(String(16), index=True)
    # ownership (0005): the Keystone project; "" for rows from before it
    project_id: Mapped[str] = mapped_column(
        String(64), index=True, default="", server_default=text("''")
    )
    policy: Mapped[str] = mapped_column(Text)
    v_share: Mapped[bytes] = mapped_column(LargeBinary)
    # the enroller's commitment to U (0006); None for rows from before it
    u_commitment: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    ak_public: Mapped[bytes] = mapped_column(LargeBinary)
    tls_cert: Mapped[str] = mapped_column(Text)
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    # TPMS_CLOCK_INFO: uint32 counters, uint64 clock (0016)
    reset_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    restart_count: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    clock: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    last_attested_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    quotes_verified: Mapped[int] = mapped_column(Integer, default=0)
    failure_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    identity_cert: Mapped[str | None] = mapped_column(Text, nullable=True)
    v_released: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    # runtime evidence (0002): policy digests, and the IMA replay so far
    runtime_policy: Mapped[str | None] = mapped_column(String(64), nullable=True)
    mb_policy: Mapped[str | None] = mapped_column(String(64), nullable=True)
    ima_count: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ima_pcr: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # push attestation (0007): "pull" (the verifier polls) or "push"
    attestation_mode: Mapped[str] = mapped_column(
        String(8), default="pull", server_default=text("'pull'")
    )
    # verification classes (0010): its own seconds between quotes, None
    # for the verifier's quote_interval
    quote_interval: Mapped[float | None] = mapped_column(Float, nullable=True)
    # policies that follow the node (0011): the name of the runtime and
    # measured-boot policy it follows (the newest version of that name in
    # its project is in force), None when the one in force is pinned
    runtime_policy_follow: Mapped[str | None] = mapped_column(
        String(255), nullable=True
    )
    mb_policy_follow: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # trusted compute pools (0014): "guest" (a tenant's node) or "host" (a
    # compute host, owned by no project, see :class:`Host`); a guest's
    # current compute host (its hypervisor host name, from Nova's
    # notifications), None while unknown
    kind: Mapped[str] = mapped_column(
        String(8), default="guest", server_default=text("'guest'"), index=True
    )
    compute_host: Mapped[str | None] = mapped_column(
        String(255), nullable=True, index=True
    )


class Host(Base):
    """A compute host enrolled for attestation (0014): a node of kind
    ``host`` whose UUID is its compute node's Placement resource provider.

    ``ek_sha256`` names its TPM (one TPM, one host); ``ca_sha256`` is the
    digest of the swtpm local CA certificate file its attested IMA list
    showed (None: not proven yet); ``trusted`` is its last host verdict
    (None: not known: not attested yet, unreachable or failed) as of
    ``verdict_at``; ``last_round`` the latest passing host round of the
    batched deep quote (JSON, :class:`verifier.protocol.hostbatch.HostRound`).
    """

    __tablename__ = "verifier_hosts"

    uuid: Mapped[str] = mapped_column(String(36), primary_key=True)
    hypervisor_hostname: Mapped[str] = mapped_column(String(255), unique=True)
    ek_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    ca_path: Mapped[str] = mapped_column(Text)
    ca_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    trusted: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    verdict_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_round: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)


class OutboxEvent(Base):
    """A signed revocation event waiting for (or past) delivery."""

    __tablename__ = "verifier_outbox"
    # the listing's keyset pages, newest first (0013)
    __table_args__ = (
        Index("ix_verifier_outbox_project_time", "project_id", "created_at", "id"),
        Index("ix_verifier_outbox_time", "created_at", "id"),
        Index("ix_verifier_outbox_project_type", "project_id", "type", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    node_uuid: Mapped[str] = mapped_column(String(36), index=True)
    project_id: Mapped[str] = mapped_column(
        String(64), index=True, default="", server_default=text("''")
    )
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # the event's type and reason, for the listing's filters (0013); the
    # reason only when a query may name it (at most 64 characters)
    type: Mapped[str | None] = mapped_column(String(32), nullable=True)
    reason: Mapped[str | None] = mapped_column(String(64), nullable=True)


class StoredPolicy(Base):
    """A runtime (IMA) or measured-boot policy, stored once by content
    digest and referenced by any number of nodes."""

    __tablename__ = "verifier_policies"
    __table_args__ = (UniqueConstraint("project_id", "kind", "name", "version"),)

    project_id: Mapped[str] = mapped_column(
        String(64), primary_key=True, server_default=text("''")
    )
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(255))
    version: Mapped[int] = mapped_column(Integer)
    body: Mapped[bytes] = mapped_column(BIG_BINARY)
    signature: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    entries: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)


class PushSession(Base):
    """A push agent's session, opened with its AK (issue 20): shared by
    every verifier process of a deployment and kept across restarts.
    Found by the SHA-256 of its bearer token (never stored in clear)."""

    __tablename__ = "verifier_push_sessions"

    token_digest: Mapped[bytes] = mapped_column(DIGEST, primary_key=True)
    node_uuid: Mapped[str] = mapped_column(String(36), index=True)
    expires_at: Mapped[float] = mapped_column(Float, index=True)


class RelayState(Base):
    """The tenant's relay to one node (``verifier.protocol.relay``): its
    identity ask and answer and U on its way, as the ledger exports them
    (JSON; U only as the envelope sealed to the node's NK). Kept across
    restarts of the verifier process that attests the node."""

    __tablename__ = "verifier_relay"

    node_uuid: Mapped[str] = mapped_column(String(36), primary_key=True)
    body: Mapped[bytes] = mapped_column(BIG_BINARY)
    updated_at: Mapped[float] = mapped_column(Float)


class LogEntryRow(Base):
    """An entry of the attestation log (issue 30): staged in the
    transaction of the state change it records (``leaf_index`` None, the
    fields in their columns), then sequenced: given the next leaf index,
    the same node's previous one (``prev_index``) and its canonical bytes
    (``body``, :class:`verifier.protocol.translog.LogEntry`). Retention
    clears ``body`` (``pruned``); the tree's hashes stay."""

    __tablename__ = "verifier_log_entries"
    # a node's entries in log order; not the project's (a project holds
    # many nodes: the planner must start from the node)
    __table_args__ = (Index("ix_verifier_log_entries_node", "node_uuid", "leaf_index"),)

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"),
        primary_key=True,
        autoincrement=True,
    )
    leaf_index: Mapped[int | None] = mapped_column(
        BigInteger, nullable=True, unique=True
    )
    prev_index: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    node_uuid: Mapped[str] = mapped_column(String(36))
    project_id: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(32))
    # the staged fields; cleared once ``body`` holds them
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    event_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    body: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    pruned: Mapped[bool] = mapped_column(Boolean, default=False)


class LogNode(Base):
    """A complete perfect subtree of the log's Merkle tree: level 0 the
    leaf hashes; (level, idx) covers leaves [idx*2^level, (idx+1)*2^level)."""

    __tablename__ = "verifier_log_nodes"

    level: Mapped[int] = mapped_column(Integer, primary_key=True)
    idx: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    hash: Mapped[bytes] = mapped_column(DIGEST)


class LogHead(Base):
    """The log's head (one row, ``id`` 1): its size, right edge (the
    Frontier as JSON), root and latest signed checkpoint note; locked by
    the sequencer (``FOR UPDATE``) so one process appends at a time."""

    __tablename__ = "verifier_log_head"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    frontier: Mapped[str] = mapped_column(Text)
    root: Mapped[bytes] = mapped_column(DIGEST)
    checkpoint: Mapped[str] = mapped_column(Text)
    pruned_below: Mapped[int] = mapped_column(
        BigInteger, default=0, server_default=text("0")
    )
    updated_at: Mapped[float] = mapped_column(Float)
