"""The chaos run's checker: it reads the history every device recorded (chaos_device.py) and the
nemesis's actions, Jepsen style, and says what went wrong. Nothing here talks to a broker; the
unit tests feed it hand-made histories (tests/benchmarks/test_chaos_check.py).

A history is a list of tuples, each ``(t, kind, ...)`` with ``t`` on one monotonic clock:

    ("connack", client, conn, session_present, expected_session_present, local_port)
    ("connect_fail", client, started, why)           # t - started: how long that attempt took
    ("lost_conn", client, conn, why)                 # the device gave the connection up
    ("subscribed", client, topics)                   # SUBACK received for these topics
    ("send", client, topic, seq, qos, dup, packet_id)
    ("ack", client, topic, seq, qos, reason_code)    # PUBACK (QoS 1) or PUBREC (QoS 2)
    ("abandoned", client, topic, seq, qos, packet_id)  # given up after Session Present 0
    ("deliver", subscriber, topic, publisher, seq, qos, dup, conn)
    ("redeliver", subscriber, topic, publisher, seq, qos, dup, conn)  # QoS 2, id unreleased
    ("zombie_deliver", subscriber, topic, publisher, seq, qos, conn)  # on a given-up conn
    ("session_end", client)                          # the device ended its session itself
    ("nemesis", kind, target, t_end, ok, detail)
    ("node", client, conn, node)                     # which node the connection went to
    ("crash", node, exit_code)                       # a node ended by itself (restarted)

Definitions:

- **acknowledged**: a message (topic, seq) whose publisher received a PUBACK (QoS 1) or a
  PUBREC (QoS 2) with a reason code below 0x80: the broker has taken responsibility for it.
  A message never acknowledged is indeterminate: it may or may not arrive, and counts nowhere.
- **lost**: an acknowledged message never delivered to a subscriber of its topic whose session
  was alive: subscribed (first SUBACK) before the message was first sent, and not ended by the
  device itself afterwards (a session the broker lost, a CONNACK with Session Present 0, does
  not end it: the device asked for 1 h). Counted per (message, subscriber).
- **QoS 2 duplicate**: a QoS 2 message delivered to one subscriber a second time as a new
  message (a PUBLISH with a packet identifier the subscriber had released, or another one).
- **order violation** (MQTT 4.6): a subscriber's first delivery of seq n on a topic after it
  had received a higher seq on that topic (messages of one publisher on one topic at one QoS).
  Redeliveries of a message already received (QoS 1 DUP) are not first deliveries.
- **wrong Session Present**: a CONNACK whose Session Present differs from what the client's
  session should give: 0 on its first connection (Clean Start), 1 on every later one (the
  session expires after 1 h, longer than any run).
- **longest time without a connection**: per device, from losing a connection to the CONNACK
  of the next one (or to the end of the run if none came); the maximum over devices.
- **double owner**: a message delivered on a connection the device had given up (not closed:
  a stopped node) although its publisher first sent it after a newer connection of that device
  had received its CONNACK: the old connection's node was still acting for the client id after
  another node had accepted it. Sound (a message cannot be delivered before it is sent), not
  complete (a node that wrongly holds a client id but has nothing to deliver goes unseen).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

Event = tuple[Any, ...]
EXAMPLES = 20  # examples kept per kind of failure


def _nemesis_at(nemesis: list[Event], t: float, before: float = 30.0) -> str | None:
    """The nemesis action in progress at ``t``, or the last one that ended within ``before``
    seconds of it: 'kind target'."""
    best = None
    for event in nemesis:
        start, _, kind, target, end = event[:5]
        if start <= t and (end is None or end + before >= t):
            best = f"{kind} {target}"
    return best


def _node_at(
    connacks: dict[str, list[tuple[float, int]]],
    nodes: dict[tuple[str, int], str],
    client: str,
    t: float,
) -> str | None:
    """The node of ``client``'s connection at ``t`` (its last CONNACK before), when known."""
    conn = None
    for t_c, c in connacks.get(client, ()):
        if t_c <= t:
            conn = c
    return None if conn is None else nodes.get((client, conn))


