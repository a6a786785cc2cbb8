"""What the nodes of a cluster said, judged without a broker: a table of cases."""

from __future__ import annotations

import pytest

from anarchon_celery.backends.rabbitmq.survey import NodeAnswer, check_partition_handling, judge

A1 = NodeAnswer("amqp://guest:**@a1//", (3, 10, 8), "prod")
A2 = NodeAnswer("amqp://guest:**@a2//", (3, 10, 8), "prod")
DOWN = NodeAnswer("amqp://guest:**@a3//", problem="does not answer (ConnectionRefusedError: ...)")


@pytest.mark.parametrize(
    ("answers", "errors", "warnings"),
    [
        ([A1], [], []),
        ([A1, A2], [], ["3.x cluster"]),
        ([A1, A2, DOWN], [], ["a3// does not answer", "3.x cluster"]),
        ([A1, NodeAnswer("amqp://guest:**@b1//", (3, 10, 8), "staging")], ["b1// is of cluster 'staging'"], ["3.x"]),
        ([A1, NodeAnswer("amqp://guest:**@a4//", (4, 3, 6), "prod")], [], ["different versions", "3.x cluster"]),
        ([NodeAnswer("u1", (4, 3, 6), "c"), NodeAnswer("u2", (4, 3, 6), "c")], [], []),
        ([DOWN], [], ["does not answer"]),
    ],
)
def test_judge(answers: list[NodeAnswer], errors: list[str], warnings: list[str]) -> None:
    judgement = judge(answers)
    found_errors, found_warnings = judgement.errors, judgement.warnings
    assert len(found_errors) == len(errors) and all(e in f for e, f in zip(errors, found_errors))
    assert len(found_warnings) == len(warnings) and all(w in f for w, f in zip(warnings, found_warnings))


@pytest.mark.parametrize(
    ("output", "ok", "shown"),
    [
        ("{{ok,pause_minority},{'EXIT',{undef,[]}}}\n", True, "pause_minority"),
        ("{{ok,ignore},{'EXIT',{undef,[]}}}", False, "ignore: both sides"),
        ("{undefined,{'EXIT',{undef,[]}}}", False, "ignore"),  # not set: RabbitMQ's default
        ("{{ok,autoheal},false}", False, "autoheal"),
        ("{{ok,{pause_if_all_down,['a@h'],ignore}},false}", True, "pause_if_all_down"),
        ("{{ok,ignore},true}", True, "Khepri"),
    ],
)
def test_partition_handling(output: str, ok: bool, shown: str) -> None:
    verdict, detail = check_partition_handling(output)
    assert verdict is ok and shown in detail
