"""Failed logins, end to end on a real broker: an attacker hammering wrong passwords from one
address (127.0.0.2, a second loopback source address) neither uses up the hashing budget of
everyone else nor locks the users it targets out: they log in from their own address every
time, while the attacker is refused without a check (0x9F). The counters themselves:
tests/security/test_login_limits.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.clients import TIMEOUT, connack_code
from support.password_files import security_config

from mqttbroker.security.passwords import ScramCredential

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
