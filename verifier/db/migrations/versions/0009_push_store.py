"""Shared push store (issue 20): push sessions and the tenant's relay
state move from one verifier process's memory into the database, so a
restarted verifier (or another process of the deployment) honours an
agent's session and a tenant's pending identity ask or U.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0009"
down_revision = "0008"

_BIG = sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb")
# a key: MySQL/MariaDB cannot index a BLOB without a length
_DIGEST = sa.LargeBinary(32).with_variant(mysql.VARBINARY(32), "mysql", "mariadb")


def upgrade() -> None:
    op.create_table(
        "verifier_push_sessions",
        sa.Column("token_digest", _DIGEST, primary_key=True),
        sa.Column("node_uuid", sa.String(36), nullable=False),
        sa.Column("expires_at", sa.Float(), nullable=False),
    )
    op.create_index(
        "ix_verifier_push_sessions_node_uuid", "verifier_push_sessions", ["node_uuid"]
    )
    op.create_index(
        "ix_verifier_push_sessions_expires_at",
        "verifier_push_sessions",
        ["expires_at"],
    )
    op.create_table(
        "verifier_relay",
        sa.Column("node_uuid", sa.String(36), primary_key=True),
        sa.Column("body", _BIG, nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("verifier_relay")
    op.drop_index("ix_verifier_push_sessions_expires_at", "verifier_push_sessions")
    op.drop_index("ix_verifier_push_sessions_node_uuid", "verifier_push_sessions")
    op.drop_table("verifier_push_sessions")
