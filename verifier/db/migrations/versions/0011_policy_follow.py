"""Policies that follow the node (issue 28): the name of the runtime and
measured-boot policy a node follows, whose newest version in the node's
project is in force. Rows written before this revision pin the policy
they reference (None).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"


def upgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.add_column(
            sa.Column("runtime_policy_follow", sa.String(255), nullable=True)
        )
        batch.add_column(sa.Column("mb_policy_follow", sa.String(255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.drop_column("mb_policy_follow")
        batch.drop_column("runtime_policy_follow")
