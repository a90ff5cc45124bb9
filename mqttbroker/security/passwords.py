"""The password file: one user per line, hashed with a salted key-derivation function.

Our format
----------
Each entry holds SCRAM verifiers (RFC 5802), written as RFC 5803 stores them::

    NAME:SCRAM-SHA-512$<iterations>:<salt>$<StoredKey>:<ServerKey> SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>

``salt``, ``StoredKey`` and ``ServerKey`` are standard base64. For each hash H (SHA-512, SHA-256)::

    SaltedPassword = PBKDF2-HMAC-H(SASLprep(password), salt, iterations)
    StoredKey      = H(HMAC-H(SaltedPassword, "Client Key"))
    ServerKey      = HMAC-H(SaltedPassword, "Server Key")

The same verifiers serve both ways of logging in: a CONNECT password is checked by deriving
StoredKey again (PBKDF2, then a constant-time compare), and the SCRAM-SHA-256/512 enhanced
authentication methods use StoredKey and ServerKey directly, so no plaintext is ever kept.
``mqttbroker passwd`` writes both verifiers, 16-byte random salts, and by default 210,000
iterations for SHA-512 and 600,000 for SHA-256. An entry may hold one verifier only; the SCRAM
method it lacks is then refused for that user.

Mosquitto's format (read, so a ``mosquitto_passwd`` file works as it is)
-------------------------------------------------------------------------
``NAME:$7$<iterations>$<salt>$<hash>``: PBKDF2-HMAC-SHA512(password, salt, iterations), 64 bytes;
``NAME:$6$<salt>$<hash>``: SHA-512(password followed by salt). Salt and hash are base64 of the raw
bytes. These entries check CONNECT passwords only: they cannot answer SCRAM. Argon2 entries
(Mosquitto 2.1's default) cannot be checked with the standard library: they are kept, reported,
and refuse their user until ``mqttbroker passwd`` sets a new password. Changing a password with
``mqttbroker passwd`` rewrites that user's entry in our format and leaves the others as they are.

Blank lines and lines starting with ``#`` are ignored. User names may not contain ``:``, nor start
or end with white space, nor start with ``#``. Plain-text passwords are refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ..config import MAX_ITERATIONS as MAX_ITERATIONS  # the bound of every iteration count
from .errors import SecurityFileError, read_file
from .saslprep import normalize_password

# SCRAM mechanism -> hashlib name
SCRAM_HASHES = {"SCRAM-SHA-512": "sha512", "SCRAM-SHA-256": "sha256"}
# OWASP's figures for PBKDF2 (2023): what `mqttbroker passwd` uses unless told otherwise.
DEFAULT_ITERATIONS = {"SCRAM-SHA-512": 210_000, "SCRAM-SHA-256": 600_000}
MIN_ITERATIONS = 4096  # RFC 7677's floor for SCRAM; entries below it are reported as weak
SALT_BYTES = 16


def b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def b64decode(text: str) -> bytes:
    """Strict standard base64 (ValueError otherwise)."""
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError(f"not valid base64: {text!r}") from None


# -- the verifiers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server keeps to run SCRAM with one hash for one user (RFC 5802 section 3)."""

    mechanism: str  # "SCRAM-SHA-512" or "SCRAM-SHA-256"
    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes

    @property
    def hash_name(self) -> str:
        return SCRAM_HASHES[self.mechanism]

    @classmethod
    def derive(
        cls, mechanism: str, password: bytes, iterations: int, salt: bytes | None = None
    ) -> ScramCredential:
        hash_name = SCRAM_HASHES[mechanism]
        salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
        salted = hashlib.pbkdf2_hmac(hash_name, normalize_password(password), salt, iterations)
        client_key = hmac.digest(salted, b"Client Key", hash_name)
        stored_key = hashlib.new(hash_name, client_key).digest()
        server_key = hmac.digest(salted, b"Server Key", hash_name)
        return cls(mechanism, iterations, salt, stored_key, server_key)

    def verify(self, password: bytes) -> bool:
        hash_name = self.hash_name
        salted = hashlib.pbkdf2_hmac(
            hash_name, normalize_password(password), self.salt, self.iterations
        )
        client_key = hmac.digest(salted, b"Client Key", hash_name)
        stored_key = hashlib.new(hash_name, client_key).digest()
        return hmac.compare_digest(stored_key, self.stored_key)

    def text(self) -> str:
        return (
            f"{self.mechanism}${self.iterations}:{b64encode(self.salt)}"
            f"${b64encode(self.stored_key)}:{b64encode(self.server_key)}"
        )

    @classmethod
    def parse(cls, text: str) -> ScramCredential:
        mechanism, sep, rest = text.partition("$")
        if mechanism not in SCRAM_HASHES:
            raise ValueError(
                f"unknown mechanism {mechanism!r} (known: SCRAM-SHA-512, SCRAM-SHA-256)"
            )
        parts = rest.split("$")
        if not sep or len(parts) != 2:
            raise ValueError(f"expected {mechanism}$<iterations>:<salt>$<StoredKey>:<ServerKey>")
        iterations_text, sep1, salt_text = parts[0].partition(":")
        stored_text, sep2, server_text = parts[1].partition(":")
        if not sep1 or not sep2:
            raise ValueError(f"expected {mechanism}$<iterations>:<salt>$<StoredKey>:<ServerKey>")
        iterations = _iterations(iterations_text)
        salt = b64decode(salt_text)
        if not salt:
            raise ValueError("empty salt")
        size = hashlib.new(SCRAM_HASHES[mechanism]).digest_size
        stored_key, server_key = b64decode(stored_text), b64decode(server_text)
        if len(stored_key) != size or len(server_key) != size:
            raise ValueError(f"{mechanism} keys must be {size} bytes")
        return cls(mechanism, iterations, salt, stored_key, server_key)


