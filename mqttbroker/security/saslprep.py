"""SASLprep (RFC 4013), the stringprep profile SCRAM applies to passwords (RFC 5802 section 2.2).

Built on the standard library's :mod:`stringprep` tables, which are those of Unicode 3.2 that
RFC 3454 is defined against; the normalization step uses the same Unicode version.
"""

from __future__ import annotations

import stringprep
import unicodedata
from collections.abc import Callable

_PROHIBITED: tuple[Callable[[str], bool], ...] = (
    stringprep.in_table_c12,  # non-ASCII space
    stringprep.in_table_c21_c22,  # control characters
    stringprep.in_table_c3,  # private use
    stringprep.in_table_c4,  # non-character code points
    stringprep.in_table_c5,  # surrogates
    stringprep.in_table_c6,  # inappropriate for plain text
    stringprep.in_table_c7,  # inappropriate for canonical representation
    stringprep.in_table_c8,  # change display properties, deprecated
    stringprep.in_table_c9,  # tagging characters
)


def saslprep(text: str) -> str:
    """The prepared form of ``text``; ValueError if it holds a character SASLprep prohibits
    (unassigned code points included: passwords are stored strings)."""
    # Mapping: non-ASCII spaces become SPACE, "commonly mapped to nothing" characters go.
    mapped = "".join(
        " " if stringprep.in_table_c12(ch) else ch for ch in text if not stringprep.in_table_b1(ch)
    )
    prepared = unicodedata.ucd_3_2_0.normalize("NFKC", mapped)
    for ch in prepared:
        if any(table(ch) for table in _PROHIBITED):
            raise ValueError(f"prohibited character U+{ord(ch):04X}")
        if stringprep.in_table_a1(ch):
            raise ValueError(f"unassigned code point U+{ord(ch):04X}")
    # Bidirectional text (RFC 3454 section 6): right-to-left text may not contain
    # left-to-right characters, and must begin and end with a right-to-left character.
    if any(stringprep.in_table_d1(ch) for ch in prepared):
        if any(stringprep.in_table_d2(ch) for ch in prepared):
            raise ValueError("mixes right-to-left and left-to-right characters")
        if not (stringprep.in_table_d1(prepared[0]) and stringprep.in_table_d1(prepared[-1])):
            raise ValueError("right-to-left text must start and end with a right-to-left character")
    return prepared


def normalize_password(password: bytes) -> bytes:
    """The bytes SCRAM derives keys from: the SASLprep form of a UTF-8 password, or the password
    itself when it is not UTF-8 or SASLprep refuses it (then the client must send the same bytes).
    The same function runs when a password is stored and when one is checked."""
    try:
        return saslprep(password.decode("utf-8")).encode("utf-8")
    except ValueError:  # UnicodeDecodeError is a ValueError too
        return password
