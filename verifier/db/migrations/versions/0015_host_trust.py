"""Trusted compute pools (issue 29): each enrolled compute host's trust, as
the verifier last told the registrar (``PUT /v1/hosts/{host}/trust``).

Every existing host starts with no trust record (all columns NULL): with
``[registrar] host_trust = required`` its vTPMs cannot register until the
verifier has attested it; ``off`` keeps the old behaviour.

Revision ID: 0015_host_trust
Revises: 0014_hosts
"""

import sqlalchemy as sa
from alembic import op

revision = "0015_host_trust"
down_revision = "0014_hosts"

_TABLE = "registrar_host_cas"


def upgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.add_column(sa.Column("trusted", sa.Boolean, nullable=True))
        batch.add_column(sa.Column("trust_ca_sha256", sa.String(64), nullable=True))
        batch.add_column(sa.Column("trust_provider_uuid", sa.String(36), nullable=True))
        batch.add_column(sa.Column("trust_as_of", sa.Float, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.drop_column("trust_as_of")
        batch.drop_column("trust_provider_uuid")
        batch.drop_column("trust_ca_sha256")
        batch.drop_column("trusted")
