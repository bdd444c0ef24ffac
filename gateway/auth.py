"""Session tokens: a user id signed with the gateway's secret (itsdangerous).

A token names one user and expires; anyone holding the secret can mint one, so the secret
lives with the service that authenticates people and hands tokens to their browsers.
"""

from __future__ import annotations

from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer

from candlewire.errors import CandlewireError
from candlewire.topics import check_id

_SALT = "candlewire-gateway-session"


class BadToken(CandlewireError):
    """The token is forged, expired or malformed."""


def check_secret(secret: str) -> None:
    if len(secret) < 16:
        raise CandlewireError(
            "the gateway secret is missing or shorter than 16 characters; "
            "set CANDLEWIRE_GATEWAY_SECRET or a secret file (`candlewire up` makes one under "
            ".candlewire/secrets, which a command run inside the checkout finds)"
        )


def _serializer(secret: str) -> URLSafeTimedSerializer:
    check_secret(secret)
    return URLSafeTimedSerializer(secret, salt=_SALT)


def issue_token(secret: str, user_id: str) -> str:
    return _serializer(secret).dumps({"user": check_id(user_id, "user id")})


def verify_token(secret: str, token: str, max_age_s: int) -> str:
    """The user id a token was issued for."""
    try:
        data = _serializer(secret).loads(token, max_age=max_age_s)
    except SignatureExpired as exc:
        raise BadToken("token expired") from exc
    except BadSignature as exc:
        raise BadToken("token signature does not match") from exc
    user = data.get("user") if isinstance(data, dict) else None
    if not isinstance(user, str):
        raise BadToken("token names no user")
    return user
