"""macOS Seatbelt: a :class:`SandboxPlan` → profile text + ``sandbox-exec`` argv (SANDBOX.md
§4). Paths travel as canonical ``-D<KEY>=<value>`` parameters, never in the text, except the
regex guards keeping ``.git`` & co. read-only before they exist. Pure text: runs anywhere."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from exec_server.process.spec import LaunchSpec
from exec_server.sandbox.plan import SandboxPlan, SandboxType
from exec_server.sandbox.policy import PROTECTED_NAMES, is_within

__all__ = [
    "BASE_POLICY", "NETWORK_POLICY", "PLATFORM_DEFAULTS_POLICY", "SANDBOX_EXEC", "SeatbeltCommand",
    "build", "darwin_user_cache_dir", "wrap",
]

#: Absolute path, never a PATH lookup: a planted binary would defeat the sandbox.
SANDBOX_EXEC = "/usr/bin/sandbox-exec"

BASE_POLICY = """\
(version 1)

; closed by default
(deny default)

; processes may spawn children, which inherit this policy
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))

; /dev/null is writable (character device only)
(allow file-write-data
  (require-all
    (path "/dev/null")
    (vnode-type CHARACTER-DEVICE)))

; system information commonly queried by runtimes
(allow sysctl-read
  (sysctl-name "hw.activecpu")
  (sysctl-name "hw.busfrequency_compat")
  (sysctl-name "hw.byteorder")
  (sysctl-name "hw.cacheconfig")
  (sysctl-name "hw.cachelinesize_compat")
  (sysctl-name "hw.cpufamily")
  (sysctl-name "hw.cpufrequency_compat")
  (sysctl-name "hw.cputype")
  (sysctl-name "hw.l1dcachesize_compat")
  (sysctl-name "hw.l1icachesize_compat")
  (sysctl-name "hw.l2cachesize_compat")
  (sysctl-name "hw.l3cachesize_compat")
  (sysctl-name "hw.logicalcpu_max")
  (sysctl-name "hw.machine")
  (sysctl-name "hw.memsize")
  (sysctl-name "hw.ncpu")
  (sysctl-name "hw.nperflevels")
  (sysctl-name "hw.packages")
  (sysctl-name "hw.pagesize_compat")
  (sysctl-name "hw.pagesize")
  (sysctl-name "hw.physicalcpu")
  (sysctl-name "hw.physicalcpu_max")
  (sysctl-name "hw.logicalcpu")
  (sysctl-name "hw.tbfrequency_compat")
  (sysctl-name "hw.vectorunit")
  (sysctl-name "kern.argmax")
  (sysctl-name "kern.hostname")
  (sysctl-name "kern.maxfilesperproc")
  (sysctl-name "kern.maxproc")
  (sysctl-name "kern.osproductversion")
  (sysctl-name "kern.osrelease")
  (sysctl-name "kern.ostype")
  (sysctl-name "kern.osvariant_status")
  (sysctl-name "kern.osversion")
  (sysctl-name "kern.secure_kernel")
  (sysctl-name "kern.usrstack64")
  (sysctl-name "kern.version")
  (sysctl-name "machdep.cpu.brand_string")
  (sysctl-name "sysctl.proc_cputype")
  (sysctl-name "vm.loadavg")
  (sysctl-name-prefix "hw.optional.arm.")
  (sysctl-name-prefix "hw.optional.")
  (sysctl-name-prefix "hw.perflevel")
  (sysctl-name-prefix "kern.proc.pgrp.")
  (sysctl-name-prefix "kern.proc.pid.")
  (sysctl-name-prefix "net.routetable.")
)

; Rosetta and some runtimes write this one sysctl
(allow sysctl-write
  (sysctl-name "kern.grade_cputype"))

; power management queries
(allow iokit-open
  (iokit-registry-entry-class "RootDomainUserClient"))

; user/group lookups, power assertions, preferences
(allow mach-lookup
  (global-name "com.apple.system.opendirectoryd.libinfo")
  (global-name "com.apple.PowerManagement.control")
  (global-name "com.apple.cfprefsd.daemon")
  (global-name "com.apple.cfprefsd.agent")
  (local-name "com.apple.cfprefsd.agent"))

