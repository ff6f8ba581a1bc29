"""Whether a command read back from the state file may be launched instead of the configured one (pure).

The state file keeps the corrected command so a restart of kvwatch resumes it. Whoever can write
that file could otherwise have kvwatch (often root) launch anything: a forged `/bin/sh -c ...` ran.
A persisted command is kvwatch's only when it is the configured command with nothing but kvwatch's
own flag changes (planner/flag_change.CHANGED_FLAGS) applied: with those flags taken out of both,
the two must be the same tokens, so the executable, the model and every other flag are the same.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvwatch.errors import CommandError
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import CHANGED_FLAGS


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str        # why not, in one line; "" when accepted


def judge_persisted(persisted: Sequence[str], configured: Sequence[str], release: str,
                    fixed_flags: Iterable[str] = ()) -> Verdict:
    """Accept `persisted` only when it is `configured` with some of kvwatch's own flag changes
    (never one of the fleet's `fixed_flags`, which kvwatch never changes)."""
    if not persisted:
        return Verdict(False, "the state file holds an empty command")
    if list(persisted) == list(configured):
        return Verdict(True, "")
    changeable = sorted(CHANGED_FLAGS - set(fixed_flags))
    try:
        ours, theirs = (_without(EngineCommand(tuple(argv), release), changeable)
                        for argv in (persisted, configured))
    except CommandError as exc:
        return Verdict(False, f"vLLM would not read it as kvwatch wrote it: {exc}")
    if ours[:1] != theirs[:1]:
        return Verdict(False, f"another executable ({ours[0] if ours else 'none'!r}, configured {theirs[0]!r})")
    try:
        if EngineCommand(tuple(persisted), release).model != EngineCommand(tuple(configured), release).model:
            return Verdict(False, "another model")
    except CommandError as exc:
        return Verdict(False, str(exc))
    if ours != theirs:
        at = next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs)))
        token = ours[at] if at < len(ours) else theirs[at]
        return Verdict(False, f"it differs from the configured command in more than kvwatch's own flag "
                              f"changes (at {token[:80]!r})")
    return Verdict(True, "")


def _without(command: EngineCommand, flags: Sequence[str]) -> tuple[str, ...]:
    for flag in flags:
        command = command.without_flag(flag)
    return command.argv
