"""The device a plan is for: a CUDA GPU (compute capability, memory) or the CPU backend."""
from __future__ import annotations

from dataclasses import dataclass

from kvwatch.errors import KvwatchError

GiB = 2**30
# What a clean card does not have free at the worker's first snapshot (the CUDA context, cuBLAS):
# 0.41-0.53 GiB on H100 and 0.50 GiB on RTX 5090 in the "Free memory on device (free/total GiB)"
# lines of tests/fixtures/gpu_logs (search_llama31_8b_80gb_v0310.log, ..._rtx5090_len32768_v0280.log).
CUDA_CONTEXT_BYTES = int(0.5 * GiB)


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
    free_memory_bytes: int | None = None       # free before vLLM starts, as the user states it (planner/free_memory.py)

    @property
    def sm(self) -> str:
        if self.compute_capability is None:
            return "cpu"
        return f"{self.compute_capability[0]}.{self.compute_capability[1]}"


@dataclass(frozen=True)
class Card:
    """A GPU people run vLLM on: what NVML reports as its total, what the CUDA runtime reports
    (torch.cuda.mem_get_info, the total vLLM's budget starts from), and where each figure is from."""

    key: str                        # the --preset name
    name: str                       # NVML's name
    words: tuple[str, ...]          # what a device name contains to be this card (lower case, no spaces)
    capability: tuple[int, int]
    nvml_mib: int | None            # NVML's total; None where NVML reports none (unified memory)
    cuda_total_gib: float | None    # the CUDA total; None where no log states it (NVML less _UNKNOWN_RESERVED)
    source: str
    unified_memory: bool = False    # CPU and GPU share one memory (GB10): NVML has no framebuffer total
    # what vLLM's first snapshot found free on the platform as a public log shows it (the host's own use of
    # unified memory); the preset states it as the free memory before start (planner/free_memory.py)
    free_at_start_gib: float | None = None
    # sold only on SXM/HGX boards, whose GPUs are NVLink peers (NVIDIA's product pages: H100 SXM5, H200 SXM,
    # H20, B200/B300 HGX, GB200 NVL72): NCCL's buffers at tensor parallel are far larger (planner/non_torch.py)
    nvlink: bool = False

    @property
    def total_bytes(self) -> int:
        if self.nvml_mib:
            return self.nvml_mib * 2**20
        return int((self.cuda_total_gib or 0) * GiB)


