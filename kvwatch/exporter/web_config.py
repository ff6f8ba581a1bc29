"""The web config file, in the format of Prometheus' exporter-toolkit (a subset of it).

    tls_server_config:
      cert_file: /etc/kvwatch/tls.crt
      key_file: /etc/kvwatch/tls.key
      client_ca_file: /etc/kvwatch/ca.crt      # optional
      client_auth_type: RequireAndVerifyClientCert  # optional, default NoClientCert
      min_version: TLS12                       # optional, default TLS12
    basic_auth_users:
      prometheus: $2y$10$...                   # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

Keys kvwatch does not implement are refused with an error (never silently ignored:
they are security settings). Relative paths are relative to the file's directory.
"""
from __future__ import annotations

import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kvwatch.boundary.bounded_read import FileTooLarge, NotRegularFile, check_regular, read_bounded
from kvwatch.errors import ConfigError

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    # Python's ssl cannot ask for a client certificate without verifying it: these two verify.
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAnyClientCert": ssl.CERT_REQUIRED,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version", "max_version"}


@dataclass(frozen=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth_type: str = "NoClientCert"
    min_version: str = "TLS12"
    max_version: str | None = None

    def context(self) -> ssl.SSLContext:
        """A server-side SSLContext; ConfigError (one line) when a file cannot be used."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = TLS_VERSIONS[self.min_version]
        if self.max_version:
            ctx.maximum_version = TLS_VERSIONS[self.max_version]
        try:
            for path in (self.cert_file, self.key_file, self.client_ca_file):
                if path is not None:   # OpenSSL's own open would block on a FIFO as well
                    check_regular(path)
            # an encrypted key would make OpenSSL ask for a pass phrase on the terminal: never
            ctx.load_cert_chain(self.cert_file, self.key_file, password=lambda: b"")
            if self.client_ca_file is not None:
                ctx.load_verify_locations(cafile=str(self.client_ca_file))
        except NotRegularFile as exc:
            raise ConfigError(f"web config: TLS certificate or key {path}: {exc}") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"web config: TLS certificate or key: {exc}") from None
        ctx.verify_mode = CLIENT_AUTH[self.client_auth_type]
        return ctx


@dataclass(frozen=True)
class WebConfig:
    tls: TlsConfig | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash


MAX_WEB_CONFIG_BYTES = 1 << 20   # a web config is a few lines; a user list of thousands still fits
MAX_USERS = 1000
# bcrypt's cost is 2^cost rounds per check: cost 31 is hours of a core for one request (or for this
# check at start); exporter-toolkit's own hashes use 10 (htpasswd -B: 5..17). Above 14 a scrape
# takes over a second.
MAX_BCRYPT_COST = 14
_BCRYPT = re.compile(r"^\$2[aby]\$(\d\d)\$[./A-Za-z0-9]{53}$")


def load_web_config(path: str | Path) -> WebConfig:
    path = Path(path)
    try:
        doc = yaml.safe_load(read_bounded(path, MAX_WEB_CONFIG_BYTES).decode("utf-8"))
    except FileTooLarge as exc:   # never a truncated read: it would drop the TLS and auth sections
        raise ConfigError(f"web config {path}: {exc}: not a web config") from None
    except NotRegularFile as exc:
        raise ConfigError(f"web config {path}: {exc}: a web config is a regular file") from None
    except OSError as exc:
        raise ConfigError(f"web config {path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"web config {path}: not text (UTF-8 YAML expected)") from None
    except RecursionError:
        raise ConfigError(f"web config {path}: nested too deeply") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"web config {path}: not YAML: {str(exc).splitlines()[0]}") from None
    return parse_web_config(doc or {}, path.parent)


def parse_web_config(doc: Any, base: Path = Path(".")) -> WebConfig:
    if not isinstance(doc, dict):
        raise ConfigError("web config: expected a mapping at the top")
    unknown = set(doc) - {"tls_server_config", "basic_auth_users"}
    if unknown:
        raise ConfigError(f"web config: not supported by kvwatch: {', '.join(sorted(map(str, unknown)))}")
    tls = _tls(doc.get("tls_server_config"), base)
    users = doc.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise ConfigError("web config: basic_auth_users must map user names to bcrypt hashes")
    if len(users) > MAX_USERS:
        raise ConfigError(f"web config: basic_auth_users: more than {MAX_USERS} users")
    hashes: dict[str, bytes] = {}
    for user, hashed in users.items():
        if not isinstance(user, str) or not isinstance(hashed, str) or not hashed.startswith("$2"):
            raise ConfigError(f"web config: basic_auth_users: {str(user)[:64]!r}: expected a bcrypt hash "
                              "($2a$/$2b$/$2y$)")
        # A hash bcrypt cannot read would make every request a 401: refuse it now (by its form: a
        # check here would cost what a request costs, for each user).
        shape = _BCRYPT.match(hashed)
        if shape is None or not 4 <= int(shape.group(1)) <= 31:
            raise ConfigError(f"web config: basic_auth_users: {user[:64]!r}: not a valid bcrypt hash")
        if int(shape.group(1)) > MAX_BCRYPT_COST:
            raise ConfigError(f"web config: basic_auth_users: {user[:64]!r}: bcrypt cost {shape.group(1)} above "
                              f"{MAX_BCRYPT_COST}: each request would take seconds of a core")
        hashes[user] = hashed.encode()
    return WebConfig(tls=tls, users=hashes)


def _tls(section: Any, base: Path) -> TlsConfig | None:
    if section is None:
        return None
    if not isinstance(section, dict):
        raise ConfigError("web config: tls_server_config must be a mapping")
    unknown = set(section) - _TLS_KEYS
    if unknown:
        raise ConfigError(f"web config: tls_server_config: not supported by kvwatch: "
                          f"{', '.join(sorted(map(str, unknown)))}")
    for key in ("cert_file", "key_file"):
        if not section.get(key):
            raise ConfigError(f"web config: tls_server_config.{key} is required")
    auth = section.get("client_auth_type") or "NoClientCert"
    if auth not in CLIENT_AUTH:
        raise ConfigError(f"web config: client_auth_type {auth!r}: one of {', '.join(CLIENT_AUTH)}")
    if auth != "NoClientCert" and not section.get("client_ca_file"):
        raise ConfigError(f"web config: client_auth_type {auth} needs client_ca_file")
    for key in ("min_version", "max_version"):
        if section.get(key) is not None and section[key] not in TLS_VERSIONS:
            raise ConfigError(f"web config: {key} {section[key]!r}: one of {', '.join(TLS_VERSIONS)}")

    def resolve(value: Any) -> Path:
        p = Path(str(value)).expanduser()
        return p if p.is_absolute() else base / p

    return TlsConfig(cert_file=resolve(section["cert_file"]), key_file=resolve(section["key_file"]),
                     client_ca_file=resolve(section["client_ca_file"]) if section.get("client_ca_file") else None,
                     client_auth_type=auth, min_version=section.get("min_version") or "TLS12",
                     max_version=section.get("max_version"))
