"""Trusted compute pools (issue 29): compute hosts are nodes of kind
``host`` (a ``kind`` column on the node table, and ``verifier_hosts`` with
what only a host has: its hypervisor host name, its TPM's EK digest, its
proven swtpm local CA digest, its last host verdict and latest passing
host round); a guest's current compute host.

The registrar's 0015 builds on this revision (``down_revision =
"0014_hosts"``).

Revision ID: 0014_hosts
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014_hosts"
down_revision = "0013"

_NODES = "verifier_nodes"
_HOSTS = "verifier_hosts"


def upgrade() -> None:
    with op.batch_alter_table(_NODES) as batch:
        batch.add_column(
            sa.Column(
                "kind", sa.String(8), nullable=False, server_default=sa.text("'guest'")
            )
        )
        batch.add_column(sa.Column("compute_host", sa.String(255), nullable=True))
    op.create_index(f"ix_{_NODES}_kind", _NODES, ["kind"])
    op.create_index(f"ix_{_NODES}_compute_host", _NODES, ["compute_host"])
    op.create_table(
        _HOSTS,
        sa.Column("uuid", sa.String(36), primary_key=True),
        sa.Column("hypervisor_hostname", sa.String(255), nullable=False),
        sa.Column("ek_sha256", sa.String(64), nullable=False),
        sa.Column("ca_path", sa.Text(), nullable=False),
        sa.Column("ca_sha256", sa.String(64), nullable=True),
        sa.Column("trusted", sa.Boolean(), nullable=True),
        sa.Column("verdict_at", sa.Float(), nullable=True),
        sa.Column("last_round", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.UniqueConstraint("hypervisor_hostname"),
        sa.UniqueConstraint("ek_sha256"),
    )


def downgrade() -> None:
    op.drop_table(_HOSTS)
    op.drop_index(f"ix_{_NODES}_compute_host", _NODES)
    op.drop_index(f"ix_{_NODES}_kind", _NODES)
    with op.batch_alter_table(_NODES) as batch:
        batch.drop_column("compute_host")
        batch.drop_column("kind")
