"""The figures of memory messages (pure): sizes as vLLM and torch print them, in GiB, and the
numbers of torch's CUDA out-of-memory message (what it tried, the card's total and free memory,
the processes holding it), wherever a log line embeds it."""
from __future__ import annotations

import re

from kvwatch.diagnosis.facts import JsonFacts

_UNIT_GIB = {"B": 1 / 2**30, "KiB": 1 / 2**20, "MiB": 1 / 2**10, "GiB": 1.0, "TiB": 1024.0}


def gib(number: str, unit: str) -> float:
    """A size as vLLM and torch print it ("12.5", "MiB") in GiB, to 4 decimals."""
    return round(float(number) * _UNIT_GIB.get(unit, 1.0), 4)


_ALLOC = re.compile(r"Tried to allocate ([\d.]+) ([KMGT]?i?B)")
_CAPACITY = re.compile(r"GPU (\d+) has a total capac?ity of ([\d.]+) ([KMGT]?i?B) "
                       r"of which ([\d.]+) ([KMGT]?i?B) is free")
_PROCESS = re.compile(r"Process (\d+) has ([\d.]+) ([KMGT]?i?B) memory in use")
_THIS_PROCESS = re.compile(r"this process has ([\d.]+) ([KMGT]?i?B) memory in use")
_MAX_PROCESSES = 16


def torch_oom_details(line: str) -> JsonFacts:
    """The numbers of torch's CUDA OOM message, wherever it is embedded."""
    facts: JsonFacts = {}
    if (a := _ALLOC.search(line)):
        facts["tried_to_allocate_gib"] = gib(a[1], a[2])
    if (c := _CAPACITY.search(line)):
        facts["gpu_index"] = int(c[1])
        facts["total_gib"] = gib(c[2], c[3])
        facts["free_gib"] = gib(c[4], c[5])
    holders = [{"pid": int(pid), "memory_gib": gib(n, u)}
               for pid, n, u in _PROCESS.findall(line)[:_MAX_PROCESSES]]
    if holders:
        facts["processes"] = holders
    if (t := _THIS_PROCESS.search(line)):
        facts["this_process_gib"] = gib(t[1], t[2])
    return facts
