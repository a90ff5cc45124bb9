"""``mqttbroker passwd``: add, change or delete a user of a password file.

    mqttbroker passwd FILE USER                  add USER or change its password (asks twice)
    mqttbroker passwd --password-stdin FILE USER the password is the first line of stdin
    mqttbroker passwd -c FILE USER               create FILE (replacing it) with USER alone
    mqttbroker passwd -D FILE USER               delete USER

The file is rewritten atomically (a new file renamed over the old), keeping its permissions and
its other lines as they are (Mosquitto entries included); a new file is readable by its owner
only. A file that does not parse is not touched: the error names the file and the line.
Exit status: 0 done, 1 error, 2 bad usage.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from pathlib import Path

from .errors import SecurityFileError
from .passwords import (
    DEFAULT_ITERATIONS,
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    PasswordFile,
    check_username,
    make_entry_line,
    write_atomically,
)


class PasswdError(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    defaults = ", ".join(f"{n:,} for {m}" for m, n in DEFAULT_ITERATIONS.items())
    p = argparse.ArgumentParser(
        prog="mqttbroker passwd",
        description="Add, change or delete a user of an mqttbroker password file.",
    )
    p.add_argument("file", metavar="FILE", help="the password file")
    p.add_argument("user", metavar="USER", help="the user name")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "-c", "--create", action="store_true", help="create FILE (an existing one is replaced)"
    )
    mode.add_argument("-D", "--delete", action="store_true", help="delete USER from FILE")
    p.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the password from the first line of standard input instead of asking",
    )
    p.add_argument(
        "--iterations",
        type=int,
        metavar="N",
        help=f"PBKDF2 iterations for both SCRAM verifiers (default {defaults}; "
        f"at least {MIN_ITERATIONS}). Fewer make logins cheaper for small devices using SCRAM",
    )
    return p


def _read_password(from_stdin: bool) -> bytes:
    if from_stdin:
        line = sys.stdin.buffer.readline()
        password = line.rstrip(b"\n").rstrip(b"\r")
    else:
        if not sys.stdin.isatty():
            raise PasswdError("standard input is not a terminal: use --password-stdin")
        first = getpass.getpass("Password: ")
        second = getpass.getpass("Reenter password: ")
        if first != second:
            raise PasswdError("the passwords do not match")
        password = first.encode("utf-8")
    if not password:
        raise PasswdError("the password is empty")
    return password


def run(args: argparse.Namespace) -> str:
    """Do what ``args`` says; the message to print."""
    path = Path(args.file)
    try:
        check_username(args.user)
    except ValueError as exc:
        raise PasswdError(f"{args.user!r}: {exc}") from None
    iterations = args.iterations
    if iterations is not None and not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise PasswdError(f"--iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}")
    if args.create:
        passwords = PasswordFile(str(path), [], {})
    else:
        if not path.exists():
            raise PasswdError(f"{path}: file not found (-c creates it)")
        passwords = PasswordFile.load(path)
    if args.delete:
        if not passwords.delete(args.user):
            raise PasswdError(f"{path}: no user {args.user!r}")
        write_atomically(path, passwords.render())
        return f"deleted user {args.user!r} from {path}"
    password = _read_password(args.password_stdin)
    replaced = passwords.set_line(args.user, make_entry_line(args.user, password, iterations))
    write_atomically(path, passwords.render())
    return f"{'changed the password of' if replaced else 'added'} user {args.user!r} in {path}"


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        message = run(args)
    except (PasswdError, SecurityFileError) as exc:
        print(f"mqttbroker passwd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        name = exc.filename or args.file
        print(f"mqttbroker passwd: {name}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("", file=sys.stderr)
        return 1
    print(message)
    return 0
