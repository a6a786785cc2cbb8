"""anarchon_celery: a highly available Celery beat.

Run ``celery -A proj beat -S anarchon_celery.Scheduler`` as many times as you like: each
scheduled run is claimed in RabbitMQ by exactly one instance, which sends the task.
"""

from . import guard, worker  # noqa: F401 - connect the worker's side (history, leases), and beat checks
from .backends import (
    Backend,
    Claim,
    MemoryBackend,
    Outcome,
    PostgresBackend,
    RabbitMQBackend,
    RedisBackend,
    SQLiteBackend,
)
from .backends.definitions import JobConflict, JobDef
from .backends.pauses import Pause
from .backfilling import BackfillReport
from .control import ManualRun, backfill, history, last_run, run_now
from .errors import AnarchonError, BrokerError, BrokerRefused, BrokerUnavailable, ConfigError
from .history import Run
from .jobs import Job, cron, task_id_for
from .pausing import pause, paused, resume
from .runtime import add_job, remove_job, runtime_jobs, update_job
from .schedule import Cron, Interval, Schedule
from .scheduler import Scheduler
from .settings import Settings
from .task_run import ScheduledRun, scheduled_run

__version__ = "0.1.0"

__all__ = [
    # Running it
    "Scheduler",
    "cron",
    # In a task: the run it executes
    "scheduled_run",
    "ScheduledRun",
    # History, manual runs and backfills
    "history",
    "last_run",
    "run_now",
    "backfill",
    "Run",
    "ManualRun",
    "BackfillReport",
    # Pausing a job, for every instance
    "pause",
    "resume",
    "paused",
    "Pause",
    # Runtime jobs: added, changed and removed without a restart
    "add_job",
    "update_job",
    "remove_job",
    "runtime_jobs",
    "JobDef",
    "JobConflict",
    # Backends
    "Backend",
    "RabbitMQBackend",
    "RedisBackend",
    "PostgresBackend",
    "SQLiteBackend",
    "MemoryBackend",
    "Claim",
    "Outcome",
    # Jobs and schedules
    "Job",
    "Schedule",
    "Cron",
    "Interval",
    "Settings",
    "task_id_for",
    # Errors
    "AnarchonError",
    "ConfigError",
    "BrokerError",
    "BrokerUnavailable",
    "BrokerRefused",
]
