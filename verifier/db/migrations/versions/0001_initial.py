"""Initial schema: registrar agents, verifier nodes, revocation outbox.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "registrar_agents",
        sa.Column("uuid", sa.String(36), primary_key=True),
        sa.Column("ek_public", sa.LargeBinary, nullable=False),
        sa.Column("ek_certificate", sa.LargeBinary, nullable=True),
        sa.Column("ak_public", sa.LargeBinary, nullable=False),
        sa.Column("tls_cert", sa.Text, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("port", sa.Integer, nullable=False),
        sa.Column("challenge_digest", sa.LargeBinary, nullable=True),
        sa.Column("activated", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "verifier_nodes",
        sa.Column("uuid", sa.String(36), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False, index=True),
        sa.Column("policy", sa.Text, nullable=False),
        sa.Column("v_share", sa.LargeBinary, nullable=False),
        sa.Column("ak_public", sa.LargeBinary, nullable=False),
        sa.Column("tls_cert", sa.Text, nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("port", sa.Integer, nullable=False),
        sa.Column("reset_count", sa.Integer, nullable=True),
        sa.Column("restart_count", sa.Integer, nullable=True),
        sa.Column("clock", sa.Integer, nullable=True),
        sa.Column("last_attested_at", sa.Float, nullable=True),
        sa.Column("quotes_verified", sa.Integer, nullable=False),
        sa.Column("failure_reason", sa.Text, nullable=True),
        sa.Column("identity_cert", sa.Text, nullable=True),
        sa.Column("v_released", sa.Boolean, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "verifier_outbox",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("node_uuid", sa.String(36), nullable=False, index=True),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("delivered_at", sa.Float, nullable=True, index=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("last_error", sa.Text, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("verifier_outbox")
    op.drop_table("verifier_nodes")
    op.drop_table("registrar_agents")
