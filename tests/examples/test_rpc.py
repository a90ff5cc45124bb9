"""examples/rpc.py: MQTT 5 request/response. The server answers on the request's Response Topic
with its Correlation Data; the client gives each caller its own answer, in whatever order the
answers come; errors come back as errors; ``call`` and ``demo`` work from the command line."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from support.clients import PahoClient, unique
from support.example_programs import EXAMPLES, example, run_example


def load_rpc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rpc_example", EXAMPLES / "rpc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rpc_command(broker: Any, service: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_example(
        "rpc.py",
        "--host",
        broker.host,
        "--port",
        str(broker.port),
        "--service",
        service,
        *args,
    )


def test_server_answers_on_response_topic_with_correlation_data(
    fresh_broker: Any, start_program: Callable[..., Any]
) -> None:
    service = unique("svc")
    example(
        start_program,
        "rpc.py",
        "--host",
        fresh_broker.host,
        "--port",
        str(fresh_broker.port),
        "--service",
        service,
        "serve",
        ready=r"serving \S+ on (\S+):(\d+)",
    )
    caller = PahoClient(fresh_broker.host, fresh_broker.port)
    try:
        caller.connect()
        reply_topic = f"replies/{unique()}"
        caller.subscribe(reply_topic, qos=1)
        for correlation, params in ((b"\x00first", [2, 3]), (b"second", [4, 5])):
            request = Properties(PacketTypes.PUBLISH)
            request.ResponseTopic = reply_topic
            request.CorrelationData = correlation
            caller.publish(
                f"rpc/{service}/request",
                json.dumps({"method": "add", "params": params}),
                qos=1,
                properties=request,
            )
            caller.wait_until(
                lambda c=correlation: any(
                    m.prop("CorrelationData") == c for m in caller.received()
                ),
                10,
                f"the answer to {correlation!r}",
            )
        answers = {m.prop("CorrelationData"): m for m in caller.received()}
        assert json.loads(answers[b"\x00first"].payload) == {"result": 5}
        assert json.loads(answers[b"second"].payload) == {"result": 9}
        assert all(m.topic == reply_topic for m in answers.values())
        assert answers[b"second"].prop("ContentType") == "application/json"
    finally:
        caller.close()

    # From the command line: a result, and an error with a failing exit status.
    ok = rpc_command(fresh_broker, service, "call", "multiply", "6", "7")
    assert (ok.returncode, ok.stdout.strip()) == (0, "42"), ok.stderr
    bad = rpc_command(fresh_broker, service, "call", "divide", "1", "0")
    assert bad.returncode == 1 and "error: unknown method" in bad.stderr, bad


def test_answers_in_any_order_reach_their_callers(fresh_broker: Any) -> None:
    rpc = load_rpc()
    service = unique("svc")
    server = rpc.Server(fresh_broker.host, fresh_broker.port, service)
    server.start()
    try:
        assert server.ready.wait(10)
        client = rpc.Client(fresh_broker.host, fresh_broker.port, service)
        try:
            finished: list[str] = []
            slow = threading.Thread(
                target=lambda: finished.append(f"sleep={client.call('sleep', 1)}")
            )
            slow.start()
            results = [client.call("add", n, n) for n in range(10)]
            finished.append("adds")
            slow.join(15)
            assert results == [2 * n for n in range(10)]
            assert finished == ["adds", "sleep=1"]  # the later answers overtook the slow one
            assert client.call("echo", "x", [1]) == ["x", [1]]
            with pytest.raises(rpc.RemoteError, match="ValueError"):
                client.call("sleep", 99)
        finally:
            client.close()
    finally:
        server.stop()


def test_demo_runs_with_one_command(fresh_broker: Any) -> None:
    result = rpc_command(fresh_broker, unique("svc"), "demo")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["add(2, 3) -> 5", "multiply(6, 7) -> 42"], lines
    assert "sleep(1) -> 1" in lines and any(
        line.startswith("divide(1, 0) -> error") for line in lines
    )
