"""What kvwatch repeats of each vLLM release, as data (pure: no I/O, no vLLM import).

The generated tables live in ``generated/`` (scripts/gen_*.py, each with --check; never edited by
hand), each stored as the oldest release's data and every later release's changes against the one
before (``release_chain``); the modules here expand them per release and hold the hand-written rules:

- ``defaults``: utilization, batch defaults by card, block sizes, the extensible KV cache, what the
  profile counts (scripts/gen_release_defaults.py; types and lookups in ``release_defaults``);
- ``generated.flags``: the ``vllm serve`` options and their action kinds (scripts/gen_vllm_flags.py);
- ``backend_priorities``: the CUDA attention backend order (scripts/gen_backend_priorities.py);
- ``max_len_rules``: the default max_model_len's RoPE rules (scripts/gen_max_len_rules.py);
- ``architectures``: the KV cache layers of every registered architecture (scripts/gen_vllm_architectures.py);
- ``texts``: the failure and start-up wordings the diagnosis matches (scripts/gen_vllm_texts.py);
- ``metrics``: the Prometheus series each release exports (scripts/gen_metric_names.py);
- ``hybrid_alignment``, ``kv_layout``, ``cuda_kernel_blocks``, ...: by hand, one row per change.

scripts/absorb_release.py X.Y.Z reads a new release into all of them in one command.

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
    "0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"))
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