; POSIX semaphores (Python multiprocessing)
(allow ipc-posix-sem)

; OpenMP (KMP) runtime registration
(allow ipc-posix-shm-read* ipc-posix-shm-write-create ipc-posix-shm-write-unlink
  (ipc-posix-name-regex #"^/__KMP_REGISTERED_LIB_[0-9]+$"))

; pseudo-terminals
(allow pseudo-tty)
(allow file-read* file-write* file-ioctl
  (literal "/dev/ptmx"))
(allow file-read* file-write*
  (require-all
    (regex #"^/dev/ttys[0-9]+")
    (extension "com.apple.sandbox.pty")))
(allow file-ioctl
  (regex #"^/dev/ttys[0-9]+"))

(allow user-preference-read)

; ps needs privileges it cannot get inside the sandbox
(allow process-exec
  (literal "/bin/ps")
  (with no-sandbox))
"""

NETWORK_POLICY = """\
; network services used by resolvers, TLS and proxies
(allow network-outbound)
(allow network-inbound)
(allow system-socket
  (require-all
    (socket-domain AF_SYSTEM)
    (socket-protocol 2)))
(allow mach-lookup
  (global-name "com.apple.bsd.dirhelper")
  (global-name "com.apple.system.opendirectoryd.membership")
  (global-name "com.apple.SecurityServer")
  (global-name "com.apple.networkd")
  (global-name "com.apple.ocspd")
  (global-name "com.apple.trustd.agent")
  (global-name "com.apple.SystemConfiguration.DNSConfiguration")
  (global-name "com.apple.SystemConfiguration.configd"))
(allow sysctl-read
  (sysctl-name-prefix "net.routetable"))
"""

PLATFORM_DEFAULTS_POLICY = """\
; platform defaults: what dyld, libc and common tools read
(allow file-read* file-test-existence
  (subpath "/Library/Apple")
  (subpath "/Library/Filesystems/NetFSPlugins")
  (subpath "/Library/Preferences/Logging")
  (subpath "/System")
  (subpath "/bin")
  (subpath "/sbin")
  (subpath "/usr/bin")
  (subpath "/usr/lib")
  (subpath "/usr/libexec")
  (subpath "/usr/sbin")
  (subpath "/usr/share")
  (subpath "/private/var/db/timezone")
  (subpath "/private/etc")
  (literal "/etc")
  (literal "/tmp")
  (literal "/var")
  (literal "/private")
  (literal "/dev/null")
  (literal "/dev/random")
  (literal "/dev/urandom")
  (literal "/dev/zero")
  (literal "/dev/dtracehelper")
  (literal "/dev/autofs_nowait")
  (literal "/dev/tty")
  (literal "/"))
(allow file-read-metadata
  (subpath "/"))
"""


@dataclass(frozen=True, slots=True)
class SeatbeltCommand:
    """SBPL ``profile`` text and ``(KEY, value)`` parameters, in order."""

    profile: str
    params: tuple[tuple[str, str], ...]

    def argv(self, command: Sequence[str]) -> list[str]:
        params = (f"-D{key}={value}" for key, value in self.params)
        return [SANDBOX_EXEC, "-p", self.profile, *params, "--", *command]


_REGEX_SPECIAL = frozenset(".^$*+?()[]{}|\\")


def regex_escape(text: str) -> str:
    """Escape POSIX regex metacharacters (only those: Seatbelt's matcher is not Python's)."""
    return "".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in text)


def _regex_literal(pattern: str) -> str:
    # ``#"..."``: a raw regex literal, only a quote needs escaping
    return '#"' + pattern.replace('"', '\\"') + '"'


def darwin_user_cache_dir() -> str | None:
    try:
        value = os.confstr("CS_DARWIN_USER_CACHE_DIR")
    except (ValueError, OSError):
        return None
    return value or None


def _subpaths(prefix: str, paths: Sequence[str]) -> tuple[list[tuple[str, str]], list[str]]:
    params = [(f"{prefix}_{i}", path) for i, path in enumerate(paths)]
    return params, [f'(subpath (param "{key}"))' for key, _ in params]


def _block(head: str, components: Sequence[str]) -> str:
    return f"({head}\n" + " ".join(components) + "\n)"


def _root_component(key: str, root: str,
                    excluded: Sequence[str]) -> tuple[str, list[tuple[str, str]]]:
    params: list[tuple[str, str]] = []
    parts = [f'(require-all (subpath (param "{key}"))']
    for j, path in enumerate(excluded):
        ekey = f"{key}_EXCLUDED_{j}"
        params.append((ekey, path))
        # literal closes the gap of creating the protected directory itself
        parts.append(f'(require-not (literal (param "{ekey}")))')
        parts.append(f'(require-not (subpath (param "{ekey}")))')
    base = "" if root == "/" else regex_escape(root)
    for name in PROTECTED_NAMES:
        guard = _regex_literal("^" + base + "/" + regex_escape(name) + "(/.*)?$")
        parts.append(f"(require-not (regex {guard}))")
    return " ".join(parts) + " )", params


def build(plan: SandboxPlan, *, include_platform_defaults: bool = False,
          realpath: Callable[[str], str] = os.path.realpath,
          user_cache_dir: str | None = None) -> SeatbeltCommand:
    """Profile and parameters for ``plan`` (platform-default reads on request when restricted)."""
    def canonical(paths: Sequence[str]) -> list[str]:
        return list(dict.fromkeys(map(realpath, paths)))

    writable = [] if plan.full_write else canonical(plan.writable_roots)
    read_only = canonical(plan.read_only_subpaths)
    denied = canonical(plan.denied_paths)

    read_params: list[tuple[str, str]] = []
    if plan.full_read:
        read_section = "; allow read-only file operations\n(allow file-read*)"
    else:
        readable = list(dict.fromkeys(canonical(plan.readable_roots) + writable))
        read_params, components = _subpaths("READABLE_ROOT", readable)
        read_section = "; allow read-only file operations\n"
        if components:
            read_section += _block("allow file-read*", components)

    write_params: list[tuple[str, str]] = []
    if plan.full_write:
        write_section = '(allow file-write* (regex #"^/"))'
    elif writable:
        components = []
        for i, root in enumerate(writable):
            key = f"WRITABLE_ROOT_{i}"
            write_params.append((key, root))
            excluded = [p for p in read_only if p != root and is_within(p, root)]
            component, extra = _root_component(key, root, excluded)
            write_params.extend(extra)
            components.append(component)
        write_section = _block("allow file-write*", components)
    else:
        write_section = ""

    # denials carved out of readable/writable areas (later rules override earlier ones)
    deny_params, components = _subpaths("DENIED_PATH", denied)
    deny_section = _block("deny file-read* file-write*", components) if denied else ""

    network_section = NETWORK_POLICY if plan.network else ""
    defaults_section = (
        PLATFORM_DEFAULTS_POLICY if include_platform_defaults and not plan.full_read else ""
    )
    params = read_params + write_params + deny_params
    if user_cache_dir:
        params.append(("DARWIN_USER_CACHE_DIR", realpath(user_cache_dir)))
    profile = "\n".join(
        [BASE_POLICY, read_section, write_section, deny_section, network_section, defaults_section]
    )
    return SeatbeltCommand(profile, tuple(params))


def wrap(spec: LaunchSpec, plan: SandboxPlan, *,
         include_platform_defaults: bool = False) -> LaunchSpec:
    """Run ``spec`` under ``sandbox-exec`` (PROTOCOL.md §7.4, §7.5); it cannot set argv0."""
    command = build(plan, include_platform_defaults=include_platform_defaults,
                    user_cache_dir=darwin_user_cache_dir())
    env = dict(spec.env)
    env["CODEX_SANDBOX"] = "seatbelt"
    if not plan.network:
        env["CODEX_SANDBOX_NETWORK_DISABLED"] = "1"
    return replace(spec, argv=command.argv(spec.argv), env=env, arg0=None,
                   sandbox_type=SandboxType.MACOS_SEATBELT)