def check(
    history: Sequence[Event],
    end: float | None = None,
    nodes: dict[tuple[str, int], str] | None = None,
) -> dict[str, Any]:
    """Everything the chaos run reports, from a history. ``end``: the time the run ended (for a
    device still without a connection); ``nodes``: (client, conn) -> node, when known."""
    events = sorted(history, key=lambda e: e[0])
    if end is None:
        end = float(events[-1][0]) if events else 0.0
    nodes = dict(nodes or {})
    for event in events:
        if event[1] == "node":  # ("node", client, conn, node): saved with the history
            nodes.setdefault((event[2], event[3]), event[4])
    nemesis = [e for e in events if e[1] == "nemesis"]

    first_send: dict[tuple[str, int], float] = {}
    acked: dict[tuple[str, int], tuple[float, int]] = {}  # (topic, seq) -> (t, qos)
    no_match = 0
    failed_acks = 0
    subscribed_at: dict[str, float] = {}
    topics_of: dict[str, set[str]] = {}
    session_end: dict[str, float] = {}
    delivered: dict[tuple[str, str, int], int] = defaultdict(int)  # (sub, topic, seq) -> count
    qos2_dups: list[dict[str, Any]] = []
    qos1_dups = 0
    order: list[dict[str, Any]] = []
    highest: dict[tuple[str, str], int] = {}
    wrong_sp: list[dict[str, Any]] = []
    connacks: dict[str, list[tuple[float, int]]] = defaultdict(list)
    session_lost: dict[str, list[float]] = defaultdict(list)  # Session Present 0, expected 1
    lost_conn: dict[str, list[float]] = defaultdict(list)
    connect_fails: list[float] = []
    zombies: list[Event] = []
    crashes = 0
    deliveries = 0
    abandoned = 0
    sends = 0

    for event in events:
        t, kind = event[0], event[1]
        if kind == "send":
            _, _, _, topic, seq, _, _, _ = event
            sends += 1
            first_send.setdefault((topic, seq), t)
        elif kind == "ack":
            _, _, _, topic, seq, qos, code = event
            if code < 0x80:
                acked.setdefault((topic, seq), (t, qos))
                no_match += code == 0x10
            else:
                failed_acks += 1
        elif kind == "abandoned":
            abandoned += 1
        elif kind == "subscribed":
            _, _, client, topics = event
            subscribed_at.setdefault(client, t)
            topics_of.setdefault(client, set()).update(topics)
        elif kind == "session_end":
            session_end[event[2]] = t
        elif kind == "deliver":
            _, _, sub, topic, publisher, seq, qos, _dup, _conn = event
            deliveries += 1
            key = (sub, topic, seq)
            delivered[key] += 1
            if delivered[key] > 1:
                if qos == 2:
                    qos2_dups.append(
                        {"subscriber": sub, "topic": topic, "seq": seq, "t": round(t, 3)}
                    )
                else:
                    qos1_dups += 1
                continue
            stream = (sub, topic)
            top = highest.get(stream, 0)
            if seq < top:
                order.append(
                    {"subscriber": sub, "topic": topic, "seq": seq, "after": top, "t": round(t, 3)}
                )
            else:
                highest[stream] = seq
        elif kind == "connack":
            _, _, client, conn, sp, expected, _port = event
            connacks[client].append((t, conn))
            if expected and not sp:
                session_lost[client].append(t)
            if bool(sp) != bool(expected):
                wrong_sp.append(
                    {
                        "client": client,
                        "conn": conn,
                        "session_present": bool(sp),
                        "expected": bool(expected),
                        "t": round(t, 3),
                        "node": nodes.get((client, conn)),
                        "nemesis": _nemesis_at(nemesis, t),
                    }
                )
        elif kind == "lost_conn":
            lost_conn[event[2]].append(t)
        elif kind == "connect_fail":
            connect_fails.append(t - event[3])
        elif kind == "zombie_deliver":
            zombies.append(event)
        elif kind == "crash":
            crashes += 1

    # Lost: acknowledged, the subscriber's session alive, never delivered.
    lost: list[dict[str, Any]] = []
    by_topic: dict[str, list[str]] = defaultdict(list)
    for sub, topics in topics_of.items():
        for topic in topics:
            by_topic[topic].append(sub)
    for (topic, seq), (t_ack, qos) in acked.items():
        sent = first_send.get((topic, seq), t_ack)
        for sub in by_topic.get(topic, ()):
            if subscribed_at[sub] > sent or session_end.get(sub, end + 1) <= end:
                continue
            if delivered.get((sub, topic, seq), 0) == 0:
                publisher = topic.split("/")[1] if topic.count("/") == 2 else topic
                lost.append(
                    {
                        "subscriber": sub,
                        "topic": topic,
                        "seq": seq,
                        "qos": qos,
                        "sent": round(sent, 3),
                        "acked": round(t_ack, 3),
                        "nemesis": _nemesis_at(nemesis, t_ack),
                        "subscriber_node": _node_at(connacks, nodes, sub, sent),
                        "publisher_node": _node_at(connacks, nodes, publisher, sent),
                        "session_lost_after": any(t >= sent for t in session_lost.get(sub, ())),
                    }
                )

    # Longest time without a connection.
    longest: dict[str, Any] = {"seconds": 0.0, "client": None, "from": None, "nemesis": None}
    longest_s = 0.0
    for client, losses in lost_conn.items():
        times = sorted(t for t, _ in connacks.get(client, []))
        for t_lost in losses:
            after = [t for t in times if t > t_lost]
            back = after[0] if after else end
            if back - t_lost > longest_s:
                longest_s = back - t_lost
                longest = {
                    "seconds": round(back - t_lost, 3),
                    "client": client,
                    "from": round(t_lost, 3),
                    "nemesis": _nemesis_at(nemesis, t_lost),
                }

    # Double owners: delivered on a given-up connection, sent after a newer CONNACK.
    doubles: dict[tuple[str, int], dict[str, Any]] = {}
    for zombie in zombies:
        t, _, sub, topic, _publisher, seq, _qos, conn = zombie
        if (topic, seq) not in first_send:
            continue
        sent = first_send[(topic, seq)]
        newer = [(tc, c) for tc, c in connacks.get(sub, []) if c > conn and tc < sent]
        if not newer:
            continue
        t_new, new_conn = newer[0]
        entry = doubles.setdefault(
            (sub, conn),
            {
                "client": sub,
                "old_conn": conn,
                "old_node": nodes.get((sub, conn)),
                "new_conn": new_conn,
                "new_node": nodes.get((sub, new_conn)),
                "new_connack": round(t_new, 3),
                "first_stale_delivery": round(t, 3),
                "messages": 0,
                "nemesis": _nemesis_at(nemesis, t_new),
            },
        )
        entry["messages"] += 1

    acked_q: dict[int, int] = defaultdict(int)
    for _t, qos in acked.values():
        acked_q[qos] += 1
    nemesis_summary: dict[str, dict[str, int]] = {}
    for event in nemesis:
        kind, ok = event[2], event[5]
        row = nemesis_summary.setdefault(kind, {"done": 0, "failed": 0})
        row["done" if ok else "failed"] += 1
    reconnects = sum(max(0, len(v) - 1) for v in connacks.values())
    return {
        "acknowledged": len(acked),
        "acknowledged_qos1": acked_q[1],
        "acknowledged_qos2": acked_q[2],
        "acknowledged_no_matching_subscribers": no_match,
        "refused_acks": failed_acks,
        "sent": sends,
        "abandoned": abandoned,
        "deliveries": deliveries,
        "lost": len(lost),
        "lost_messages": len({(x["topic"], x["seq"]) for x in lost}),
        "lost_session_kept": sum(not x["session_lost_after"] for x in lost),
        "qos2_duplicates": len(qos2_dups),
        "qos1_duplicates": qos1_dups,
        "order_violations": len(order),
        "wrong_session_present": len(wrong_sp),
        "reconnects": reconnects,
        "connect_failures": len(connect_fails),
        "longest_connect_failure_s": round(max(connect_fails, default=0.0), 3),
        "longest_without_connection_s": longest["seconds"],
        "longest_without_connection": longest,
        "double_owners": len(doubles),
        "zombie_deliveries": len(zombies),
        "nemesis": nemesis_summary,
        "node_crashes": crashes,
        "examples": {
            "lost": lost[:EXAMPLES],
            "lost_by_subscriber": _count(x["subscriber"] for x in lost),
            "lost_by_publisher": _count(x["topic"] for x in lost),
            "lost_by_nemesis": _count(str(x["nemesis"]) for x in lost),
            "lost_session_kept_by_nemesis": _count(
                str(x["nemesis"]) for x in lost if not x["session_lost_after"]
            ),
            "lost_by_subscriber_node": _count(str(x["subscriber_node"]) for x in lost),
            "qos2_duplicates": qos2_dups[:EXAMPLES],
            "order_violations": order[:EXAMPLES],
            "wrong_session_present": wrong_sp[:EXAMPLES],
            "double_owners": list(doubles.values())[:EXAMPLES],
        },
    }