# Most specific first (an "H100 NVL" is not an "H100"). NVML totals as nvidia-smi prints them;
# CUDA totals as vLLM logs ("total_gpu_memory", "Free memory on device (x/TOTAL GiB)") and CUDA OOM
# messages ("total capacity of") print them. A vendor figure is the capacity the datasheet names.
CARDS: tuple[Card, ...] = (
    Card("h100-nvl", "NVIDIA H100 NVL", ("h100", "nvl"), (9, 0), 95_830, 93.10,
         "CUDA total 93.10 GiB from a vLLM log (kvwatch's issue-16 table); NVML: vendor 94 GB"),
    Card("h100-pcie", "NVIDIA H100 PCIe", ("h100", "pcie"), (9, 0), 81_559, None,
         "vendor 80 GB HBM2e (the SXM card's NVML total); no log of its CUDA total seen"),
    Card("h100", "NVIDIA H100 80GB HBM3", ("h100",), (9, 0), 81_559, 79.18,
         "NVML 81559 MiB (nvidia-smi); CUDA 79.18 GiB: llm-d-benchmark's empirical vLLM memory results "
         "('H100 GPU (79.18 GiB)'); a V0 log of vllm#10511 prints total_gpu_memory 79.22 GiB", nvlink=True),
    Card("gh200", "NVIDIA GH200 480GB", ("gh200",), (9, 0), 97_871, None,
         "vendor 96 GB HBM3 (the 144 GB HBM3e board is another size: NVML's figure then decides)"),
    Card("h200", "NVIDIA H200", ("h200",), (9, 0), 143_771, 139.81,
         "NVML 143771 MiB (nvidia-smi); CUDA 139.81 GiB from a vLLM log (issue-16 table)", nvlink=True),
    Card("h20", "NVIDIA H20", ("h20",), (9, 0), 97_871, None, "vendor 96 GB HBM3; no log of its totals seen", nvlink=True),
    Card("gb200", "NVIDIA GB200", ("gb200",), (10, 0), 189_471, None, "vendor 186 GB HBM3e per GPU", nvlink=True),
    Card("b200", "NVIDIA B200", ("b200",), (10, 0), 183_359, None, "NVML 183359 MiB (nvidia-smi); vendor 180 GB", nvlink=True),
    Card("b300", "NVIDIA B300", ("b300",), (10, 3), 275_040, None, "NVML 275040 MiB (nvidia-smi); vendor 288 GB", nvlink=True),
    Card("gb10", "NVIDIA GB10", ("gb10",), (12, 1), None, 121.69,
         "DGX Spark: 128 GB unified memory, NVML reports no framebuffer total; CUDA 121.69 GiB as "
         "MiaAI-Lab/GLM-5.3-Flash-EXL3-2x-DGX-Sparks#47 and #204 state it; free at vLLM's first snapshot "
         "114.54 GiB, the OS's available memory on a headless DGX OS box (vLLM 0.27.1: 'Free memory on device "
         "(114.54/121.69 GiB) on startup', a DGX Spark set-up note, public GitHub file, search-index file id "
         "68873638920); other boxes log 99.33-109.53 GiB (file ids 58554003578, 60305821358, 70878272967): "
         "--gpu-free-memory states a box's own", unified_memory=True, free_at_start_gib=114.54),
    Card("rtx-pro-6000", "NVIDIA RTX PRO 6000 Blackwell", ("rtxpro6000",), (12, 0), 97_887, None,
         "NVML 97887 MiB (nvidia-smi); vendor 96 GB"),
    Card("rtx-5090", "NVIDIA GeForce RTX 5090", ("5090",), (12, 0), 32_607, 31.36,
         "NVML 32607 MiB (nvidia-smi); CUDA 31.36 GiB (a vLLM 0.28.0 start-up: \"Free memory on device "
         "(30.86/31.36 GiB)\", public docs/models.md, search-index file id 69451098589); vendor 32 GB"),
    Card("rtx-6000-ada", "NVIDIA RTX 6000 Ada Generation", ("6000ada",), (8, 9), 49_140, None,
         "vendor 48 GB (NVML 49140 MiB); no log of its CUDA total seen"),
    Card("a100-80g", "NVIDIA A100-SXM4-80GB", ("a100", "80g"), (8, 0), 81_920, 79.15,
         "NVML 81920 MiB (nvidia-smi); CUDA 79.15 GiB from vLLM logs (issue-16 table); an unnamed 80 GB "
         "card's V0 log prints 79.25"),
    Card("a100-40g", "NVIDIA A100-SXM4-40GB", ("a100", "40g"), (8, 0), 40_960, 39.39,
         "NVML 40960 MiB (nvidia-smi in dariustanrd/tokenkaki's post); CUDA 39.39 GiB (issue-16 table)"),
    Card("l40s", "NVIDIA L40S", ("l40s",), (8, 9), 46_068, 44.39,
         "NVML 46068 MiB (nvidia-smi in the L40S post of the shared corpus); CUDA 44.39 GiB (issue-16 table)"),
    Card("a40", "NVIDIA A40", ("a40",), (8, 6), 46_068, None, "NVML 46068 MiB (guqiong96/Lvllm#35); no log of its CUDA total seen"),
    Card("l40", "NVIDIA L40", ("l40",), (8, 9), 46_068, None, "vendor 48 GB GDDR6 (the L40S's NVML total)"),
    Card("l4", "NVIDIA L4", ("l4",), (8, 9), 23_034, None, "vendor 24 GB GDDR6; no log of its totals seen"),
    Card("a10g", "NVIDIA A10G", ("a10g",), (8, 6), 23_028, None, "vendor 24 GB GDDR6; no log of its totals seen"),
    Card("rtx-4090", "NVIDIA GeForce RTX 4090", ("4090",), (8, 9), 24_564, 23.64,
         "NVML 24564 MiB (nvidia-smi in vllm#7768); CUDA 23.64 GiB (issue-16 table; under WSL2 a vLLM 0.27 "
         "log prints 23.99)"),
    Card("rtx-4070-laptop", "NVIDIA GeForce RTX 4070 Laptop GPU", ("4070laptop",), (8, 9), 8_188, 7.65,
         "NVML 8188 MiB (a public benchmark harness's tests); CUDA 7.65 GiB in a vLLM 0.8 log (corpus run "
         "search_llama32_3b_gguf_q8_4070laptop_v08)"),
    Card("rtx-3090", "NVIDIA GeForce RTX 3090", ("3090",), (8, 6), 24_576, 23.56,
         "vendor 24 GB (NVML 24576 MiB); CUDA 23.56 GiB in vllm#17327's log (other boards' logs and OOM "
         "messages print 23.54-23.69)"),
    Card("t4", "Tesla T4", ("teslat4",), (7, 5), 15_360, 14.74,
         "NVML 15360 MiB; CUDA 14.74 GiB in a vLLM 0.8.2 log (Colab T4)"),
)


