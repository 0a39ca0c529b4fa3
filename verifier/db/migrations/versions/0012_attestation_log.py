"""The attestation log (issue 30): entries staged with the state change
they record and then sequenced into an RFC 9162 Merkle tree, the tree's
complete perfect subtrees, and its head (size, right edge, signed
checkpoint).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0012"
down_revision = "0011"

_DIGEST = sa.LargeBinary(32).with_variant(mysql.VARBINARY(32), "mysql", "mariadb")
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_ENTRIES = "verifier_log_entries"


def upgrade() -> None:
    op.create_table(
        _ENTRIES,
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("leaf_index", sa.BigInteger(), nullable=True),
        sa.Column("prev_index", sa.BigInteger(), nullable=True),
        sa.Column("node_uuid", sa.String(36), nullable=False),
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("event_id", sa.String(36), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=True),
        sa.Column("pruned", sa.Boolean(), nullable=False),
        sa.UniqueConstraint("leaf_index"),
    )
    # a node's entries in log order; not the project's (a project holds
    # many nodes: the planner must start from the node)
    op.create_index(f"ix_{_ENTRIES}_node", _ENTRIES, ["node_uuid", "leaf_index"])
    op.create_index(f"ix_{_ENTRIES}_created_at", _ENTRIES, ["created_at"])
    op.create_table(
        "verifier_log_nodes",
        sa.Column("level", sa.Integer(), primary_key=True),
        sa.Column("idx", sa.BigInteger(), primary_key=True),
        sa.Column("hash", _DIGEST, nullable=False),
    )
    op.create_table(
        "verifier_log_head",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("frontier", sa.Text(), nullable=False),
        sa.Column("root", _DIGEST, nullable=False),
        sa.Column("checkpoint", sa.Text(), nullable=False),
        sa.Column("pruned_below", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("verifier_log_head")
    op.drop_table("verifier_log_nodes")
    op.drop_index(f"ix_{_ENTRIES}_created_at", _ENTRIES)
    op.drop_index(f"ix_{_ENTRIES}_node", _ENTRIES)
    op.drop_table(_ENTRIES)
