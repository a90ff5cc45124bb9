"""The client certificate's identity (mutual TLS): ``tls_certificate_username`` = ``"cn"`` or
``"san"`` makes the verified certificate's Common Name, or its first Subject Alternative Name,
the connection's user name; the Link exposes it as ``certificate_user``. The SSL contexts
themselves are built from the configuration in ``security/tls.py``.
"""

from __future__ import annotations

from typing import Any


def certificate_user(cert: Any, field: str) -> str | None:
    """The user name a verified client certificate gives: its subject's Common Name
    (``field="cn"``) or its first Subject Alternative Name (``"san"``: DNS name, e-mail, URI or IP
    address, whichever comes first). ``cert`` is the transport's ``get_extra_info("peercert")``
    (``ssl``'s ``getpeercert()``, which the C transport's TLS gives in the same form). None
    without a verified certificate, with ``field`` "none", or when the certificate has no such
    name."""
    if field not in ("cn", "san") or not isinstance(cert, dict):
        return None
    if not cert:  # no certificate, or not verified (getpeercert() is {} then)
        return None
    if field == "cn":
        for rdn in cert.get("subject", ()):
            for name, value in rdn:
                if name == "commonName" and value:
                    return str(value)
        return None
    for _kind, value in cert.get("subjectAltName", ()):
        if value:
            return str(value)
    return None
