"""Turn an ``fs/*`` call's raw ``sandbox`` member into an :class:`FsRoute`.

The sandbox-policy layer (``sandbox/convert.py``) owns decoding and validating
both generations' contexts (legacy ``FileSystemSandboxContext``, PROTOCOL.md
§6.8; current permission context, CLIENT_COMPAT.md §1.4). Until it is
available this module classifies the context itself, strictly enough to fail
closed: anything that is not clearly a full-access context is routed to the
confined service (which refuses when absent), and malformed contexts are
``-32602`` naming the member.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import cast

import msgspec

from exec_server.exceptions import InvalidParamsError
from exec_server.fs.service import DIRECT, FsRoute

__all__ = ["route_from_wire"]

_LEGACY_DIRECT = frozenset({"danger-full-access", "external-sandbox"})
_LEGACY_CONFINED = frozenset({"read-only", "workspace-write"})


def _load_converter() -> Callable[[bytes], FsRoute] | None:
    try:
        mod = importlib.import_module("exec_server.sandbox.convert")
    except ImportError:
        return None
    fn = getattr(mod, "fs_route_from_wire", None)
    return cast("Callable[[bytes], FsRoute] | None", fn)


def route_from_wire(raw: bytes | None) -> FsRoute:
    """Route for a call whose ``sandbox`` member is ``raw`` JSON (``None``: absent/null).

    Raises:
        InvalidParamsError: the context does not decode (-32602).
    """
    if raw is None or raw.strip() in (b"", b"null"):
        return DIRECT
    converter = _load_converter()
    if converter is not None:
        return converter(raw)
    return _classify(raw)


def _field_error(message: str) -> InvalidParamsError:
    return InvalidParamsError(f"{message} - at `$.sandbox`")


def _require_str(obj: dict[str, object], key: str, where: str) -> str:
    if key not in obj:
        raise _field_error(f"missing field `{key}`{where}")
    value = obj[key]
    if not isinstance(value, str):
        raise _field_error(f"invalid type for `{key}`{where}: expected a string")
    return value


def _classify(raw: bytes) -> FsRoute:
    """Fallback classification (used only while ``sandbox/convert.py`` is missing)."""
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise _field_error(f"invalid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise _field_error("invalid type: expected a sandbox context object")
    _require_str(obj, "windowsSandboxLevel", "")
    confined = FsRoute(confined=True, context=raw)
    if "permissions" in obj:
        perms = obj["permissions"]
        if not isinstance(perms, dict):
            raise _field_error("invalid type for `permissions`: expected an object")
        kind = _require_str(perms, "type", " in `permissions`")
        if kind in ("disabled", "external"):
            return DIRECT
        if kind != "managed":
            raise _field_error(f"unknown variant `{kind}` in `permissions.type`")
        file_system = perms.get("file_system")
        if not isinstance(file_system, dict):
            raise _field_error("missing field `file_system` in `permissions`")
        fs_kind = _require_str(file_system, "type", " in `permissions.file_system`")
        if fs_kind == "unrestricted":
            return DIRECT
        if fs_kind != "restricted":
            raise _field_error(f"unknown variant `{fs_kind}` in `permissions.file_system.type`")
        return confined
    if "sandboxPolicy" in obj:
        policy = obj["sandboxPolicy"]
        if not isinstance(policy, dict):
            raise _field_error("invalid type for `sandboxPolicy`: expected an object")
        kind = _require_str(policy, "type", " in `sandboxPolicy`")
        if kind in _LEGACY_DIRECT:
            return DIRECT
        if kind in _LEGACY_CONFINED:
            return confined
        raise _field_error(f"unknown variant `{kind}` in `sandboxPolicy.type`")
    raise _field_error("missing field `permissions`")
