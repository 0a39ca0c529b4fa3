"""Verification classes: a node's own quote interval (issue 19), so that a
tenant can watch some nodes more often than others. Rows written before
this revision have none: they are quoted at the verifier's
``quote_interval``.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"


def upgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.add_column(sa.Column("quote_interval", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.drop_column("quote_interval")
