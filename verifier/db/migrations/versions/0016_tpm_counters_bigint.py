"""A node's TPM clock and counters as 64-bit integers.

``resetCount`` and ``restartCount`` of a quote's TPMS_CLOCK_INFO are
unsigned 32-bit values (obfuscated by the TPM, so any value up to 2**32 - 1
is common) and ``clock`` is an unsigned 64-bit count of milliseconds;
INTEGER on PostgreSQL and MySQL/MariaDB is signed 32-bit, so most nodes
failed there with ``integer out of range`` at their first quote. SQLite's
INTEGER already held them (the column's declared type changes only).

Revision ID: 0016_tpm_counters_bigint
Revises: 0015_host_trust
"""

import sqlalchemy as sa
from alembic import op

revision = "0016_tpm_counters_bigint"
down_revision = "0015_host_trust"

_TABLE = "verifier_nodes"
_COLUMNS = ("reset_count", "restart_count", "clock")


def upgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        for name in _COLUMNS:
            batch.alter_column(
                name,
                type_=sa.BigInteger,
                existing_type=sa.Integer,
                existing_nullable=True,
            )


def downgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        for name in _COLUMNS:
            batch.alter_column(
                name,
                type_=sa.Integer,
                existing_type=sa.BigInteger,
                existing_nullable=True,
            )
