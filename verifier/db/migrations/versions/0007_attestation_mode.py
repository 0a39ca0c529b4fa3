"""Attestation mode: each node is attested by polling its agent
(``pull``, as before) or by judging the evidence its agent pushes
(``push``, issue 20). Rows written before this revision are ``pull``.

Revision ID: 0007
Revises: 0005 (the lead re-chains after 0006 at merge)
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.add_column(
            sa.Column(
                "attestation_mode",
                sa.String(8),
                nullable=False,
                server_default=sa.text("'pull'"),
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.drop_column("attestation_mode")
