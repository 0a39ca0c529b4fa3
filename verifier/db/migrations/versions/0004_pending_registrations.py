"""Pending registrations: a re-registration waits here until its AK is
activated, and the registration in force stays as it is until then.

Existing registrations (``registrar_agents``) carry over unchanged.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"


def upgrade() -> None:
    op.create_table(
        "registrar_pending",
        sa.Column("challenge_digest", sa.String(64), primary_key=True),
        sa.Column("uuid", sa.String(36), nullable=False),
        sa.Column("ek_public", sa.LargeBinary, nullable=False),
        sa.Column("ek_certificate", sa.LargeBinary, nullable=True),
        sa.Column("ak_public", sa.LargeBinary, nullable=False),
        sa.Column("tls_cert", sa.Text, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("port", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_registrar_pending_uuid", "registrar_pending", ["uuid"])


def downgrade() -> None:
    op.drop_index("ix_registrar_pending_uuid", "registrar_pending")
    op.drop_table("registrar_pending")