@dataclass(frozen=True)
class Platform:
    """A card on a platform that changes what CUDA reports and leaves free: its own --preset name."""

    key: str
    card: str                       # the key of its card in CARDS (the name, capability and NVML total)
    cuda_total_gib: float
    free_at_start_gib: float        # what vLLM's first snapshot logged free there
    source: str


PLATFORMS: tuple[Platform, ...] = (
    Platform("rtx-4090-wsl2", "rtx-4090", 23.99, 22.45,
             "WSL2: the CUDA runtime over WDDM reports NVML's whole framebuffer (WSL_UNAME_MARK below) and the "
             "Windows host keeps its share: 'Free memory on device (22.45/23.99 GiB) on startup' in two vLLM 0.27.1 "
             "logs of one author and box (public GitHub files, search-index file ids 61815222665 and 61918553602; "
             "tests/fixtures/gpu_logs search_qwen25_05b_4090_wsl2_*)"),
    Platform("rtx-5090-wsl2", "rtx-5090", 31.84, 30.12,
             "WSL2 on a Windows 11 desktop: NVML's whole 32,607 MiB framebuffer as the CUDA total, and 'Free memory "
             "on device cuda:0 (30.12/31.84 GiB) on startup is less than desired GPU memory utilization (0.95, "
             "30.25 GiB)', logged the same in three start-ups of one box (github.com/Alex8791-cyber/cognithor "
             "pull 318, 2026-05-02; pull 289 names the card and platform: RTX 5090, WSL2, Ubuntu 24.04, CUDA 13.0; "
             "it started at 0.92 and 0.93)"),
)


def _free_before_start(free_at_start_gib: float | None) -> int | None:
    """A logged snapshot's free memory as the free memory before start: vLLM's own context added back."""
    return int(free_at_start_gib * GiB) + CUDA_CONTEXT_BYTES if free_at_start_gib else None


PRESETS: dict[str, Device] = {
    c.key: Device("cuda", c.name, c.capability, c.total_bytes, source="preset",
                  cuda_total_bytes=int(c.cuda_total_gib * GiB) if c.cuda_total_gib else None,
                  free_memory_bytes=_free_before_start(c.free_at_start_gib))
    for c in CARDS}
for _p in PLATFORMS:
    _c = next(c for c in CARDS if c.key == _p.card)
    PRESETS[_p.key] = Device("cuda", _c.name, _c.capability, _c.total_bytes, source="preset",
                             cuda_total_bytes=int(_p.cuda_total_gib * GiB),
                             free_memory_bytes=_free_before_start(_p.free_at_start_gib))
