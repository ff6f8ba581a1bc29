"""The listen address of kvwatch's own HTTP server, as `kvwatch run`, `kvwatch export` and the config
file write it (pure: text in, (host, port) out)."""
from __future__ import annotations

from kvwatch.errors import ConfigError

DEFAULT_LISTEN = "127.0.0.1:9400"


def parse_listen(text: str) -> tuple[str, int]:
    """'HOST:PORT', '[IPv6]:PORT', or ':PORT' (all IPv4 interfaces) -> (host, port).

    PORT is 0 to 65535; 0 lets the kernel pick a free port (the server then reports the one it got).
    An IPv6 address is written in brackets, and only an IPv6 address: '[::1]:9400', not '::1:9400'.
    """
    host, sep, port = text.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ConfigError(f"listen {text!r}: expected HOST:PORT, e.g. {DEFAULT_LISTEN}")
    if host.startswith("[") or host.endswith("]"):
        inner = host[1:-1]
        if not (host.startswith("[") and host.endswith("]")) or ":" not in inner or "[" in inner or "]" in inner:
            raise ConfigError(f"listen {text!r}: brackets hold an IPv6 address, e.g. [::1]:9400")
        _check_host(text, inner)
        return inner, int(port)
    if ":" in host:
        raise ConfigError(f"listen {text!r}: write an IPv6 address in brackets, e.g. [::1]:9400")
    _check_host(text, host)
    return host or "0.0.0.0", int(port)


def _check_host(text: str, host: str) -> None:
    # the socket layer raises TypeError for a NUL or a name IDNA cannot encode: say it here, in one line
    if not (host.isascii() and host.isprintable()) or ".." in host or any(c.isspace() for c in host):
        raise ConfigError(f"listen {text!r}: the host must be an address or a plain host name")
