"""A full disk while the broker runs (a real process, a real SQLITE_FULL: full_disk_broker.py):
a QoS 1 PUBLISH for a persistent session is not acknowledged while it cannot be stored, QoS 0
and other clients are served meanwhile, the log names the path and the real cause once, and once
there is room the PUBLISH is acknowledged, logged once more, and delivered: nothing lost."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from support.clients import MQTT_5, PahoClient, unique

LAUNCHER = (str(Path(__file__).with_name("full_disk_broker.py")),)


def test_full_disk_holds_the_ack_serves_qos0_and_loses_nothing(
    start_broker: Callable, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    broker = start_broker(data, launcher=LAUNCHER)
    keeper_id = unique("keeper")
    clients: list[PahoClient] = []

    def client(**kw: object) -> PahoClient:
        made = PahoClient(broker.host, broker.port, MQTT_5, **kw)  # type: ignore[arg-type]
        clients.append(made)
        made.connect()
        return made

    try:
        keeper = client(client_id=keeper_id, clean=False, expiry=300)
        keeper.subscribe("disk/#", 1)
        keeper.close()  # away: what it subscribed to must be stored for it
        watcher = client()
        watcher.subscribe("live/#", 0)
        publisher = client()

        mark = broker.log_mark()
        (data / "disk-full").touch()
        payload = os.urandom(200_000)  # needs new pages: the full disk refuses them
        info = publisher.publish("disk/big", payload, 1, wait=False)
        failed = broker.wait_for_log(r"ERROR .*cannot commit", 10.0, since=mark)
        assert failed is not None, broker.log_text()
        line = failed.string
        assert str(data / "mqttbroker.db") in line, line
        assert "database or disk is full (SQLITE_FULL)" in line, line
        assert "rollback" not in line, line

        # QoS 0 between other clients goes on; the QoS 1 PUBLISH is still not acknowledged.
        sender = client()
        sender.publish("live/x", b"still serving", 0)
        assert [m.payload for m in watcher.wait_messages(1)] == [b"still serving"]
        assert info.mid not in publisher.acked, "acknowledged although not stored"

        (data / "disk-full").unlink()
        assert publisher.wait_published(info) == 0
        assert broker.wait_for_log(r"WARNING .*commits succeed again", 10.0, since=mark)
        log = broker.log_since(mark)
        assert len([x for x in log.splitlines() if " ERROR " in x]) == 1, log

        back = client(client_id=keeper_id, clean=False, expiry=300)
        assert [m.payload for m in back.wait_messages(1)] == [payload]
    finally:
        for made in clients:
            made.close()
    assert "Traceback" not in broker.log_text()
