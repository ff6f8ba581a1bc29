"""The failure wordings of each vLLM release that kvwatch diagnoses, per release (pure): the generated
table (generated/texts.py, scripts/gen_vllm_texts.py) expanded from its changes release by release.
Each text with the file and line it is in (cite as "vLLM X.Y.Z, FILE:LINE"), the text id and the
class kvwatch names it; and the --max-lora-rank values each release accepts."""
from __future__ import annotations

from typing import NamedTuple

from kvwatch.vllm_releases.generated.texts import BASE, BASE_RELEASE, CHANGES, LORA_RANKS_CHANGES
from kvwatch.vllm_releases.release_chain import expand


class ReleaseText(NamedTuple):
    text_id: str      # the wording's id (kvwatch/diagnosis/patterns.py names its pattern alike)
    kind: str         # the FailureKind value kvwatch must name for it
    template: str     # the message, each placeholder as {expression}
    file: str         # in the release's source
    line: int


def _expand() -> dict[str, tuple[ReleaseText, ...]]:
    out: dict[str, tuple[ReleaseText, ...]] = {}
    for release, table in expand(BASE_RELEASE, BASE, CHANGES).items():
        texts = [ReleaseText(text_id, kind, template, file, line)
                 for (text_id, template), (kind, file, line) in table.items()]
        out[release] = tuple(sorted(texts, key=lambda t: (t.text_id, t.file, t.line)))
    return out


def _lora() -> dict[str, tuple[tuple[int, ...], str, int]]:
    out: dict[str, tuple[tuple[int, ...], str, int]] = {}
    last: tuple[tuple[int, ...], str, int] | None = None
    for release in TEXTS:
        last = LORA_RANKS_CHANGES.get(release, last)
        if last is not None:
            out[release] = last
    return out


TEXTS: dict[str, tuple[ReleaseText, ...]] = _expand()
# The values --max-lora-rank takes: (ranks, file, line) per release.
LORA_RANKS: dict[str, tuple[tuple[int, ...], str, int]] = _lora()
