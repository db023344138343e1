"""WebSocket authentication: who may open a connection (AUTH_AND_DISCOVERY.md §1-§2).

Two modes, as upstream's ``--ws-auth``:

* ``capability-token``: the client presents a secret whose SHA-256 the server
  knows (from ``--ws-token-file`` or ``--ws-token-sha256``). The presented
  token is hashed and the two digests compared in constant time, so neither
  its length nor a matching prefix shows in the timing.
* ``signed-bearer-token``: an HS256 JWT signed with the shared secret of
  ``--ws-shared-secret-file``. PyJWT checks the structure, the algorithm and
  the signature; the claims are checked here, because upstream's rules differ
  from PyJWT's defaults (``exp`` required and an integer, ``iat`` ignored, an
  ``aud`` claim tolerated when no audience is configured, a fixed order of
  checks that decides which refusal text the client sees).

The token travels only in ``Authorization: Bearer <token>`` of the upgrade
request. Every refusal is an :class:`AuthRefused` whose ``reason`` is the
401 body. Nothing here ever logs or formats a token.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from exec_server.config import WsAuthMode, WsAuthSettings
from exec_server.exceptions import os_error_message

__all__ = [
    "DEFAULT_CLOCK_SKEW",
    "MIN_SHARED_SECRET",
    "AuthConfigError",
    "AuthRefused",
    "Authenticator",
    "CapabilityToken",
    "Grant",
    "SignedBearerToken",
    "WsAuthMode",
    "WsAuthSettings",
    "load_authenticator",
]

#: ``--ws-max-clock-skew-seconds`` default: slack for ``exp`` and ``nbf``.
DEFAULT_CLOCK_SKEW: Final = 30
#: A shared secret shorter than this (after trimming) is refused at start-up.
MIN_SHARED_SECRET: Final = 32
_MAX_SKEW: Final = (1 << 63) - 1

MISSING_TOKEN: Final = "missing websocket bearer token"
INVALID_HEADER: Final = "invalid authorization header"
INVALID_TOKEN: Final = "invalid websocket bearer token"
INVALID_JWT: Final = "invalid websocket jwt"
EXPIRED_JWT: Final = "expired websocket jwt"
IMMATURE_JWT: Final = "websocket jwt is not valid yet"
ISSUER_MISMATCH: Final = "websocket jwt issuer mismatch"
AUDIENCE_MISMATCH: Final = "websocket jwt audience mismatch"


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
            data = f.read()
    except OSError as exc:
        raise AuthConfigError(
            f"failed to read websocket auth secret {absolute}: {os_error_message(exc)}"
        ) from None
    data = data.strip()
    if not data:
        raise AuthConfigError(f"websocket auth secret {absolute} must not be empty")
    return data


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization`` header value.

    Raises:
        AuthRefused: no header, or not ``Bearer <token>`` in visible ASCII.
    """
    if header is None:
        raise AuthRefused(MISSING_TOKEN)
    if not header.isascii() or not all(c == " " or c.isprintable() for c in header):
        raise AuthRefused(INVALID_HEADER)
    scheme, sep, rest = header.partition(" ")
    token = rest.strip()
    if not sep or scheme.lower() != "bearer" or not token:
        raise AuthRefused(INVALID_HEADER)
    return token


class CapabilityToken:
    """``--ws-auth capability-token``: compare SHA-256 digests in constant time."""

    mode: Final = "capability-token"

    def __init__(self, digest: bytes, *, token_file: str | None = None) -> None:
        self._digest = digest
        self._token_file = token_file

    @classmethod
    def from_file(cls, path: str) -> CapabilityToken:
        return cls(hashlib.sha256(_read_secret(path)).digest(), token_file=path)

    @classmethod
    def from_hex(cls, text: str) -> CapabilityToken:
        text = text.strip()
        if len(text) != 64 or any(c not in "0123456789abcdefABCDEF" for c in text):
            raise AuthConfigError("--ws-token-sha256 must be a 64-character hex SHA-256 digest")
        return cls(bytes.fromhex(text))

    def verify(self, token: str, now: float) -> Grant:
        presented = hashlib.sha256(token.encode()).digest()
        if not hmac.compare_digest(presented, self._digest):
            raise AuthRefused(INVALID_TOKEN)
        return Grant()

    def reload(self) -> bool:
        """Read the token file again (SIGHUP); False when there is no file to read.

        Raises:
            AuthConfigError: the file is unreadable or empty (the old token stays).
        """
        if self._token_file is None:
            return False
        self._digest = hashlib.sha256(_read_secret(self._token_file)).digest()
        return True


def _claim_int(claims: dict[str, object], name: str) -> int | None:
    value = claims.get(name)
    if value is None and name not in claims:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise AuthRefused(INVALID_JWT)
    return value


