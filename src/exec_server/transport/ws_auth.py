"""WebSocket authentication: who may open a connection (AUTH_AND_DISCOVERY.md §1-§2).

``--ws-auth capability-token`` compares the presented token's SHA-256 with the
known digest in constant time; ``signed-bearer-token`` takes an HS256 JWT: PyJWT
checks the signature, the claims are checked here in upstream's order and
rules. The token travels in ``Authorization: Bearer``; nothing logs a token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from dataclasses import dataclass
from typing import Final

from exec_server.config import WsAuthMode, WsAuthSettings
from exec_server.exceptions import os_error_message

__all__ = [
    "DEFAULT_CLOCK_SKEW", "MIN_SHARED_SECRET", "AuthConfigError", "AuthRefused", "Authenticator",
    "CapabilityToken", "Grant", "SignedBearerToken", "WsAuthMode", "WsAuthSettings",
    "load_authenticator",
]

#: ``--ws-max-clock-skew-seconds`` default: slack for ``exp`` and ``nbf``.
DEFAULT_CLOCK_SKEW: Final = 30
MIN_SHARED_SECRET: Final = 32
_MAX_SKEW: Final = (1 << 63) - 1

INVALID_HEADER: Final = "invalid authorization header"
INVALID_JWT: Final = "invalid websocket jwt"


class AuthConfigError(ValueError):
    """The auth flags cannot start a server; ``str()`` is upstream's start-up text."""


