"""Provider EK registrations: a vTPM's EK under the instance UUID.

Revision ID: 0002_provider_eks
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_provider_eks"
down_revision = "0001"


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