@dataclass(frozen=True, slots=True)
class MosquittoHash:
    """A ``mosquitto_passwd`` entry: ``$7$`` (PBKDF2-HMAC-SHA512) or ``$6$`` (salted SHA-512)."""

    scheme: str  # "7" or "6"
    iterations: int  # 0 for "$6$"
    salt: bytes
    digest: bytes

    def verify(self, password: bytes) -> bool:
        if self.scheme == "7":
            computed = hashlib.pbkdf2_hmac(
                "sha512", password, self.salt, self.iterations, len(self.digest)
            )
        else:
            computed = hashlib.sha512(password + self.salt).digest()
        return hmac.compare_digest(computed, self.digest)

    @classmethod
    def parse(cls, text: str) -> MosquittoHash:
        parts = text.split("$")
        if parts[1] == "7":
            if len(parts) != 5:
                raise ValueError("expected $7$<iterations>$<salt>$<hash>")
            iterations, salt, digest = _iterations(parts[2]), parts[3], parts[4]
        else:
            if len(parts) != 4:
                raise ValueError("expected $6$<salt>$<hash>")
            iterations, salt, digest = 0, parts[2], parts[3]
        decoded_salt, decoded_digest = b64decode(salt), b64decode(digest)
        if not decoded_salt:
            raise ValueError("empty salt")
        if len(decoded_digest) != 64:
            raise ValueError("the hash must be 64 bytes (SHA-512)")
        return cls(parts[1], iterations, decoded_salt, decoded_digest)


def _iterations(text: str) -> int:
    if not text.isdigit() or not text.isascii():
        raise ValueError(f"iteration count {text!r} is not a number")
    value = int(text)
    if not 1 <= value <= MAX_ITERATIONS:
        raise ValueError(f"iteration count {value} is out of range (1 to {MAX_ITERATIONS})")
    return value


