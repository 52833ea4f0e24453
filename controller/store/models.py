"""SQLAlchemy 2 models of the desired job records, their status, submissions and events.

``jobs`` is written by clients (other services, the CLI, the Python client);
everything else is written by the controller alone.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Job(Base):
    """A desired job record. ``spec`` is the job document (JSON text as the client wrote it)."""

    __tablename__ = "jobs"
    # covers the tick's (id, version) read (migration 0002)
    __table_args__ = (Index("ix_jobs_id_version", "id", "version"),)

    id: Mapped[str] = mapped_column(String(26), primary_key=True)
    spec: Mapped[str] = mapped_column(Text)
    labels: Mapped[str] = mapped_column(Text, default="{}", server_default="{}")  # JSON
    # run | held | stopped
    desired: Mapped[str] = mapped_column(String(16), default="run", server_default="run")
    policy: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON, None = defaults
    generation: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # rows inserted by plain SQL get 0; the controller reads 0 as "unknown"
    created_at: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    updated_at: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Opaque; changed by a trigger on every INSERT and UPDATE (migration 0002), whoever
    # writes: the controller reloads a row only when its version moved. Never written here.
    version: Mapped[int] = mapped_column(BigInteger, server_default="0")
    # the change stamp: written by triggers on every INSERT and UPDATE (migration 0007);
    # a tick reads the rows stamped since its last read. Never written here.
    changed: Mapped[int] = mapped_column(BigInteger, server_default="0", index=True)


class JobStatus(Base):
    """The controller's view of a job; rebuilt from the world every tick."""

    __tablename__ = "job_status"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    phase: Mapped[str] = mapped_column(String(16), index=True)
    observed_generation: Mapped[int] = mapped_column(Integer, default=0)
    submission: Mapped[int] = mapped_column(Integer, default=0)  # last number allocated
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    current_submission: Mapped[int | None] = mapped_column(Integer, nullable=True)
    current_since: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    slurm_job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    slurm_submit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    cluster: Mapped[str | None] = mapped_column(String(64), nullable=True)
    object_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    cause: Mapped[str | None] = mapped_column(String(32), nullable=True)
    cause_detail: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    budgets_used: Mapped[str] = mapped_column(Text, default="{}")  # JSON cause -> count
    excluded_nodes: Mapped[str] = mapped_column(Text, default="{}")  # JSON node -> until
    conditions: Mapped[str] = mapped_column(Text, default="[]")  # JSON list
    not_before: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # backoff
    unknown_since: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    hold_instance: Mapped[int] = mapped_column(BigInteger, default=0)
    outputs_verified: Mapped[bool] = mapped_column(Boolean, default=False)
    nodes: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    updated_at: Mapped[int] = mapped_column(BigInteger)
    version: Mapped[int] = mapped_column(BigInteger, server_default="0")  # as Job.version
    changed: Mapped[int] = mapped_column(BigInteger, server_default="0",
                                         index=True)  # as Job.changed
    # the current object's SLUID, where the cluster reports one (migration 0004)
    sluid: Mapped[str | None] = mapped_column(String(64), nullable=True)

    # the jobs of each cluster by phase (migration 0008): ``repo.phase_counts`` counts a
    # cluster's status rows, and ``repo.placed_elsewhere`` those on clusters a
    # configuration does not name, by ranges of this index (no scan of every status row)
    __table_args__ = (Index("ix_job_status_cluster_phase", "cluster", "phase"),)


