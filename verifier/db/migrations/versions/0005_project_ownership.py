"""Project ownership: nodes, policies and revocation events carry the
Keystone project that owns them.

Rows written before this revision get the empty project (``""``): they are
owned by no project, so only callers allowed ``attestation:all_projects``
(the cloud administrator) see them. A policy is now keyed by its project
and digest, so two projects may store the same content independently.

Revision ID: 0005
Revises: 0004
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

from verifier.db.models import BIG_BINARY

revision = "0005"
down_revision = "0004"


def _project() -> sa.Column[str]:
    return sa.Column(
        "project_id", sa.String(64), nullable=False, server_default=sa.text("''")
    )


def upgrade() -> None:
    with op.batch_alter_table("verifier_nodes") as batch:
        batch.add_column(_project())
        batch.create_index("ix_verifier_nodes_project_id", ["project_id"])
    with op.batch_alter_table("verifier_outbox") as batch:
        batch.add_column(_project())
        batch.create_index("ix_verifier_outbox_project_id", ["project_id"])
    _recreate_policies(
        ["project_id", "digest"],
        sa.UniqueConstraint("project_id", "kind", "name", "version"),
        "'' AS project_id",
    )


def _recreate_policies(
    key: list[str], unique: sa.UniqueConstraint, project: str
) -> None:
    """Copy verifier_policies into a table with a new key (the unnamed
    unique constraint of 0002 cannot be dropped portably in place)."""
    columns: list[sa.Column[Any]] = [
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("body", BIG_BINARY, nullable=False),
        sa.Column("signature", sa.LargeBinary, nullable=True),
        sa.Column("entries", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    ]
    if "project_id" in key:
        columns.insert(0, _project())
    op.create_table(
        "verifier_policies_new", *columns, sa.PrimaryKeyConstraint(*key), unique
    )
    names = "digest, kind, name, version, body, signature, entries, created_at"
    target = f"project_id, {names}" if "project_id" in key else names
    source = f"{project}, {names}" if "project_id" in key else names
    copy = f"INSERT INTO verifier_policies_new ({target}) SELECT {source} FROM "  # noqa: S608
    op.execute(copy + "verifier_policies")  # constants only
    op.drop_table("verifier_policies")
    op.rename_table("verifier_policies_new", "verifier_policies")


def downgrade() -> None:
    # lossy: of the projects holding one digest, the first (by id) keeps it
    op.execute(
        "DELETE FROM verifier_policies WHERE EXISTS (SELECT 1 FROM "
        "verifier_policies AS other WHERE other.digest = verifier_policies.digest "
        "AND other.project_id < verifier_policies.project_id)"
    )
    _recreate_policies(["digest"], sa.UniqueConstraint("kind", "name", "version"), "")
    for table in ("verifier_outbox", "verifier_nodes"):
        with op.batch_alter_table(table) as batch:
            batch.drop_index(f"ix_{table}_project_id")
            batch.drop_column("project_id")
