"""systemd's notify protocol: datagrams to $NOTIFY_SOCKET (READY=1, STATUS=..., WATCHDOG=1).

Plain sockets, no libsystemd: an AF_UNIX datagram to the path in NOTIFY_SOCKET, where
a leading '@' names an abstract socket. Without NOTIFY_SOCKET every call does nothing.
"""
from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

_LOG = logging.getLogger(__name__)

# What systemd gives kvwatch and must not leak to the engine: with NotifyAccess=all a
# child could otherwise speak for kvwatch (and vLLM would see a watchdog it never feeds).
NOTIFY_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")


def scrub_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in NOTIFY_ENV}


class SdNotifier:
    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_interval = watchdog_usec / 2e6 if watchdog_usec else None  # half, as sd_watchdog_enabled advises
        self._next_watchdog: float | None = None
        self._warned = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SdNotifier:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        usec: int | None = None
        raw = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if raw.isdigit() and int(raw) > 0 and (not pid or pid == str(os.getpid())):
            usec = int(raw)
        return cls(address, usec)

    def notify(self, *lines: str) -> bool:
        if not self.address or not lines:
            return False
        address = self.address
        if address.startswith("@"):
            address = "\0" + address[1:]
        message = "\n".join(line.replace("\n", " ") for line in lines).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(address)
                sock.sendall(message)
            return True
        except OSError as exc:
            if not self._warned:  # say it once; systemd may simply not listen (e.g. Type=simple)
                _LOG.warning("sd_notify: %s: %s", self.address, exc)
                self._warned = True
            return False

    def ready(self, status: str) -> None:
        self.notify("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.notify(f"STATUS={status}")

    def stopping(self, status: str) -> None:
        self.notify("STOPPING=1", f"STATUS={status}")

    def watchdog(self, now: float) -> bool:
        """Send WATCHDOG=1 when due (every half WATCHDOG_USEC). Call only from a healthy loop."""
        if self.watchdog_interval is None or not self.address:
            return False
        if self._next_watchdog is not None and now < self._next_watchdog:
            return False
        self._next_watchdog = now + self.watchdog_interval
        return self.notify("WATCHDOG=1")
