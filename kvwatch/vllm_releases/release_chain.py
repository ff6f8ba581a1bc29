"""Release data stored as changes (pure): the oldest release's table, then per later release the
entries it adds or changes and the keys it drops (kvwatch/vllm_releases/generated/). `changes_of`
is what the generators write, `expand` what the readers rebuild, release by release."""
from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
Changes = dict[str, tuple[dict[K, V], tuple[K, ...]]]


def changes_of(tables: Mapping[str, Mapping[K, V]]) -> tuple[str, dict[K, V], Changes[K, V]]:
    """(the oldest release, its table, each later release's changes), the releases in the order given."""
    releases = list(tables)
    out: Changes[K, V] = {}
    for before, release in zip(releases, releases[1:], strict=False):
        old, new = tables[before], tables[release]
        out[release] = ({k: v for k, v in new.items() if k not in old or old[k] != v},
                        tuple(k for k in old if k not in new))
    return releases[0], dict(tables[releases[0]]), out


def expand(base_release: str, base: Mapping[K, V], changes: Changes[K, V]) -> dict[str, dict[K, V]]:
    """Every release's whole table, oldest first."""
    out = {base_release: dict(base)}
    current = dict(base)
    for release, (changed, dropped) in changes.items():
        current = {k: v for k, v in current.items() if k not in dropped}
        current.update(changed)
        out[release] = dict(current)
    return out


FieldChanges = dict[str, dict[str, object]]


def field_changes_of(rows: Mapping[str, Mapping[str, object]]) -> tuple[str, dict[str, object], FieldChanges]:
    """For records (one per release, as field -> value): the oldest release's whole, then per later
    release the fields that differ from the release before."""
    releases = list(rows)
    out: FieldChanges = {}
    for before, release in zip(releases, releases[1:], strict=False):
        out[release] = {k: v for k, v in rows[release].items() if rows[before].get(k) != v}
    return releases[0], dict(rows[releases[0]]), out


def expand_fields(base_release: str, base: Mapping[str, object], changes: FieldChanges) -> dict[str, dict[str, object]]:
    """Every release's record, as field -> value, oldest first."""
    out = {base_release: dict(base)}
    current = dict(base)
    for release, changed in changes.items():
        current = {**current, **changed}
        out[release] = dict(current)
    return out
