"""Where kvwatch touches the world: NVML, the engine's HTTP, processes, files on disk."""