# -- entries ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class Entry:
    """One user of the file. ``unsupported`` says why the entry can never log in (Argon2)."""

    username: str
    line: int
    scram: tuple[ScramCredential, ...] = ()
    mosquitto: MosquittoHash | None = None
    unsupported: str = ""

    def credential(self, mechanism: str) -> ScramCredential | None:
        for cred in self.scram:
            if cred.mechanism == mechanism:
                return cred
        return None

    @property
    def kind(self) -> str:
        if self.scram:
            return " ".join(c.mechanism for c in self.scram)
        if self.mosquitto is not None:
            return f"Mosquitto ${self.mosquitto.scheme}$"
        return "unsupported"

    @property
    def cost(self) -> tuple[str, int] | None:
        """What :meth:`verify` derives: (SCRAM mechanism, or Mosquitto's "7" or "6";
        iterations), None if it derives nothing (unsupported)."""
        if self.scram:
            preferred = self.credential("SCRAM-SHA-512") or self.scram[0]
            return preferred.mechanism, preferred.iterations
        if self.mosquitto is not None:
            return self.mosquitto.scheme, self.mosquitto.iterations
        return None

    @property
    def weakest(self) -> tuple[int, str]:
        """The fewest iterations one of this entry's hashes takes to test a password (a
        ``$6$`` hash: 1), and that hash described; (0, "") when it holds none."""
        found = [
            (c.iterations, f"{c.mechanism} with {c.iterations} iterations") for c in self.scram
        ]
        if self.mosquitto is not None:
            if self.mosquitto.scheme == "6":
                found.append((1, "Mosquitto $6$: one round of SHA-512"))
            else:
                n = self.mosquitto.iterations
                found.append((n, f"Mosquitto $7$ with {n} iterations"))
        return min(found, default=(0, ""))

    def verify(self, password: bytes) -> bool:
        """Whether ``password`` is this user's (one key derivation, constant-time compare)."""
        if self.scram:
            preferred = self.credential("SCRAM-SHA-512") or self.scram[0]
            return preferred.verify(password)
        if self.mosquitto is not None:
            return self.mosquitto.verify(password)
        return False


def check_username(username: str) -> None:
    """ValueError if ``username`` cannot be written to a password file."""
    if not username:
        raise ValueError("the user name is empty")
    if ":" in username:
        raise ValueError("a user name may not contain ':'")
    if username != username.strip():
        raise ValueError("a user name may not start or end with white space")
    if username.startswith("#"):
        raise ValueError("a user name may not start with '#'")
    if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in username):
        raise ValueError("a user name may not contain control characters")


def make_entry_line(username: str, password: bytes, iterations: int | None = None) -> str:
    """The password-file line for ``username`` (both SCRAM verifiers, fresh salts)."""
    check_username(username)
    creds = [
        ScramCredential.derive(
            mechanism, password, iterations if iterations is not None else default
        )
        for mechanism, default in DEFAULT_ITERATIONS.items()
    ]
    return f"{username}:" + " ".join(cred.text() for cred in creds)


def parse_entry(text: str, line: int) -> Entry:
    """One non-blank, non-comment line (ValueError with the reason otherwise)."""
    username, sep, value = text.partition(":")
    if not sep:
        raise ValueError("expected NAME:HASH")
    check_username(username)
    if not value:
        raise ValueError(f"user {username!r} has no password hash")
    if value.startswith(("$7$", "$6$")):
        return Entry(username, line, mosquitto=MosquittoHash.parse(value))
    if value.startswith("$argon2"):
        return Entry(
            username,
            line,
            unsupported="Argon2 hashes cannot be checked (the standard library has no Argon2)",
        )
    if value.startswith("SCRAM-"):
        creds: list[ScramCredential] = []
        for part in value.split(" "):
            cred = ScramCredential.parse(part)
            if any(c.mechanism == cred.mechanism for c in creds):
                raise ValueError(f"{cred.mechanism} appears twice")
            creds.append(cred)
        return Entry(username, line, scram=tuple(creds))
    if "$" not in value:
        raise ValueError(
            f"user {username!r}: not a password hash (plain-text passwords are not accepted; "
            "set one with `mqttbroker passwd`)"
        )
    raise ValueError(f"user {username!r}: unknown hash scheme {value.split('$')[1]!r}")


# -- the file ---------------------------------------------------------------------------------