def _count(items: Iterable[str]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[item] += 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:EXAMPLES])


TABLE_ROWS = [
    ("messages acknowledged", "acknowledged"),
    ("  of them QoS 1 / QoS 2", None),
    ("lost (acknowledged, never delivered)", "lost"),
    ("  distinct messages", "lost_messages"),
    ("  of them, session kept (Session Present 1)", "lost_session_kept"),
    ("QoS 2 duplicates", "qos2_duplicates"),
    ("order violations (MQTT 4.6)", "order_violations"),
    ("wrong Session Present", "wrong_session_present"),
    ("longest time without a connection, s", "longest_without_connection_s"),
    ("double owners", "double_owners"),
    ("deliveries", "deliveries"),
    ("QoS 1 duplicates (allowed)", "qos1_duplicates"),
    ("reconnects", "reconnects"),
    ("connect attempts failed", "connect_failures"),
    ("nodes that ended by themselves", "node_crashes"),
]


def table(results: dict[str, dict[str, Any]]) -> str:
    """The figures of one or more runs side by side: {column name: check() result}."""
    names = list(results)
    width = max(len(r[0]) for r in TABLE_ROWS) + 2
    lines = [f"{'':{width}}" + "".join(f"{n:>14}" for n in names)]
    for label, key in TABLE_ROWS:
        cells = []
        for name in names:
            r = results[name]
            if key is None:
                cells.append(f"{r['acknowledged_qos1']} / {r['acknowledged_qos2']}")
            else:
                value = r.get(key)
                cells.append(f"{value:,}" if isinstance(value, int) else f"{value}")
        lines.append(f"{label:{width}}" + "".join(f"{c:>14}" for c in cells))
    kinds = sorted({k for r in results.values() for k in r.get("nemesis", {})})
    for kind in kinds:
        cells = []
        for name in names:
            row = results[name].get("nemesis", {}).get(kind, {"done": 0, "failed": 0})
            cells.append(f"{row['done']}" + (f" ({row['failed']} failed)" if row["failed"] else ""))
        lines.append(f"{'nemesis: ' + kind:{width}}" + "".join(f"{c:>14}" for c in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.chaos_check HISTORY.jsonl.gz``: check a saved history again."""
    import gzip
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    with gzip.open(args[0], "rt") as fh:
        history = [tuple(json.loads(line)) for line in fh]
    result = check(history)
    print(table({"history": result}))
    for key in ("lost_by_nemesis", "lost_session_kept_by_nemesis", "lost_by_subscriber_node"):
        print(f"  {key}: {result['examples'][key]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
