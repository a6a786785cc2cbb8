"""A job's arguments, checked against its task when the job is read (at start, by ``check``, and
when a runtime job is added or changed), so that no run is won only to fail when it is sent: they
must bind to the task's parameters (as Celery checks them at ``apply_async``) and encode with the
serializer the task is sent with."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from kombu.exceptions import SerializerNotInstalled
from kombu.serialization import dumps

from .errors import ConfigError

if TYPE_CHECKING:
    from .jobs import Job

__all__ = ["check_arguments", "check_binding"]


def check_binding(job: Job, task: Any) -> None:
    """The job's args and kwargs must bind to its task's parameters, or every run it wins would
    fail to send with a TypeError. Checked as Celery's ``apply_async`` checks them: only for a
    task with ``typing`` on (Celery's default, ``Celery(strict_typing=...)``; a task made with
    ``typing=False`` takes anything), with the header Celery makes of a task function (a task
    class of its own has none, and Celery checks nothing for it either)."""
    if not getattr(task, "typing", False):
        return
    header = getattr(task, "__header__", None)
    if header is None:
        return
    try:
        header(*job.args, **job.kwargs)
    except TypeError as exc:
        call = ", ".join([*(repr(arg) for arg in job.args), *(f"{k}={v!r}" for k, v in job.kwargs.items())])
        raise ConfigError(
            f"job {job.name!r}: its arguments do not fit task {job.task!r}{_parameters(task)}: called as "
            f"({call}), {_reason(exc)}. Give args/kwargs that the task's parameters take, or make the task "
            "with typing=False (@app.task(typing=False)) if it takes them another way"
        ) from None


def _parameters(task: Any) -> str:
    """The task's parameters as its function declares them, ``(x, y=0)``, without their
    annotations; empty when they cannot be read."""
    try:
        found = inspect.signature(task.run)
    except (TypeError, ValueError):
        return ""
    bare = [parameter.replace(annotation=inspect.Parameter.empty) for parameter in found.parameters.values()]
    return str(found.replace(parameters=bare, return_annotation=inspect.Signature.empty))


def _reason(exc: TypeError) -> str:
    """What Python said, without the function's name it begins with (``add() missing 1 ...``)."""
    text = str(exc)
    head, sep, rest = text.partition("() ")
    return rest if sep and head.isidentifier() else text


def check_arguments(job: Job, task: Any, app: Any) -> None:
    """The job's args and kwargs must encode with the serializer its task is sent with (the
    ``serializer`` option, else the task's, else the app's ``task_serializer``), or every run it
    wins would fail to send. Encoded as the task message's body is: ``(args, kwargs, embed)``."""
    serializer = job.options.get("serializer") or getattr(task, "serializer", None) or app.conf.task_serializer
    source = "the job's serializer option" if job.options.get("serializer") else "the task's serializer"
    try:
        dumps((list(job.args), dict(job.kwargs), {}), serializer=serializer)
    except SerializerNotInstalled as exc:
        raise ConfigError(
            f"job {job.name!r}: serializer {serializer!r} ({source}) is not installed ({exc}): "
            "install it, or choose one kombu has (json, pickle, yaml, msgpack)"
        ) from exc
    except Exception as exc:  # noqa: BLE001 - EncodeError, or what a custom encoder raises
        raise ConfigError(
            f"job {job.name!r}: its args/kwargs cannot be serialized with {serializer!r} ({source}): "
            f"{type(exc).__name__}: {exc}. Pass only values {serializer!r} can encode, or give the task "
            "a serializer that can (@app.task(serializer=...), options={'serializer': ...}; the "
            "workers' accept_content must allow it)"
        ) from exc
