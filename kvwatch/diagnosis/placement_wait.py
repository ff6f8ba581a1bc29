"""A start that never got its GPUs from Ray: named from the absence of progress, not from an exception (pure).

vLLM's Ray executor waits for its placement group and says so, at INFO or WARNING, each time a
doubling interval passes ("Waiting for creating a placement group of specs for 70 seconds.
specs=[{'GPU': 1.0, ...}, ...]"); only after 1800 s does it raise. An engine killed before that
(a start timeout, a user's Ctrl-C) leaves the waits and nothing else. So the waits are a progress
fact, never evidence of a failure by their level: repeated, with no sign after them that the
engine went on (a Ray worker's line, the weights loading, READY), they name
placement_group_unavailable. Ray's own figures, where the log holds them, give the fix: the GPUs
the cluster has against the ones asked for.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from kvwatch.diagnosis.facts import JsonFacts

WAIT_MARKER = "Waiting for creating a placement group"
# vLLM's sentence (executor/ray_utils.py _wait_until_pg_ready), for the normaliser's words
WAIT_TEXT = ("Waiting for creating a placement group of specs for %d seconds. specs=%s. Check `ray status` and "
             "`ray list nodes` to see if you have enough resources, and make sure the IP addresses used by ray "
             "cluster are the same as VLLM_HOST_IP environment variable specified in each node if you are running "
             "on a multi-node.")
_WAIT = re.compile(r"Waiting for creating a placement group of specs for (?P<seconds>\d+) seconds"
                   r"(?:\.\s*specs=(?P<specs>\[.*?\])(?:\.|$))?")
_SPEC_GPUS = re.compile(r"'GPU':\s*(?P<n>[\d.]+)")
# What Ray has: vLLM's own count, `ray status`'s "0.0/4.0 GPU", or its resource listing.
SEEN_MARKERS: tuple[str, ...] = ("Total number of devices:", ".0 GPU", "cluster_resources", "exceeds available GPUs")
_SEEN = re.compile(r"Total number of devices: (?P<total>\d+)|(?:^|\s)[\d.]+/(?P<status>[\d.]+) GPU\b"
                   r"|cluster_resources\(\)?[^{]*\{[^}]*'GPU': (?P<resources>[\d.]+)"
                   r"|Tensor parallel size \((?P<tp>\d+)\) exceeds available GPUs \((?P<available>\d+)\)")
_ASKED = re.compile(r"Required number of devices: (?P<n>\d+)")
# The engine went on past the placement group: its workers started, its weights load, it serves.
PROGRESS_MARKERS: tuple[str, ...] = ("RayWorkerWrapper pid=", "Loading model", "Starting to load model",
                                     "Model loading took", "Loading weights took")
MIN_WAITS = 2           # one wait is a slow start; a repeated one, with nothing after it, is a start stuck
MIN_WAITED_S = 60       # vLLM waits 10, 30, 70, ... s: a wait that reached this was repeated


@dataclass
class PlacementWait:
    waits: int = 0
    seconds: int = 0
    gpus_asked: float | None = None
    ray_gpus: float | None = None
    line: str = ""

    def observe_wait(self, line: str) -> None:
        m = _WAIT.search(line)
        if m is None:
            return
        self.waits += 1
        self.seconds = max(self.seconds, int(m["seconds"]))
        self.line = line
        if m["specs"]:
            self.gpus_asked = sum(float(n) for n in _SPEC_GPUS.findall(m["specs"]))

    def observe_figures(self, line: str) -> None:
        if (m := _SEEN.search(line)) is not None:
            self.ray_gpus = float(m["total"] or m["status"] or m["resources"] or m["available"])
            if m["tp"]:
                self.gpus_asked = float(m["tp"])
                self.line = self.line or line
        if (a := _ASKED.search(line)) is not None:
            self.gpus_asked = float(a["n"])

    def progressed(self) -> None:
        """The engine went on: the waits ended in a placement group."""
        self.waits = 0
        self.seconds = 0
        self.line = ""
        self.gpus_asked = self.ray_gpus = None

    def stuck(self) -> bool:
        """The start never got past the placement group: the waits repeated (or reached the seconds
        only a repeated one does), or vLLM's own count says Ray has fewer GPUs than it asks for,
        with nothing after it."""
        if self.waits >= MIN_WAITS or self.seconds >= MIN_WAITED_S:
            return True
        return bool(self.line) and self.gpus_asked is not None and self.ray_gpus is not None \
            and self.ray_gpus < self.gpus_asked

    def facts(self) -> JsonFacts:
        facts: JsonFacts = {"placement_group_waits": self.waits, "waited_s": self.seconds}
        if self.gpus_asked is not None:
            facts["gpus"] = self.gpus_asked
        if self.ray_gpus is not None:
            facts["ray_gpus"] = self.ray_gpus
        facts["help"] = fix_for(self.gpus_asked, self.ray_gpus)
        return facts


def fix_for(asked: float | None, seen: float | None) -> str:
    """The fix, with the figures the log gave: the GPUs Ray sees against the ones asked for."""
    def n(x: float) -> str:
        return str(int(x)) if float(x).is_integer() else str(x)
    if asked is not None and seen is not None:
        return (f"Ray sees {n(seen)} GPU(s), the engine asks for {n(asked)}: join the missing nodes' GPUs to "
                f"the Ray cluster, or use a --tensor-parallel-size x --pipeline-parallel-size of at most {n(seen)}")
    if asked is not None:
        return (f"Ray never found the {n(asked)} GPU(s) the engine asks for: check `ray status` for the GPUs "
                f"it sees, join the missing nodes, or use a --tensor-parallel-size x --pipeline-parallel-size "
                f"the cluster has")
    return ("Ray never found the GPUs the engine asks for: check `ray status` for the GPUs it sees, join the "
            "missing nodes, or use a --tensor-parallel-size x --pipeline-parallel-size the cluster has")