class PasswordFile:
    """A parsed password file: its entries by user name, and its lines as read (for rewriting
    with comments and other users untouched)."""

    def __init__(self, path: str, lines: list[str], entries: dict[str, Entry]) -> None:
        self.path = path
        self.lines = lines
        self.entries = entries
        self._usual: dict[str, int] = {}

    @property
    def warnings(self) -> list[str]:
        """Entries that cannot log in, and entries whose hash is weak (fewer iterations than
        MIN_ITERATIONS: a stolen file gives their passwords away quickly)."""
        found: list[str] = []
        for e in self.entries.values():
            fix = f"`mqttbroker passwd {self.path} {e.username}` sets a new password"
            iterations, weakest = e.weakest
            if e.unsupported:
                found.append(
                    f"{self.path}:{e.line}: user {e.username!r}: {e.unsupported}; this user "
                    f"cannot log in until {fix}"
                )
            elif iterations < MIN_ITERATIONS:
                found.append(
                    f"{self.path}:{e.line}: user {e.username!r}: weak password hash "
                    f"({weakest}; fewer than {MIN_ITERATIONS}): {fix} "
                    "(security.min_iterations refuses such entries)"
                )
        return found

    def usual_iterations(self, mechanism: str) -> int:
        """The iteration count most of the file's ``mechanism`` verifiers have (the default
        when none has one): what a made-up SCRAM answer for an unknown user shows."""
        usual = self._usual.get(mechanism)
        if usual is None:
            counts = Counter(
                cred.iterations
                for entry in self.entries.values()
                for cred in entry.scram
                if cred.mechanism == mechanism
            )
            common = counts.most_common(1)
            usual = self._usual[mechanism] = (
                common[0][0] if common else DEFAULT_ITERATIONS[mechanism]
            )
        return usual

    def usual_cost(self) -> tuple[str, int]:
        """What checking most of the file's entries costs (see Entry.cost); an unknown user's
        password is checked against a made-up entry of that cost."""
        counts = Counter(e.cost for e in self.entries.values() if e.cost is not None)
        common = counts.most_common(1)
        if common:
            return common[0][0]
        return "SCRAM-SHA-512", DEFAULT_ITERATIONS["SCRAM-SHA-512"]

    def get(self, username: str) -> Entry | None:
        return self.entries.get(username)

    def __len__(self) -> int:
        return len(self.entries)

    @classmethod
    def load(cls, path: str | Path, min_iterations: int = 0) -> PasswordFile:
        return cls.parse(read_file(path), str(path), min_iterations)

    @classmethod
    def parse(cls, data: bytes, source: str, min_iterations: int = 0) -> PasswordFile:
        """``min_iterations``: an entry with a hash of fewer iterations (a ``$6$`` hash has 1)
        is an error naming its line and user."""
        lines: list[str] = []
        entries: dict[str, Entry] = {}
        for number, raw in enumerate(data.splitlines(), 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise SecurityFileError(source, "not valid UTF-8", number) from None
            lines.append(text)
            stripped = text.strip()
            if not stripped or stripped.startswith("#"):
                continue
            try:
                entry = parse_entry(stripped, number)
            except ValueError as exc:
                raise SecurityFileError(source, str(exc), number) from None
            iterations, weakest = entry.weakest
            if not entry.unsupported and iterations < min_iterations:
                raise SecurityFileError(
                    source,
                    f"user {entry.username!r}: {weakest}, fewer than security.min_iterations "
                    f"({min_iterations}); `mqttbroker passwd {source} {entry.username}` sets a "
                    "new password",
                    number,
                )
            earlier = entries.get(entry.username)
            if earlier is not None:
                raise SecurityFileError(
                    source,
                    f"user {entry.username!r} is already defined on line {earlier.line}",
                    number,
                )
            entries[entry.username] = entry
        return cls(source, lines, entries)

    # -- editing (mqttbroker passwd) ------------------------------------------------------

    def set_line(self, username: str, line: str) -> bool:
        """Put ``line`` in place of ``username``'s entry, or at the end; True if it replaced one."""
        entry = self.entries.get(username)
        if entry is not None:
            self.lines[entry.line - 1] = line
            return True
        self.lines.append(line)
        return False

    def delete(self, username: str) -> bool:
        entry = self.entries.get(username)
        if entry is None:
            return False
        del self.lines[entry.line - 1]
        return True

    def render(self) -> bytes:
        return "".join(line + "\n" for line in self.lines).encode("utf-8")


def write_atomically(path: str | Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data``: a temporary file in the same directory, flushed to disk,
    renamed over the old one. An existing file's permissions (and owner, where allowed) are kept;
    a new file gets ``mode``."""
    target = Path(path)
    directory = target.parent
    old: os.stat_result | None
    try:
        old = target.stat()
    except FileNotFoundError:
        old = None
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), stat.S_IMODE(old.st_mode) if old else mode)
            if old is not None:
                try:
                    os.fchown(fh.fileno(), old.st_uid, old.st_gid)
                except PermissionError:
                    pass
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, target)
    except BaseException:
        try:
            os.unlink(temp)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(directory)


def _fsync_directory(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
