"""One listen-address parser (kvwatch.listen) for the config file, `kvwatch run --listen` and the
exporter's server, so the three accept and refuse the same addresses."""
from __future__ import annotations

import pytest

from kvwatch.errors import ConfigError
from kvwatch.exporter import server
from kvwatch.listen import DEFAULT_LISTEN, parse_listen
from kvwatch.watchdog import config
from kvwatch.watchdog.config import Config, config_from_mapping, with_overrides


@pytest.mark.parametrize("text,expected", [
    ("127.0.0.1:9400", ("127.0.0.1", 9400)),
    ("localhost:9400", ("localhost", 9400)),
    (":9400", ("0.0.0.0", 9400)),                  # all IPv4 interfaces
    ("0.0.0.0:9400", ("0.0.0.0", 9400)),
    ("[::1]:9400", ("::1", 9400)),
    ("[::]:9400", ("::", 9400)),
    ("[fe80::1%eth0]:9400", ("fe80::1%eth0", 9400)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),             # the kernel picks a free port
    ("127.0.0.1:65535", ("127.0.0.1", 65535)),
    (DEFAULT_LISTEN, ("127.0.0.1", 9400)),
])
def test_accepted(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", [
    "\x00:9400", "h\u00e9llo..:9400", "a b:9400", "[::1\x00]:9400",   # the socket layer raised TypeError for these
    "", "9400", ":", "host:", "host:port", "h:99999", "h:65536", "h:-1", "h: 9400", "h:9400 ",
    "h:٩٤٠٠",                     # Unicode digits are digits to str.isdigit(), not to a port
    "::1:9400",                   # an IPv6 address without brackets is ambiguous
    "[::1:9400", "::1]:9400",     # unmatched brackets
    "[]:9400", "[localhost]:9400", "[[::1]]:9400",
])
def test_refused_with_one_clear_line(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_listen(text)
    message = str(info.value)
    assert message.startswith(f"listen {text!r}: ") and "\n" not in message


def test_config_and_server_use_the_same_parser() -> None:
    assert config.parse_listen is parse_listen and server.parse_listen is parse_listen
    assert config.DEFAULT_LISTEN == server.DEFAULT_LISTEN == DEFAULT_LISTEN


def test_the_config_file_and_the_flag_agree_with_the_server() -> None:
    assert config_from_mapping({"listen": "[::1]:0"}).listen_address == ("::1", 0)
    assert with_overrides(Config(), listen="127.0.0.1:0", command=["vllm", "serve", "m"]).listen_address == ("127.0.0.1", 0)
    for bad in ("[::1:9400", "::1:9400"):
        with pytest.raises(ConfigError, match="config k.toml: listen"):
            config_from_mapping({"listen": bad}, "k.toml")
        with pytest.raises(ConfigError, match="^listen"):
            with_overrides(Config(), listen=bad, command=["vllm", "serve", "m"])
