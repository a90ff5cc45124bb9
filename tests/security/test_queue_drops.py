"""A message dropped from a subscriber's full offline queue: the publisher was acknowledged
(success: the drop is the subscriber's queue policy, as in Mosquitto), and the operator sees it:
a WARNING naming the session and the count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from session_support import HOUR, paho_client
from support.clients import unique

QUEUE_LIMIT = 1000  # max_queued_messages by default


def test_drop_from_a_full_queue_is_logged(start_broker: Callable[..., Any]) -> None:
    server = start_broker(extra_args=("--memory",))
    client_id = unique("sub")
    sub = paho_client(server, None, client_id, expiry=HOUR)
    try:
        sub.connect()
        assert sub.subscribe("drops/#", 1) == [1]
    finally:
        sub.close()
    pub = paho_client(server, None, unique("pub"), clean=True, expiry=0)
    mark = server.log_mark()
    try:
        pub.connect()
        infos = [pub.publish("drops/t", b"%d" % i, 1, wait=False) for i in range(QUEUE_LIMIT + 2)]
        assert {pub.wait_published(info) for info in infos} == {0}
    finally:
        pub.close()
    line = server.wait_for_log(rf"session {client_id}: 1 messages dropped", since=mark)
    assert line is not None, server.log_since(mark)
    assert "WARNING" in line.string and "(queue full); 1 dropped in all" in line.string
