"""RabbitMQBackend: a one-message "gate" queue per run decides who runs it.

Each run gets a queue ``<prefix><job>.slot.<slot>`` that holds one message and refuses the rest
(``x-max-length: 1``, ``x-overflow: reject-publish``) and deletes itself ``slot_ttl_ms`` after its
last use (``x-expires``). Every instance publishes one persistent claim into it on a confirm
channel: the broker acks the publish that filled the queue and nacks every later one, so exactly
one instance gets the ack. Anything else (a connection lost before the answer, a confirm that
never comes, a claim returned as unroutable) is *not* a win: the run is skipped rather than risk
running it twice.

Gates are durable classic queues: transient non-exclusive queues are refused by RabbitMQ 4.3 and
later, a transient claim message would vanish with a broker restart and leave the gate open, and
quorum queues overshoot ``x-max-length`` under reject-publish (several winners).

The parts: :mod:`.names` (queue names and arguments), :mod:`.link` (the connection, the server,
the node and outages), :mod:`.declaring` (queues that exist with other arguments), :mod:`.gates`
(declaring the gates of a claim), :mod:`.ahead` (declaring gates ahead of their claims),
:mod:`.claims` (the claim and its confirms), :mod:`.streams` (history), :mod:`.sharing` (job
definitions compared with the other instances), and :mod:`.backend`, which puts them together.
"""

from .backend import RabbitMQBackend
from .link import AMQP_SCHEMES, app_connection_options, check_server, node_urls
from .names import gate_arguments, gate_name, history_arguments, history_name

__all__ = [
    "AMQP_SCHEMES",
    "RabbitMQBackend",
    "app_connection_options",
    "check_server",
    "gate_arguments",
    "gate_name",
    "history_arguments",
    "history_name",
    "node_urls",
]