# The streaming multiprocessors CUDA reports (torch's multi_processor_count, vLLM's
# current_platform.num_compute_units: vLLM 0.33.0, vllm/platforms/cuda.py:704-705), as NVIDIA's
# architecture whitepapers and datasheets give them for each card's configuration. Only TRITON_MLA's
# decode workspace reads them (vllm_releases/mla_workspace.py); a card not here has none known.
MULTIPROCESSORS: dict[str, int] = {
    "h100-nvl": 132, "h100-pcie": 114, "h100": 132, "gh200": 132, "h200": 132, "b200": 148,
    "rtx-pro-6000": 188, "rtx-5090": 170, "gb10": 48, "rtx-6000-ada": 142, "a100-80g": 108, "a100-40g": 108,
    "l40s": 142, "a40": 84, "l40": 142, "l4": 58, "a10g": 80, "rtx-4090": 128, "rtx-4070-laptop": 36,
    "rtx-3090": 82, "t4": 40,
}
_UNKNOWN_RESERVED = 0.006   # H100: NVML 79.65 GiB, CUDA 79.18 GiB
# vLLM's WSL test: "microsoft" in the kernel's uname (vLLM 0.32.0, vllm/platforms/interface.py:66-68 in_wsl).
# Under WSL2 the CUDA runtime (over Windows' WDDM) reports NVML's whole framebuffer as its total: the two
# RTX 4090 WSL2 runs of tests/fixtures/gpu_logs log "Free memory on device (22.45/23.99 GiB)", NVML's
# 24,564 MiB, where the card gives 23.64 GiB on Linux. WSL2 otherwise changes host pinning only.
WSL_UNAME_MARK = "microsoft"


def in_wsl(uname: str) -> bool:
    """Whether `uname` (platform.uname() joined) is a WSL kernel's, as vLLM tells."""
    return WSL_UNAME_MARK in uname.lower()


def card_for(name: str) -> Card | None:
    """The table's card a device name is (its words, most specific card first)."""
    key = name.lower().replace(" ", "").replace("-", "")
    return next((c for c in CARDS if all(w.replace("-", "") in key for w in c.words)), None)


def multiprocessors(device: Device) -> int | None:
    """The card's multiprocessor count (MULTIPROCESSORS); None for a card the table lacks, or a CPU."""
    card = card_for(device.name) if device.platform == "cuda" else None
    return MULTIPROCESSORS.get(card.key) if card is not None else None


def unified_memory_bytes(name: str) -> int | None:
    """A unified-memory card's total, for NVML reports none (GB10): the CUDA total the table holds."""
    card = card_for(name)
    return card.total_bytes if card is not None and card.unified_memory else None


def cuda_total_bytes(device: Device) -> int:
    """The memory vLLM's budget starts from: what CUDA reports, else NVML's total less a reservation."""
    if device.cuda_total_bytes:
        return device.cuda_total_bytes
    card = card_for(device.name)
    if card is not None and card.cuda_total_gib:
        known = int(card.cuda_total_gib * GiB)
        # a card of the name but another size (a MIG slice, a cut-down board) keeps NVML's figure
        if device.total_memory_bytes is None or abs(device.total_memory_bytes - known) < 0.03 * known:
            return known
    total = device.total_memory_bytes or 0
    return int(total * (1 - _UNKNOWN_RESERVED))


def scheduler_memory_bytes(device: Device) -> int:
    """The total vLLM's scheduler defaults are chosen by (engine/arg_utils.py get_batch_defaults):
    NVML's (platforms/cuda.py get_device_total_memory reads nvmlDeviceGetMemoryInfo, 0.13-0.33).
    A unified-memory card has none, the call raises, and the defaults fall back to the small tier."""
    card = card_for(device.name)
    if card is not None and card.unified_memory:
        return 0
    return device.total_memory_bytes or cuda_total_bytes(device)


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
