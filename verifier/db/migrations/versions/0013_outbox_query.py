"""Events you can query (issue 30): the outbox row keeps its event's type
and reason in columns (filled from the signed body for older rows), and
the listing's keyset pages (newest first, by time then id) have indexes,
of one project and of all.

A reason longer than the 64 characters a query may name is not kept in
its column (no query can ask for it); the body keeps it whole.

Revision ID: 0013
Revises: 0012
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"

_TABLE = "verifier_outbox"
_INDEXES = {
    "ix_verifier_outbox_project_time": ["project_id", "created_at", "id"],
    "ix_verifier_outbox_time": ["created_at", "id"],
    "ix_verifier_outbox_project_type": ["project_id", "type", "created_at"],
}
#: The longest reason a query may name (verifier.protocol.messages.event_query).
REASON_MAX = 64


def _backfill() -> None:
    bind = op.get_bind()
    table = sa.table(
        _TABLE,
        sa.column("id", sa.String),
        sa.column("body", sa.Text),
        sa.column("type", sa.String),
        sa.column("reason", sa.String),
    )
    rows = bind.execute(sa.select(table.c.id, table.c.body)).all()
    for row_id, body in rows:
        try:
            event = json.loads(body)["event"]
            kind, reason = str(event["type"])[:32], str(event["reason"])
        except (ValueError, KeyError, TypeError):  # kept as it is: unfiltered
            continue
        bind.execute(
            table.update()
            .where(table.c.id == row_id)
            .values(type=kind, reason=reason if len(reason) <= REASON_MAX else None)
        )


def upgrade() -> None:
    with op.batch_alter_table(_TABLE) as batch:
        batch.add_column(sa.Column("type", sa.String(32), nullable=True))
        batch.add_column(sa.Column("reason", sa.String(REASON_MAX), nullable=True))
    _backfill()
    for name, columns in _INDEXES.items():
        op.create_index(name, _TABLE, columns)


def downgrade() -> None:
    for name in _INDEXES:
        op.drop_index(name, _TABLE)
    with op.batch_alter_table(_TABLE) as batch:
        batch.drop_column("reason")
        batch.drop_column("type")
