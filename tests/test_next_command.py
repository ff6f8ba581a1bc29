"""The one decision of the command launched next (kvwatch/watchdog/next_command.py), as a table: every
cause the command in force changes for, and what it becomes."""
from __future__ import annotations

import pytest

from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.watchdog.next_command import (
    Applied,
    AtStart,
    Cause,
    Preflighted,
    Recovered,
    RolledBack,
    Source,
    next_command,
)
from kvwatch.watchdog.recovery import Action, Decision

R = "0.32.0"
C = ("vllm", "serve", "/models/m", "--port", "8000", "--block-size", "8")
CORRECTED = C[:6] + ("16",)
FIXED = C + ("--max-model-len", "2048")
SEQS = FlagChange({"--max-num-seqs": 4})


def cmd(argv: tuple[str, ...]) -> EngineCommand:
    return EngineCommand(argv, R)


# name, cause, the command launched next (None: none), its source, words of its reason
ROWS: list[tuple[str, Cause, tuple[str, ...] | None, Source, str]] = [
    ("no state file", AtStart(None, None), C, Source.CONFIGURED, ""),
    ("the state file's corrected command", AtStart(C, CORRECTED), CORRECTED, Source.PERSISTED, ""),
    ("the state file's command is the configured one", AtStart(C, C), C, Source.PERSISTED, ""),
    ("the configured command changed", AtStart(("vllm", "serve", "/models/other"), CORRECTED), C,
     Source.CONFIGURED, "changed"),
    ("the state file holds no command", AtStart(C, ()), C, Source.CONFIGURED, "changed"),
    ("a forged state file", AtStart(C, ("/bin/sh", "-c", "id")), C, Source.REFUSED, "another executable"),
    ("a fleet's fixed flag changed in the state file", AtStart(C, CORRECTED, ("--block-size",)), C,
     Source.REFUSED, "'16'"),
    ("the preflight fixed a certain failure", Preflighted(cmd(FIXED), True), FIXED, Source.PREFLIGHT, ""),
    ("the preflight fixed nothing", Preflighted(cmd(FIXED), False), C, Source.UNCHANGED, ""),
    ("a failure with no remedy", Recovered(Decision(Action.GIVE_UP, FailureKind.UNKNOWN, "unknown: no remedy")),
     None, Source.GIVE_UP, "no remedy"),
    ("a crash: the same plan again", Recovered(Decision(Action.RESTART, FailureKind.ENGINE_DIED, "restart",
                                                        command=cmd(C))), C, Source.RESTART, "restart"),
    ("a remedy's correction", Recovered(Decision(Action.CORRECT, FailureKind.BLOCK_SIZE_UNSUPPORTED, "corrected",
                                                 command=cmd(CORRECTED))), CORRECTED, Source.CORRECTED,
     "corrected"),
    ("the autopilot's change on trial", Applied(SEQS), C + ("--max-num-seqs", "4"), Source.APPLIED,
     "apply --max-num-seqs"),
    ("the autopilot's change rolled back", RolledBack(CORRECTED, SEQS), CORRECTED, Source.ROLLED_BACK,
     "roll back --max-num-seqs"),
]


@pytest.mark.parametrize("name,cause,argv,source,why", ROWS, ids=[r[0] for r in ROWS])
def test_the_next_command_table(name: str, cause: Cause, argv: tuple[str, ...] | None, source: Source,
                                why: str) -> None:
    nxt = next_command(cmd(C), cause)
    assert (nxt.command.argv if nxt.command is not None else None) == argv
    assert nxt.source is source
    assert why in nxt.reason
    assert nxt.command is None or nxt.command.release == R
