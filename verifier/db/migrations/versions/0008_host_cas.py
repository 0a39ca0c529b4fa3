"""Host-bound vTPM EKs: each compute host's swtpm local CA, and the host
Nova placed each instance on.

Revision ID: 0008
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.create_table(
        "registrar_host_cas",
        sa.Column("host", sa.String(255), primary_key=True),
        sa.Column("ca_pem", sa.Text, nullable=False),
        sa.Column("provider", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )
    op.create_table(
        "registrar_instance_hosts",
        sa.Column("uuid", sa.String(36), primary_key=True),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("origin_host", sa.String(255), nullable=False),
        sa.Column("provider", sa.String(255), nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("registrar_instance_hosts")
    op.drop_table("registrar_host_cas")
