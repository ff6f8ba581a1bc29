"""Which release's facts a plan uses (kvwatch.vllm_releases.resolve), as a table."""
from __future__ import annotations

import pytest

from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases import KNOWN, resolve


@pytest.mark.parametrize("asked,used,exact,why", [
    ("0.32.0", "0.32.0", True, ""),
    ("0.32.3", "0.32.0", True, ""),                  # a patch plans as its minor
    ("0.10.1.1", "0.10.2", True, ""),
    ("0.40.1", str(max(KNOWN)), False, "newer than any release kvwatch has read"),
    ("1.0.0", str(max(KNOWN)), False, "newer than any release kvwatch has read"),
    ("0.9.2", "0.10.2", False, "older than any release kvwatch has read"),
    ("0.6.5", "0.10.2", False, "older than any release kvwatch has read"),
])
def test_a_release_plans_as_its_minor_or_the_nearest_known(asked: str, used: str, exact: bool, why: str) -> None:
    choice = resolve(parse_version(asked))
    assert str(choice.used) == used and choice.exact is exact and why in choice.why
    if not exact:
        assert asked in choice.why and used in choice.why   # the plan says which and why


def test_a_release_between_known_ones_takes_the_one_before_it() -> None:
    known = (parse_version("0.20.0"), parse_version("0.22.0"))
    choice = resolve(parse_version("0.21.3"), known)
    assert str(choice.used) == "0.20.0" and "not read by kvwatch" in choice.why


def test_nothing_asked_plans_as_the_newest() -> None:
    choice = resolve(None)
    assert choice.used == max(KNOWN) and not choice.exact


def test_known_releases_are_one_per_minor() -> None:
    minors = [k.parts[:2] for k in KNOWN]
    assert len(minors) == len(set(minors)) and list(KNOWN) == sorted(KNOWN)
