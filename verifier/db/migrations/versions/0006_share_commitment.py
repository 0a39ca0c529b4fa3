"""The enroller's commitment to share U: the verifier stores it with V and
releases it to the node with V, and the node combines V only with the U
that matches it (:mod:`verifier.protocol.enroller`).

Nodes enrolled before this revision get no commitment (NULL): their agents
take U only from a tenant certificate, as before.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"


def upgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.add_column(sa.Column("u_commitment", sa.LargeBinary, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.drop_column("u_commitment")
