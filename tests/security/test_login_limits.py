"""Failed logins counted per address and per user, with a clock of the test's own: an address
past the limit is refused without a check, a targeted user is slowed down, never locked out, and
the counters stay bounded. On a real broker: tests/access/test_failed_logins.py."""

from __future__ import annotations

from support.harness import FakeClock
from support.password_files import ITERATIONS
from support.scram_client import ScramClient

from mqttbroker.broker.auth import LoginRequest
from mqttbroker.security.authenticator import (
    FailureCounter,
    FileAuthenticator,
    KdfBudget,
    LoginFailures,
)
from mqttbroker.security.passwords import PasswordFile, make_entry_line

USERS = [f"alice{i}" for i in range(5)]


def authenticator(
    clock: FakeClock | None = None, limit: int = 3, window: float = 30.0
) -> FileAuthenticator:
    text = "".join(
        make_entry_line(user, f"{user}-pw".encode(), ITERATIONS) + "\n" for user in USERS
    )
    return FileAuthenticator(
        PasswordFile.parse(text.encode(), "pw.txt"),
        False,
        KdfBudget(clock=clock or FakeClock()),
        failures=LoginFailures(limit, window),
    )


def check(auth: FileAuthenticator, username: str, password: bytes, address: str) -> int:
    return auth.check_password(LoginRequest("c", username, password, address=address))


def wrong_from(auth: FileAuthenticator, user: str, addresses: list[str]) -> None:
    """A wrong password for ``user`` from each of ``addresses``, each refused after a check."""
    for address in addresses:
        assert check(auth, user, b"wrong", address) == 0x86


def test_an_address_past_the_limit_is_refused_without_a_check_then_drains() -> None:
    clock = FakeClock()
    auth = authenticator(clock)
    assert check(auth, "alice0", b"alice0-pw", "10.0.0.1") == 0
    for _ in range(3):
        assert check(auth, "alice0", b"wrong", "10.0.0.9") == 0x86
    # Refused before anything is checked: even the right (remembered) password.
    assert check(auth, "alice0", b"alice0-pw", "10.0.0.9") == 0x9F
    assert check(auth, "alice1", b"alice1-pw", "10.0.0.9") == 0x9F
    assert check(auth, "alice1", b"alice1-pw", "10.0.0.2") == 0
    clock.now += 10.0  # window / limit: one failure drained, one more try
    assert check(auth, "alice1", b"wrong", "10.0.0.9") == 0x86
    assert check(auth, "alice1", b"alice1-pw", "10.0.0.9") == 0x9F
    clock.now += 30.0  # all drained
    assert check(auth, "alice1", b"alice1-pw", "10.0.0.9") == 0


def test_a_targeted_user_is_slowed_down_not_locked_out() -> None:
    """Failures for alice0 from many addresses: alice0 may then be tried only from addresses
    without failures; her own address, clean, still logs her in."""
    auth = authenticator()
    wrong_from(auth, "alice0", [f"10.1.0.{n}" for n in range(3)])
    assert check(auth, "alice1", b"wrong", "10.1.0.9") == 0x86
    assert check(auth, "alice0", b"guess", "10.1.0.9") == 0x9F
    assert check(auth, "alice1", b"alice1-pw", "10.1.0.9") == 0
    assert check(auth, "alice0", b"alice0-pw", "10.2.0.1") == 0


def test_budget_keeps_a_reserve_for_clean_addresses() -> None:
    auth = authenticator(limit=100)
    assert check(auth, "alice0", b"wrong", "10.0.0.9") == 0x86
    auth.budget.spend(auth.budget.burst - auth.budget.reserve)  # down to the reserve
    assert check(auth, "alice0", b"wrong", "10.0.0.9") == 0x89
    assert check(auth, "alice0", b"alice0-pw", "10.0.0.1") == 0


def test_scram_failures_count_and_lockout_refuses_scram() -> None:
    auth = authenticator()
    for n in range(3):
        exchange = auth.exchange("SCRAM-SHA-256", "c", None, "10.0.0.9")
        assert exchange is not None
        client = ScramClient("SCRAM-SHA-256", "alice0", b"wrong")
        first = exchange.step(client.first())
        assert first.status == "continue" and first.data is not None
        final = exchange.step(client.final(first.data))
        assert (final.status, final.reason_code) == ("fail", 0x86), n
    exchange = auth.exchange("SCRAM-SHA-256", "c", None, "10.0.0.9")
    assert exchange is not None
    refused = exchange.step(ScramClient("SCRAM-SHA-256", "alice0", b"alice0-pw").first())
    assert (refused.status, refused.reason_code) == ("fail", 0x9F)
    assert check(auth, "alice0", b"alice0-pw", "10.0.0.9") == 0x9F


def test_ipv6_addresses_count_per_64_network() -> None:
    auth = authenticator()
    wrong_from(auth, "alice1", [f"2001:db8::{n + 1}" for n in range(3)])
    assert check(auth, "alice2", b"alice2-pw", "2001:db8::ff:1") == 0x9F
    assert check(auth, "alice2", b"alice2-pw", "2001:db8:0:1::1") == 0
    assert check(auth, "alice2", b"alice2-pw", "::ffff:10.0.0.1") == 0


def test_counters_stay_bounded() -> None:
    """Only the file's users are counted (any other name is no target, and a client may send
    long ones), and each counter keeps at most max_keys keys, forgetting the oldest."""
    clock = FakeClock()
    auth = authenticator(clock)
    for n in range(50):
        name = f"ghost-{n}-" + "x" * 1000
        assert check(auth, name, b"guess", f"10.3.{n}.1") == 0x86
    assert auth.failures.users is not None and auth.failures.addresses is not None
    assert len(auth.failures.users._counts) == 0
    counter = FailureCounter(3, 30.0, max_keys=10)
    for n in range(25):
        counter.add(f"10.4.0.{n}", clock.now)
    assert len(counter._counts) <= 10
    assert counter.count("10.4.0.24", clock.now) == 1.0  # the newest are kept
    assert counter.count("10.4.0.0", clock.now) == 0.0
