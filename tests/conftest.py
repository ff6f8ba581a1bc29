"""Fixtures every test module may ask for by name."""
from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_support import llama_config, write_model
from nvml_standin import nvml_standin_fixture  # noqa: F401  (the `nvml_standin` fixture: a real libnvidia-ml.so.1 stand-in)


@pytest.fixture(autouse=True)
def _not_a_subreaper_after() -> Iterator[None]:
    """`kvwatch run` called in this process (main(["run", ...])) makes it a child subreaper: the
    orphans of later tests would then come to it, and look adopted by an engine. Undone after each."""
    yield
    from kvwatch.boundary import spawn

    spawn.become_subreaper(False)


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    """A tiny Llama's model directory (config.json only: 2 layers, 2 KV heads, head size 32)."""
    return write_model(tmp_path / "tiny", llama_config())


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real-engine tests first (stable, so every pytest-xdist worker collects the same order):
    scripts/test runs two at a time with work stealing, so the minute-long engine tests start early
    and the short tests fill in around them, instead of one long test running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("engine") is None)
