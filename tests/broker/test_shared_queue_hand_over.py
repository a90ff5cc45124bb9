"""Section 4.8.2: messages a shared subscription queued for an offline member whose session
then ends go to a member still there, not lost; and the reason an aliasless empty topic is
refused."""

from __future__ import annotations

from support.harness import Harness, Prop


def test_queued_share_of_an_expired_session_goes_to_another_member(h: Harness) -> None:
    away = h.connect("away", properties={Prop.SESSION_EXPIRY_INTERVAL: 10})
    away.subscribe("$share/g/job", 1)
    here = h.connect("here")
    here.subscribe("$share/g/job", 1)
    away.lose()
    pub = h.connect("pub")
    for i in range(4):
        pub.publish("job", f"m{i}".encode(), 1)
    mine = [p.payload for p in here.publishes()]
    assert len(mine) == 2 and len(h.broker.sessions["away"].queue) == 2
    h.tick(10)  # the away session expires with its queue
    handed = [p.payload for p in here.publishes()]
    assert sorted(mine + handed) == [b"m0", b"m1", b"m2", b"m3"]


def test_share_queued_behind_a_full_window_is_handed_over(h: Harness) -> None:
    """The same for a member still connected whose receive window is full: what waits in its
    queue goes to another member when its session ends."""
    busy = h.connect("busy", properties={Prop.RECEIVE_MAXIMUM: 1})
    busy.subscribe("$share/g/job", 1)
    idle = h.connect("idle")
    idle.subscribe("$share/g/job", 1)
    pub = h.connect("pub")
    for i in range(6):
        pub.publish("job", f"m{i}".encode(), 1)
    mine = [p.payload for p in idle.publishes()]
    assert len(busy.publishes()) == 1 and len(busy.session.queue) == 2
    busy.lose()  # clean session: ends now
    handed = [p.payload for p in idle.publishes()]
    assert sorted(mine + handed) == [f"m{i}".encode() for i in range(6)]
