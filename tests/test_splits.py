"""What a worker says when one job's runs come decided in two places (anarchon_celery.worker.splits)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from anarchon_celery.worker import splits


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    splits.forget()
    yield
    splits.forget()


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]


def test_one_place_is_quiet_and_two_are_named_once(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="anarchon_celery"):
        for _ in range(3):
            splits.notice("job", "Redis store 1, prefix 'p.'", "a:1")
            splits.notice("job", "Redis store 1, prefix 'p.'", "b:2")  # another instance, the same place
            splits.notice("other", "RabbitMQ cluster 'c', vhost '/', prefix 'p.'", "c:3")
            splits.notice("job", None, "d:4")  # a manual run, or an earlier release: no place
        assert errors(caplog) == []
        for _ in range(3):
            splits.notice("job", "RabbitMQ cluster 'c', vhost '/', prefix 'p.'", "c:3")
    [line] = errors(caplog)
    assert "the runs of job 'job' are decided in 2 places" in line
    assert "b:2 in Redis store 1, prefix 'p.'" in line and "c:3 in RabbitMQ cluster 'c'" in line


def test_a_place_not_seen_for_a_while_is_a_move_not_a_split(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(splits.time, "monotonic", lambda: now[0])
    with caplog.at_level(logging.INFO, logger="anarchon_celery"):
        splits.notice("job", "old place", "a:1")
        now[0] += splits.WINDOW_S + 1
        splits.notice("job", "new place", "b:2")
    assert errors(caplog) == []
