"""Secrets kept out of the configuration file: each is given as ``<key>_file`` (a file holding
it) or ``<key>_env`` (an environment variable), never both. One reading for all of them (the
admin token, the cluster's Redis password, the HTTP auth token, the JWT secret, a bridge's
password and a webhook's secret):

* trailing line ends (``\\n``, ``\\r\\n``) are removed, nothing else: a file written by an editor
  or by ``echo`` holds the secret and a newline, while spaces may be part of a password;
* an empty secret (an empty file, a variable set to "") is an error, as is a file that cannot
  be read or a variable that is not set: the message names the key and the file or variable.

The error is the caller's own exception (``error(where, detail)``, ``where`` the key such as
``admin.token_file``; :func:`joined` makes one of an exception taking one message), so that
each part of the configuration reports it as it reports its other problems.
"""

from __future__ import annotations

import os
from collections.abc import Callable


class SecretError(ValueError):
    """A secret that cannot be had; the message names the key and the file or variable."""


Error = Callable[[str, str], Exception]  # (where: the key, detail) -> the exception to raise


def joined(kind: Callable[[str], Exception]) -> Error:
    """An ``error`` for :func:`read_secret` raising ``kind("<where>: <detail>")``."""
    return lambda where, detail: kind(f"{where}: {detail}")


_SECRET_ERROR = joined(SecretError)


def read_secret(file: str, env: str, key: str, error: Error = _SECRET_ERROR) -> bytes | None:
    """The secret of ``<key>_file`` (``file``) or ``<key>_env`` (``env``): None when neither
    is set; ``error`` is raised for both set, an unreadable or empty file, a variable unset or
    empty. ``key`` is how messages name it (``admin.token``: ``admin.token_file``)."""
    if file and env:
        raise error(f"{key}_env", f"{key.rpartition('.')[2]}_file is set too; choose one")
    if file:
        try:
            with open(file, "rb") as handle:
                value = handle.read()
        except OSError as exc:
            raise error(f"{key}_file", f"cannot read {file}: {exc.strerror or exc}") from None
        value = value.rstrip(b"\r\n")
        if not value:
            raise error(f"{key}_file", f"{file} is empty")
        return value
    if env:
        text = os.environ.get(env)
        if text is None:
            raise error(f"{key}_env", f"the environment variable {env} is not set")
        value = os.fsencode(text).rstrip(b"\r\n")
        if not value:
            raise error(f"{key}_env", f"the environment variable {env} is empty")
        return value
    return None


def read_secret_text(file: str, env: str, key: str, error: Error = _SECRET_ERROR) -> str | None:
    """:func:`read_secret` as UTF-8 text (a password in a URL, a token in a header)."""
    value = read_secret(file, env, key, error)
    if value is None:
        return None
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        if file:
            raise error(f"{key}_file", f"{file} is not UTF-8 text") from None
        raise error(f"{key}_env", f"the environment variable {env} is not UTF-8 text") from None