class AuthRefused(Exception):
    """An upgrade is refused with 401; ``reason`` is the response body."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Grant:
    """An accepted upgrade. ``expires_at``: the Unix time after which the
    connection must close (a JWT's ``exp`` plus the skew), None for no limit."""

    expires_at: float | None = None


def _read_secret(path: str) -> bytes:
    """The trimmed contents of a token or secret file (upstream's texts on failure)."""
    absolute = os.path.abspath(path)
    try:
        with open(absolute, "rb") as f:
            data = f.read().strip()
    except OSError as exc:
        raise AuthConfigError(
            f"failed to read websocket auth secret {absolute}: {os_error_message(exc)}"
        ) from None
    if not data:
        raise AuthConfigError(f"websocket auth secret {absolute} must not be empty")
    return data


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization`` header value (``Bearer <token>``, visible ASCII)."""
    if header is None:
        raise AuthRefused("missing websocket bearer token")
    if not header.isascii() or not all(c == " " or c.isprintable() for c in header):
        raise AuthRefused(INVALID_HEADER)
    scheme, sep, rest = header.partition(" ")
    token = rest.strip()
    if not sep or scheme.lower() != "bearer" or not token:
        raise AuthRefused(INVALID_HEADER)
    return token


class Authenticator:
    """Checks the ``Authorization`` header of one upgrade request; one subclass per mode."""

    mode: WsAuthMode

    def __init__(self, key: bytes, key_file: str | None) -> None:
        self._key = key
        self._key_file = key_file

    @staticmethod
    def _load(path: str) -> bytes:
        raise NotImplementedError

    def _verify(self, token: str, now: float) -> Grant:
        raise NotImplementedError

    def check(self, authorization: str | None) -> Grant:
        """Raises :class:`AuthRefused` with the 401 body."""
        return self._verify(bearer_token(authorization), time.time())

    def reload(self) -> bool:
        """Read the token or secret file again (SIGHUP); False when there is none.
        AuthConfigError: the file is unusable (the old key stays)."""
        if self._key_file is None:
            return False
        self._key = self._load(self._key_file)
        return True


class CapabilityToken(Authenticator):
    """``--ws-auth capability-token``: compare SHA-256 digests in constant time."""

    mode: WsAuthMode = "capability-token"

    @staticmethod
    def _load(path: str) -> bytes:
        return hashlib.sha256(_read_secret(path)).digest()

    def _verify(self, token: str, now: float) -> Grant:
        if not hmac.compare_digest(hashlib.sha256(token.encode()).digest(), self._key):
            raise AuthRefused("invalid websocket bearer token")
        return Grant()


def _claim_int(claims: dict[str, object], name: str) -> int | None:
    value = claims.get(name)
    if value is None and name not in claims:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise AuthRefused(INVALID_JWT)
    return value


class SignedBearerToken(Authenticator):
    """``--ws-auth signed-bearer-token``: an HS256 JWT under a shared secret."""

    mode: WsAuthMode = "signed-bearer-token"

    def __init__(self, settings: WsAuthSettings) -> None:
        path = settings.shared_secret_file
        assert path is not None
        skew = DEFAULT_CLOCK_SKEW if settings.max_clock_skew is None else settings.max_clock_skew
        if skew > _MAX_SKEW:
            raise AuthConfigError("websocket auth clock skew must fit in a signed 64-bit integer")
        super().__init__(self._load(path), path)
        # A blank issuer or audience is not checked (upstream).
        self._issuer = settings.issuer if settings.issuer and settings.issuer.strip() else None
        audience = settings.audience
        self._audience = audience if audience and audience.strip() else None
        self._skew = skew

    @staticmethod
    def _load(path: str) -> bytes:
        secret = _read_secret(path)
        if len(secret) < MIN_SHARED_SECRET:
            raise AuthConfigError(
                f"signed websocket bearer secret {os.path.abspath(path)} "
                f"must be at least {MIN_SHARED_SECRET} bytes"
            )
        return secret

    def _verify(self, token: str, now: float) -> Grant:
        # Imported here: PyJWT loads `cryptography` (~8 MiB resident) when it is
        # installed, which a server without signed tokens never needs.
        import jwt

        try:
            claims = jwt.decode(
                token,
                self._key,
                algorithms=["HS256"],
                # only the signature: upstream's claim rules differ from PyJWT's
                options={
                    "verify_signature": True, "verify_exp": False, "verify_nbf": False,
                    "verify_iat": False, "verify_aud": False, "verify_iss": False,
                    "verify_sub": False, "verify_jti": False, "require": [],
                },
            )
        except jwt.PyJWTError:  # a payload that is not a JSON object too
            raise AuthRefused(INVALID_JWT) from None
        exp = _claim_int(claims, "exp")
        nbf = _claim_int(claims, "nbf")
        iss = claims.get("iss")
        aud = claims.get("aud")
        aud_ok = isinstance(aud, str) or (
            isinstance(aud, list) and all(isinstance(a, str) for a in aud)
        )
        if exp is None or ("iss" in claims and not isinstance(iss, str)) or (
            "aud" in claims and not aud_ok
        ):
            raise AuthRefused(INVALID_JWT)
        if now > exp + self._skew:
            raise AuthRefused("expired websocket jwt")
        if nbf is not None and now < nbf - self._skew:
            raise AuthRefused("websocket jwt is not valid yet")
        if self._issuer is not None and iss != self._issuer:
            raise AuthRefused("websocket jwt issuer mismatch")
        if self._audience is not None and not (
            aud == self._audience or (isinstance(aud, list) and self._audience in aud)
        ):
            raise AuthRefused("websocket jwt audience mismatch")
        return Grant(expires_at=float(exp + self._skew))


def load_authenticator(settings: WsAuthSettings, *, stdio: bool) -> Authenticator | None:
    """Validate the flags in upstream's order (upstream's texts) and read the files once;
    None without ``--ws-auth``."""
    mode = settings.mode
    jwt_flags = (
        settings.shared_secret_file is not None
        or settings.issuer is not None
        or settings.audience is not None
        or settings.max_clock_skew is not None
    )
    if mode is None:
        if settings.any_flag:
            raise AuthConfigError(
                "websocket auth flags require `--ws-auth capability-token` or "
                "`--ws-auth signed-bearer-token`"
            )
        return None
    if stdio:
        raise AuthConfigError("WebSocket auth requires a WebSocket listener, not stdio")
    if mode == "capability-token":
        if jwt_flags:
            raise AuthConfigError(
                "`--ws-shared-secret-file`, `--ws-issuer`, `--ws-audience`, and "
                "`--ws-max-clock-skew-seconds` require `--ws-auth signed-bearer-token`"
            )
        if settings.token_file is not None and settings.token_sha256 is not None:
            raise AuthConfigError(
                "`--ws-token-file` and `--ws-token-sha256` are mutually exclusive"
            )
        if settings.token_file is not None:
            return CapabilityToken(CapabilityToken._load(settings.token_file), settings.token_file)
        if settings.token_sha256 is not None:
            digest = settings.token_sha256.strip()
            if len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
                raise AuthConfigError(
                    "--ws-token-sha256 must be a 64-character hex SHA-256 digest"
                )
            return CapabilityToken(bytes.fromhex(digest), None)
        raise AuthConfigError(
            "`--ws-token-file` or `--ws-token-sha256` is required when "
            "`--ws-auth capability-token` is set"
        )
    if settings.token_file is not None or settings.token_sha256 is not None:
        raise AuthConfigError(
            "`--ws-token-file` and `--ws-token-sha256` require `--ws-auth capability-token`, "
            "not `signed-bearer-token`"
        )
    if settings.shared_secret_file is None:
        raise AuthConfigError(
            "`--ws-shared-secret-file` is required when `--ws-auth signed-bearer-token` is set"
        )
    return SignedBearerToken(settings)
