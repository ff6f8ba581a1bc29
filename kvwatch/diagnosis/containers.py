"""Several containers' logs in one stream, told apart by the tag each line carries (pure).

`kubectl logs --all-containers --prefix` writes every line as `[pod/NAME/CONTAINER] text`, the
containers' lines interleaved; `docker compose logs` writes `SERVICE-1  | text`. One diagnosis
of the mixture would read a sidecar's lines as the engine's, so the stream is split by its tag
and each container diagnosed alone. A stream is a mixture only when its first lines carry two
or more tags of one of these shapes.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

_TAGS: tuple[re.Pattern[str], ...] = (
    re.compile(r"^\[(?P<tag>pod/[^\]\s/]+/[^\]\s]+)\] ?"),           # kubectl logs --prefix
    re.compile(r"^(?P<tag>[A-Za-z0-9][\w.-]*-\d+)\s+\| ?"),           # docker compose: service-N
)
SAMPLE_LINES = 200


def tag_shape(lines: Sequence[str]) -> re.Pattern[str] | None:
    """The tag shape that marks two or more sources among these lines; None for one source."""
    for shape in _TAGS:
        tags = {m["tag"] for line in lines if (m := shape.match(line)) is not None}
        if len(tags) >= 2:
            return shape
    return None


def split(lines: Iterable[str], shape: re.Pattern[str]) -> dict[str, list[str]]:
    """Each source's lines, its tag taken off, in order; a line with no tag follows the last
    tagged one (a tool that lost a tag on a continuation)."""
    out: dict[str, list[str]] = {}
    current: str | None = None
    for line in lines:
        m = shape.match(line)
        if m is not None:
            current = m["tag"]
            out.setdefault(current, []).append(line[m.end():])
        elif current is not None:
            out[current].append(line)
    return out
