"""Provider EK registrations: a vTPM's EK under the instance UUID.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.create_table(
        "registrar_provider_eks",
        sa.Column("uuid", sa.String(36), primary_key=True),
        sa.Column("ek_public", sa.LargeBinary, nullable=False),
        sa.Column("ek_certificate", sa.LargeBinary, nullable=True),
        sa.Column("provider", sa.String(255), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("registrar_provider_eks")
