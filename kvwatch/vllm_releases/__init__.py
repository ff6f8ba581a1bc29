"""What kvwatch repeats of each vLLM release, as data (pure: no I/O, no vLLM import).

One generated module per concern, each a table keyed by release, every fact with the source file
and line of the release it was read from:

- ``flags``: the ``vllm serve`` options and their action kinds (scripts/gen_vllm_flags.py);
- ``defaults``: utilization, batch defaults by card, block sizes, what the profile counts;
- ``backend_priorities``: the CUDA attention backend order (scripts/gen_backend_priorities.py);
- ``max_len_rules``: the default max_model_len's RoPE rules (scripts/gen_max_len_rules.py);
- ``hybrid_alignment``: the hybrid block-size alignment (by hand, one row per change);
- ``texts``: the failure and start-up wordings the diagnosis matches.

A release is known when kvwatch has read its source (``KNOWN``, one per minor release: the
newest patch kvwatch read). Any other release is planned as the nearest known one, and
``resolve`` says which and why, so a plan never silently uses another release's facts.
"""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.values.versions import VllmVersion, parse_version

# The releases whose source kvwatch's tables were generated from (the newest patch of each minor).
KNOWN: tuple[VllmVersion, ...] = tuple(parse_version(v) for v in (
    "0.10.2", "0.11.2", "0.12.0", "0.13.0", "0.14.1", "0.15.1", "0.16.0", "0.17.1", "0.18.1", "0.19.1",
    "0.20.2", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0",
    "0.30.0", "0.31.0", "0.32.0", "0.33.0"))
# The release planned when none is given and none is installed: the newest kvwatch has read. The one
# answer to "which release when none is given", for the flags, the rules and the budget alike.
DEFAULT_RELEASE: VllmVersion = max(KNOWN)


@dataclass(frozen=True)
class ReleaseChoice:
    """The release whose facts a plan uses for the release asked for."""
    asked: VllmVersion | None     # None: no vLLM installed and none given
    used: VllmVersion             # a member of KNOWN
    why: str                      # empty when `used` is the release asked for (same minor)

    @property
    def exact(self) -> bool:
        return not self.why


def resolve(asked: VllmVersion | None, known: tuple[VllmVersion, ...] = KNOWN) -> ReleaseChoice:
    """The known release with the same minor as `asked`, else the nearest one below it (a release
    inherits its predecessor's facts until kvwatch reads it), else the oldest known; the newest
    known when nothing is asked."""
    newest = max(known)
    if asked is None:
        default = DEFAULT_RELEASE if DEFAULT_RELEASE in known else newest
        return ReleaseChoice(None, default, f"no vLLM release given or installed: planned as {default}")
    same_minor = [k for k in known if k.parts[:2] == asked.parts[:2]]
    if same_minor:
        return ReleaseChoice(asked, same_minor[0], "")
    below = [k for k in known if k.parts < asked.parts]
    if below:
        used = max(below)
        note = "newer than any release kvwatch has read" if used == newest else "not read by kvwatch"
        return ReleaseChoice(asked, used, f"vLLM {asked} is {note}: planned as {used}, the nearest before it")
    used = min(known)
    return ReleaseChoice(asked, used, f"vLLM {asked} is older than any release kvwatch has read: "
                                      f"planned as {used}, the oldest it knows")
