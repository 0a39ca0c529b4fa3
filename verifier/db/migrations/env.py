"""Alembic environment: runs migrations on the connection handed in through
``config.attributes["connection"]`` (see :func:`verifier.db.upgrade`)."""

from alembic import context

from verifier.db.models import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=True,
)
with context.begin_transaction():
    context.run_migrations()
