"""Fixtures every test module may ask for by name."""
from nvml_standin import nvml_standin_fixture  # noqa: F401  (the `nvml_standin` fixture: a real libnvidia-ml.so.1 stand-in)
