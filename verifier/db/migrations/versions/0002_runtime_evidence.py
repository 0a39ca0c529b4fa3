"""Runtime evidence: stored runtime/measured-boot policies, node references
to them, and the node's IMA replay state.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "verifier_policies",
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column(
            "body",
            sa.LargeBinary().with_variant(mysql.LONGBLOB(), "mysql", "mariadb"),
            nullable=False,
        ),
        sa.Column("signature", sa.LargeBinary, nullable=True),
        sa.Column("entries", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("kind", "name", "version"),
    )
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.add_column(sa.Column("runtime_policy", sa.String(64), nullable=True))
        batch.add_column(sa.Column("mb_policy", sa.String(64), nullable=True))
        batch.add_column(sa.Column("ima_count", sa.Integer, nullable=True))
        batch.add_column(sa.Column("ima_pcr", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        for column in ("ima_pcr", "ima_count", "mb_policy", "runtime_policy"):
            batch.drop_column(column)
    op.drop_table("verifier_policies")
