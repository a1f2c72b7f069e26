"""Credentials taken out of the URLs in a text, before the text reaches a log, a message or a file: the library
prints the URLs its users configure (a tracking server's, a study's database), and those often carry a password
(``https://user:password@host``) or a token in the query (``?token=...``)."""

from __future__ import annotations

import re

__all__ = ["SECRET_QUERY_KEYS", "redact_credentials"]

#: the query parameters whose value is a credential (compared without case)
SECRET_QUERY_KEYS = ("token", "access_token", "refresh_token", "id_token", "auth", "auth_token", "api_key", "apikey",
                     "key", "password", "passwd", "pwd", "secret", "client_secret", "sig", "signature",
                     "x-amz-signature", "x-amz-credential", "x-amz-security-token", "sas", "code")
#: what stands in for a removed credential
MASK = "***"

# The user information of a URL: everything between "scheme://" and the last "@" before the host's end. A password
# may hold any character but "/" (RFC 3986 encodes it), so the match stops at a slash, a space or a quote.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^/\s'\"<>@]*(?:@[^/\s'\"<>@]*)*)@")
# A secret query parameter, inside a URL or in a path quoted without its scheme (an HTTP library's "url: /?token=").
_QUERY = re.compile(r"(?P<lead>[?&;](?:" + "|".join(re.escape(k) for k in SECRET_QUERY_KEYS) + r")=)"
                    r"(?P<value>[^&#\s'\"<>;/]*)", re.IGNORECASE)


def redact_credentials(text: str) -> str:
    """``text`` with the user information of every URL in it (``user:password@``) and the values of its secret
    query parameters (:data:`SECRET_QUERY_KEYS`) replaced by ``***``; the rest (scheme, host, port, path, the other
    parameters) is kept, so that a message still says which server it is about.

    Args:
        text: a URL, or a message that holds URLs.

    Returns:
        the text without credentials.

    >>> redact_credentials("http://alice:s3cret@mlflow.example:5000/?token=abc&x=1")
    'http://***@mlflow.example:5000/?token=***&x=1'
    >>> redact_credentials("cannot open postgresql://bob:p%40ss@db/optuna (timeout)")
    'cannot open postgresql://***@db/optuna (timeout)'
    >>> redact_credentials("sqlite:///runs/sweeps.db")
    'sqlite:///runs/sweeps.db'
    """
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    return _QUERY.sub(lambda m: f"{m['lead']}{MASK}", text)