class SignedBearerToken:
    """``--ws-auth signed-bearer-token``: an HS256 JWT under a shared secret."""

    mode: Final = "signed-bearer-token"

    def __init__(
        self,
        secret: bytes,
        *,
        issuer: str | None,
        audience: str | None,
        skew: int,
        secret_file: str | None = None,
    ) -> None:
        self._secret = secret
        # A blank issuer or audience is not checked (upstream).
        self._issuer = issuer if issuer and issuer.strip() else None
        self._audience = audience if audience and audience.strip() else None
        self._skew = skew
        self._secret_file = secret_file

    @staticmethod
    def _checked_secret(path: str) -> bytes:
        secret = _read_secret(path)
        if len(secret) < MIN_SHARED_SECRET:
            raise AuthConfigError(
                f"signed websocket bearer secret {os.path.abspath(path)} "
                f"must be at least {MIN_SHARED_SECRET} bytes"
            )
        return secret

    @classmethod
    def from_settings(cls, settings: WsAuthSettings) -> SignedBearerToken:
        assert settings.shared_secret_file is not None
        skew = DEFAULT_CLOCK_SKEW if settings.max_clock_skew is None else settings.max_clock_skew
        if skew > _MAX_SKEW:
            raise AuthConfigError("websocket auth clock skew must fit in a signed 64-bit integer")
        return cls(
            cls._checked_secret(settings.shared_secret_file),
            issuer=settings.issuer,
            audience=settings.audience,
            skew=skew,
            secret_file=settings.shared_secret_file,
        )

    def verify(self, token: str, now: float) -> Grant:
        # Imported here: PyJWT loads `cryptography` (~8 MiB resident) when it is
        # installed, which a server without signed tokens never needs.
        import jwt

        try:
            claims = jwt.decode(
                token,
                self._secret,
                algorithms=["HS256"],
                options={
                    "verify_signature": True,
                    "verify_exp": False,
                    "verify_nbf": False,
                    "verify_iat": False,
                    "verify_aud": False,
                    "verify_iss": False,
                    "verify_sub": False,
                    "verify_jti": False,
                    "require": [],
                },
            )
        except jwt.PyJWTError:
            raise AuthRefused(INVALID_JWT) from None
        if not isinstance(claims, dict):
            raise AuthRefused(INVALID_JWT)
        exp = _claim_int(claims, "exp")
        nbf = _claim_int(claims, "nbf")
        iss = claims.get("iss")
        aud = claims.get("aud")
        if exp is None:
            raise AuthRefused(INVALID_JWT)
        if "iss" in claims and not isinstance(iss, str):
            raise AuthRefused(INVALID_JWT)
        if "aud" in claims and not (
            isinstance(aud, str)
            or (isinstance(aud, list) and all(isinstance(a, str) for a in aud))
        ):
            raise AuthRefused(INVALID_JWT)
        if now > exp + self._skew:
            raise AuthRefused(EXPIRED_JWT)
        if nbf is not None and now < nbf - self._skew:
            raise AuthRefused(IMMATURE_JWT)
        if self._issuer is not None and iss != self._issuer:
            raise AuthRefused(ISSUER_MISMATCH)
        if self._audience is not None and not (
            aud == self._audience or (isinstance(aud, list) and self._audience in aud)
        ):
            raise AuthRefused(AUDIENCE_MISMATCH)
        return Grant(expires_at=float(exp + self._skew))

    def reload(self) -> bool:
        """Read the shared secret again (SIGHUP).

        Raises:
            AuthConfigError: unreadable, empty or too short (the old secret stays).
        """
        if self._secret_file is None:
            return False
        self._secret = self._checked_secret(self._secret_file)
        return True


class Authenticator:
    """Checks the ``Authorization`` header of one upgrade request."""

    def __init__(
        self,
        verifier: CapabilityToken | SignedBearerToken,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.verifier = verifier
        self._clock = clock

    @property
    def mode(self) -> WsAuthMode:
        return self.verifier.mode

    def check(self, authorization: str | None) -> Grant:
        """Raises :class:`AuthRefused` with the 401 body."""
        return self.verifier.verify(bearer_token(authorization), self._clock())

    def reload(self) -> bool:
        """Re-read the token or secret file; see the verifiers' ``reload``."""
        return self.verifier.reload()


def load_authenticator(settings: WsAuthSettings, *, stdio: bool) -> Authenticator | None:
    """Validate the flags in upstream's order and read the files once.

    Returns None when no ``--ws-auth`` is given (and no auth flag either).

    Raises:
        AuthConfigError: with upstream's start-up text.
    """
    mode = settings.mode
    jwt_flags = (
        settings.shared_secret_file is not None
        or settings.issuer is not None
        or settings.audience is not None
        or settings.max_clock_skew is not None
    )
    token_flags = settings.token_file is not None or settings.token_sha256 is not None
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
            return Authenticator(CapabilityToken.from_file(settings.token_file))
        if settings.token_sha256 is not None:
            return Authenticator(CapabilityToken.from_hex(settings.token_sha256))
        raise AuthConfigError(
            "`--ws-token-file` or `--ws-token-sha256` is required when "
            "`--ws-auth capability-token` is set"
        )
    if token_flags:
        raise AuthConfigError(
            "`--ws-token-file` and `--ws-token-sha256` require `--ws-auth capability-token`, "
            "not `signed-bearer-token`"
        )
    if settings.shared_secret_file is None:
        raise AuthConfigError(
            "`--ws-shared-secret-file` is required when `--ws-auth signed-bearer-token` is set"
        )
    return Authenticator(SignedBearerToken.from_settings(settings))
