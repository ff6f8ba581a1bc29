"""Failure diagnosis and remedies: name the root cause in an engine's output, propose the fix.

    diagnosis = diagnose(lines, served=False)
    remedy = propose_remedy(diagnosis, EngineCommand.parse(argv), policy=..., tried=...)
    new_command = remedy.apply(command) if remedy else None

Pure functions of data (log lines, argv, numbers): no I/O. The watchdog streams lines into
a LogScanner; `kvwatch diagnose` reads a file.
"""
from __future__ import annotations

from kvwatch.diagnosis.diagnose import Diagnosis, LogScanner, diagnose, diagnose_stream
from kvwatch.diagnosis.remedies import SAME_PLAN_REASON, GpuContext, Remedy, propose_remedy
from kvwatch.failure_kinds import FailureKind

__all__ = ["FailureKind", "Diagnosis", "LogScanner", "diagnose", "diagnose_stream", "Remedy", "GpuContext",
           "propose_remedy", "SAME_PLAN_REASON"]
