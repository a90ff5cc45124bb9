"""Failed logins, end to end on a real broker: an attacker hammering wrong passwords from one
address (127.0.0.2, a second loopback source address) neither uses up the hashing budget of
everyone else nor locks the users it targets out: they log in from their own address every
time, while the attacker is refused without a check (0x9F)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.clients import TIMEOUT, connack_code
from support.harness import FakeClock
from support.password_files import ITERATIONS, security_config
from support.scram_client import ScramClient

from mqttbroker.broker.auth import LoginRequest
from mqttbroker.security.authenticator import (
    FailureCounter,
    FileAuthenticator,
    KdfBudget,
    LoginFailures,
)
from mqttbroker.security.passwords import PasswordFile, ScramCredential, make_entry_line

# Costly enough that a few dozen checks use up the broker's budget (two seconds of hashing).
ATTACKED_ITERATIONS = 20_000
USERS = [f"alice{i}" for i in range(5)]


def test_attacker_address_does_not_lock_out_users(
    tmp_path: Path, start_broker: Callable[..., Any]
) -> None:
    passwords = tmp_path / "pw.txt"
    passwords.write_text(
        "".join(
            f"{user}:"
            + ScramCredential.derive(
                "SCRAM-SHA-512", f"{user}-pw".encode(), ATTACKED_ITERATIONS
            ).text()
            + "\n"
            for user in USERS
        )
    )
    broker = start_broker(extra_args=(*security_config(passwords), "--memory"))

    stop = threading.Event()
    codes: list[int] = []
    seen = threading.Condition()

    def attack(index: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            user = USERS[(index + n) % len(USERS)]
            code = connack_code(
                broker, source="127.0.0.2", username=user, password=f"guess-{index}-{n}".encode()
            )
            with seen:
                codes.append(code)
                seen.notify_all()

    threads = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(4)]
    for thread in threads:
        thread.start()
    try:
        with seen:  # until the attack has had an effect: the budget spent, or a lockout
            assert seen.wait_for(lambda: any(c != 0x86 for c in codes), TIMEOUT), codes
        results = {
            user: connack_code(broker, username=user, password=f"{user}-pw".encode())
            for user in USERS
        }
    finally:
        stop.set()
        for thread in threads:
            thread.join(TIMEOUT)
    assert results == {user: 0 for user in USERS}, (results, broker.log_text()[-3000:])
    assert set(codes) <= {0x86, 0x89, 0x9F} and 0x9F in codes, sorted(set(codes))
    assert codes.count(0x86) <= 10 + len(threads)  # then refused without a check
    assert broker.wait_for_log(r"127\.0\.0\.2: 10 failed logins within 300 s", TIMEOUT)


# -- the counters, with a clock of the test's own ---------------------------------------------


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
