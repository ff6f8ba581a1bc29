"""What vLLM will allocate, computed from a model's shapes, the flags and the device. Pure: no I/O."""