class Submission(Base):
    """One sbatch of a dispatch job. Written as an intent *before* sbatch runs."""

    __tablename__ = "submissions"
    __table_args__ = (UniqueConstraint("job_id", "submission"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    submission: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    # intent -> submitted -> ended; or abandoned (never reached Slurm) / duplicate
    status: Mapped[str] = mapped_column(String(16))
    cluster: Mapped[str | None] = mapped_column(String(64), nullable=True)
    slurm_job_id: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    slurm_submit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    cause: Mapped[str | None] = mapped_column(String(32), nullable=True)
    cause_detail: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    nodes: Mapped[str] = mapped_column(Text, default="")
    restart_count: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[int] = mapped_column(BigInteger)
    started_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    ended_at: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # the lease epoch of the leader that wrote the intent (migration 0003)
    epoch: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # the object's SLUID, where the cluster reports one (migration 0004)
    sluid: Mapped[str | None] = mapped_column(String(64), nullable=True)


class Event(Base):
    """Append-only history of what the controller saw and did."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(26))
    at: Mapped[int] = mapped_column(BigInteger)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[str] = mapped_column(Text, default="{}")


class Lease(Base):
    """A leader lease (``controller.store.lease``): who acts, under which epoch, until when.
    ``epoch`` moves on by one each time another holder takes it; writes of the leader are
    fenced on (holder, epoch)."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(200))
    epoch: Mapped[int] = mapped_column(BigInteger)
    expires_at_ms: Mapped[int] = mapped_column(BigInteger)
    acquired_at_ms: Mapped[int] = mapped_column(BigInteger)
    # the cluster whose shard this lease is (migration 0005; None: a single-cluster daemon)
    cluster: Mapped[str | None] = mapped_column(String(64), nullable=True)


class Replica(Base):
    """A daemon sharing the shards (``controller.store.members``): renewed every few
    seconds; the live rows say how many replicas split the clusters between them."""

    __tablename__ = "replicas"

    holder: Mapped[str] = mapped_column(String(200), primary_key=True)
    expires_at_ms: Mapped[int] = mapped_column(BigInteger)
    started_at_ms: Mapped[int] = mapped_column(BigInteger)
    shards: Mapped[str] = mapped_column(Text, default="", server_default="")  # held, comma


class ChangeSeq(Base):
    """SQLite's change counter (migration 0007): one row, id 1, moved by the triggers that
    stamp ``changed``. PostgreSQL stamps with transaction ids and leaves it alone."""

    __tablename__ = "change_seq"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    n: Mapped[int] = mapped_column(BigInteger)


class Tombstone(Base):
    """A job row that was deleted (migration 0006: a trigger writes it, whoever deletes):
    its id stays this database's, so its live Slurm jobs are still stopped by this
    deployment, and an id written again is never taken for a new one. ``refs`` lists the
    submissions it had, ``N=slurm_id@cluster`` comma separated. Expires after
    ``reconcile.tombstone_ttl_s``."""

    __tablename__ = "tombstones"

    job_id: Mapped[str] = mapped_column(String(26), primary_key=True)
    deleted_at_ms: Mapped[int] = mapped_column(BigInteger, index=True)
    refs: Mapped[str] = mapped_column(Text, default="", server_default="")
    changed: Mapped[int] = mapped_column(BigInteger, server_default="0",
                                         index=True)  # as Job.changed


class UnownedObject(Base):
    """A ``dj-`` Slurm job whose id this database never had (a neighbouring deployment's
    on the same Slurm account), as the last complete read of its cluster saw it: shown,
    counted, never written (migration 0006)."""

    __tablename__ = "unowned_objects"

    cluster: Mapped[str] = mapped_column(String(64), primary_key=True)
    slurm_job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    submit: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    seen_at: Mapped[int] = mapped_column(BigInteger)


class Deployment(Base):
    """This database's deployment id (one row, made at the first claim; migration 0006)."""

    __tablename__ = "deployment"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[int] = mapped_column(BigInteger)


class Claim(Base):
    """Per cluster: the token this database's leader last wrote to the deployment's
    ownership marker on the cluster, the one before it, and a conflict found (another
    database with the same deployment id wrote the marker) -- migration 0006."""

    __tablename__ = "claims"

    cluster: Mapped[str] = mapped_column(String(64), primary_key=True)
    token: Mapped[str] = mapped_column(String(32))
    previous: Mapped[str | None] = mapped_column(String(32), nullable=True)
    claimed_at: Mapped[int] = mapped_column(BigInteger)
    conflict: Mapped[str] = mapped_column(Text, default="", server_default="")
