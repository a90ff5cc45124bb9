"""Each listener's rules reach the broker as a ListenerPolicy handed over with every connection
it accepts; the configuration is read, never rewritten, and the broker reads no listener
setting of its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.clients import connect_packet

from mqttbroker.broker.policy import ListenerPolicy
from mqttbroker.config import Config, ListenerConfig
from mqttbroker.security import listener_policy
from mqttbroker.server.app import Server

GUARD = 10.0


def test_the_policy_follows_the_listener_and_the_security_setting() -> None:
    loopback = ListenerConfig(host="127.0.0.1", port=0)
    public = ListenerConfig(host="0.0.0.0", port=0, protocol="ws")
    own_rule = ListenerConfig(host="0.0.0.0", port=0, allow_anonymous=True)
    assert listener_policy(loopback, None) == ListenerPolicy(True, True, "MQTT over TCP")
    assert listener_policy(loopback, False) == ListenerPolicy(False, True, "MQTT over TCP")
    assert listener_policy(public, None) == ListenerPolicy(False, False, "MQTT over WebSocket")
    assert listener_policy(own_rule, False).allow_anonymous is True


def test_a_running_server_hands_each_connection_its_listener_policy(tmp_path: Path) -> None:
    """Two listeners with opposite anonymous rules: a client without a user name is let in on
    one (local-only, no rule of its own: allowed) and refused (0x87) on the other; the
    configuration keeps what the file said (no rule is written into it)."""
    open_listener = ListenerConfig(host="127.0.0.1", port=0)
    closed_listener = ListenerConfig(host="127.0.0.1", port=0, allow_anonymous=False)
    config = Config(listeners=[open_listener, closed_listener], data_dir=str(tmp_path))
    config.storage.backend = "memory"

    async def scenario() -> list[bytes]:
        server = Server(config)
        await server.start()
        answers = []
        try:
            for host, port in server.addresses:
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(connect_packet("policy-probe", version=5))
                answers.append(await asyncio.wait_for(reader.read(64), GUARD))
                writer.close()
        finally:
            await server.stop()
        return answers

    answers = asyncio.run(scenario())
    assert [answer[3] for answer in answers] == [0x00, 0x87]
    assert (open_listener.allow_anonymous, closed_listener.allow_anonymous) == (None, False)
