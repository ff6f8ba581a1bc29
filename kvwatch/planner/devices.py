"""The device a plan is for: a CUDA GPU (compute capability, memory) or the CPU backend."""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.errors import KvwatchError

GiB = 2**30


@dataclass(frozen=True)
class Device:
    platform: str                              # "cuda" or "cpu"
    name: str
    compute_capability: tuple[int, int] | None = None
    total_memory_bytes: int | None = None
    uuid: str | None = None
    cpu_fp8_kv: bool = True                    # CPU: AVX-512 or AMX present (fp8 KV kernels)
    cpu_amx: bool = False                      # CPU: AMX tiles (vLLM's AMX MLA kernel: no 16-token blocks)
    cpu_avx512_bf16: bool = False              # CPU: AVX-512 BF16 (vLLM then keeps SSM states in float32)
    source: str = "given"                      # "nvml", "preset", "given", "cpu"
    cuda_total_bytes: int | None = None        # the total CUDA reports, when known (a vLLM log says it)

    @property
    def sm(self) -> str:
        if self.compute_capability is None:
            return "cpu"
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


# NVML-reported totals (approximate: they vary a little by board and driver).
PRESETS: dict[str, Device] = {
    "h100": Device("cuda", "NVIDIA H100 80GB HBM3", (9, 0), 81_559 * 2**20, source="preset"),
    "h200": Device("cuda", "NVIDIA H200", (9, 0), 143_771 * 2**20, source="preset"),
    "b200": Device("cuda", "NVIDIA B200", (10, 0), 183_359 * 2**20, source="preset"),
    "b300": Device("cuda", "NVIDIA B300", (10, 3), 275_040 * 2**20, source="preset"),
    "rtx-pro-6000": Device("cuda", "NVIDIA RTX PRO 6000 Blackwell", (12, 0), 97_887 * 2**20, source="preset"),
    "rtx-5090": Device("cuda", "NVIDIA GeForce RTX 5090", (12, 0), 32_607 * 2**20, source="preset"),
}


# The total CUDA reports (torch.cuda.mem_get_info; vLLM sizes against it), below NVML's by the
# driver's reservation. Figures as vLLM logs and CUDA OOM messages print them ("total capacity of").
_CUDA_TOTAL_GIB = (
    (("a100", "80g"), 79.15), (("a100", "40g"), 39.39), (("h100", "nvl"), 93.10), (("h100",), 79.18),
    (("h200",), 139.81), (("l40s",), 44.39), (("4090",), 23.64), (("3090",), 23.69),
)
_UNKNOWN_RESERVED = 0.006   # H100: NVML 79.65 GiB, CUDA 79.18 GiB


def cuda_total_bytes(device: Device) -> int:
    """The memory vLLM's budget starts from: what CUDA reports, else NVML's total less a reservation."""
    if device.cuda_total_bytes:
        return device.cuda_total_bytes
    name = device.name.lower().replace(" ", "")
    for words, gib in _CUDA_TOTAL_GIB:
        if all(w in name for w in words):
            known = int(gib * GiB)
            # a card of the name but another size (a MIG slice, a cut-down board) keeps NVML's figure
            if device.total_memory_bytes is None or abs(device.total_memory_bytes - known) < 0.03 * known:
                return known
    total = device.total_memory_bytes or 0
    return int(total * (1 - _UNKNOWN_RESERVED))


def preset(name: str) -> Device:
    key = name.lower().replace("_", "-").replace(" ", "-")
    if key not in PRESETS:
        raise KvwatchError(f"unknown GPU preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    return PRESETS[key]


def parse_compute_capability(text: str) -> tuple[int, int]:
    try:
        major, minor = text.strip().split(".")
        return int(major), int(minor)
    except ValueError:
        raise KvwatchError(f"compute capability {text!r}: expected MAJOR.MINOR, e.g. 12.0") from None


def cpu_device_from_flags(flags: set[str], name: str = "cpu") -> Device:
    """The CPU backend's device, from /proc/cpuinfo flags (parsed by the caller)."""
    amx = "amx_tile" in flags
    return Device("cpu", name, cpu_fp8_kv=amx or "avx512f" in flags, cpu_amx=amx,
                  cpu_avx512_bf16="avx512_bf16" in flags, source="cpu")
