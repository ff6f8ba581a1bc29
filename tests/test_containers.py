"""Several containers' logs in one stream (kvwatch/diagnosis/containers.py): told apart by their tags."""
from __future__ import annotations

import pytest

from kvwatch.diagnosis.containers import split, tag_shape


@pytest.mark.parametrize("lines, several", [
    (["[pod/a/x] one", "[pod/a/y] two"], True),
    (["[pod/a/x] one", "[pod/a/x] two"], False),                  # one container: its prefix is the normaliser's
    (["vllm-1  | one", "proxy-1  | two"], True),
    (["vllm-1  | one", "vllm-1  | two"], False),
    (["  | one", "  | two"], False),                              # Buildkite's pipe names no source
    (["INFO one", "ERROR two"], False),
])
def test_tag_shape(lines, several):
    assert (tag_shape(lines) is not None) is several


def test_split_keeps_each_containers_lines_in_order_and_an_untagged_line_with_the_last():
    lines = ["[pod/a/x] 1", "[pod/a/y] A", "[pod/a/x] 2", "  continued", "[pod/a/y] B"]
    shape = tag_shape(lines)
    assert shape is not None
    assert split(lines, shape) == {"pod/a/x": ["1", "2", "  continued"], "pod/a/y": ["A", "B"]}
