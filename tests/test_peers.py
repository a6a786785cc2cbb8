"""Instances that define a job differently: what each one says, without a broker."""

from __future__ import annotations

import json
import logging

import pytest

from anarchon_celery.backends.peers import Peers

DAILY = {"task": "proj_a.cleanup", "schedule": "every 5s", "args": "()", "kwargs": "{}", "options": "{}"}


@pytest.mark.parametrize(
    "theirs, says",
    [
        (
            dict(DAILY, task="proj_b.cleanup"),
            "task proj_a.cleanup here, proj_b.cleanup there. Both decide the same runs and each run is "
            "sent by whichever wins it, as it defines the job: runs of this definition are lost to the "
            "other one's",
        ),
        (dict(DAILY, args="(1,)"), "args () here, (1,) there. Both decide the same runs"),
        (
            dict(DAILY, schedule="every 10s"),
            "schedule every 5s here, every 10s there. Each instance decides the runs of its own schedule, so "
            "until they agree the job runs on both schedules",
        ),
        (None, "it has no such job, and this instance runs it. Only the instances that have the job run it"),
    ],
)
def test_what_a_disagreement_does_is_said(
    theirs: dict[str, str] | None, says: str, caplog: pytest.LogCaptureFixture
) -> None:
    peers = Peers("here:1", {"cleanup": DAILY})
    jobs = {} if theirs is None else {"cleanup": theirs}
    with caplog.at_level(logging.WARNING, logger="anarchon_celery"):
        peers.heard(json.dumps({"v": 1, "instance": "there:2", "hello": True, "jobs": jobs}))
        peers.heard(json.dumps({"v": 1, "instance": "there:2", "hello": False, "jobs": jobs}))  # said once
    [line] = [record.getMessage() for record in caplog.records]
    assert line.startswith("anarchon: job 'cleanup' is defined differently by instance there:2: ")
    assert says in line, line
    assert peers.answer_due
