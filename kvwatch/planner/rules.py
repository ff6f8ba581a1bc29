"""What vLLM accepts, as data: attention backends, their block sizes and KV dtypes, kernel limits.

Read from the vLLM 0.32 source (v1/attention/backends/*, platforms/cpu.py). The CUDA priority order
is per release, generated into vllm_releases/backend_priorities.py and added by ruleset_for.
A new vLLM release that changes a rule gets a new RuleSet with its version range;
code never branches on versions.
"""
from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvwatch.errors import KvwatchError
from kvwatch.failure_kinds import FailureKind
from kvwatch.planner.flag_change import FlagChange
from kvwatch.values.block_sizes import BlockSizeRule, MultipleOf, accepts_block_size, parse_block_rule
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases import resolve
from kvwatch.vllm_releases.backend_priorities import CUDA_PRIORITIES
from kvwatch.vllm_releases.kv_layout import cpu_attn_kernel_multiple

# 8-bit KV cache dtype names vLLM accepts (one byte per element).
FP8_KV_DTYPES = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head",
                           "int8_per_token_head"})
# MLA packed layouts: bytes per token per layer, fixed by the layout, not by head size.
PACKED_MLA_BYTES = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}


@dataclass(frozen=True)
class BackendRule:
    name: str
    platform: str                               # "cuda" or "cpu"
    attention: str                              # "full" or "mla"
    block_sizes: tuple[BlockSizeRule, ...]
    kv_dtypes: frozenset[str]
    min_capability: tuple[int, int] | None = None
    max_capability: tuple[int, int] | None = None
    capability_majors: frozenset[int] | None = None   # when only some families run it
    fp8_majors: frozenset[int] | None = None          # 8-bit KV only on these families (None: all)
    fp8_min_capability: tuple[int, int] | None = None
    preferred_block_size: int = 16                   # what vLLM sets when --block-size is unset
    head_sizes: frozenset[int] | None = None
    forced_block_size: int | None = None             # the platform overrides the user's choice
    cpu_fp8_needs_isa: bool = False                  # CPU fp8 KV kernels need AVX-512 or AMX
    fp8_head_size_multiple: int | None = None
    # any multiple of a kernel block is accepted, a fixed size too (vllm_releases/cuda_kernel_blocks.py)
    accepts_multiples: bool = False

    def supports_capability(self, cc: tuple[int, int] | None) -> bool:
        if self.platform == "cpu":
            return cc is None
        if cc is None:
            return False
        if self.capability_majors is not None and cc[0] not in self.capability_majors:
            return False
        if self.min_capability and cc < self.min_capability:
            return False
        if self.max_capability and cc > self.max_capability:
            return False
        return True

    def supports_block_size(self, block_size: int) -> bool:
        if self.accepts_multiples:
            return any(block_size % (r.base if isinstance(r, MultipleOf) else r) == 0 for r in self.block_sizes)
        return accepts_block_size(self.block_sizes, block_size)

    def smallest_block_size_at_least(self, block_size: int) -> int:
        """The smallest legal block size >= block_size."""
        options = []
        for r in self.block_sizes:
            if isinstance(r, MultipleOf):
                options.append(-(-block_size // r.base) * r.base)
            elif r >= block_size:
                options.append(r)
        return min(options) if options else max(r for r in self.block_sizes if isinstance(r, int))


@dataclass(frozen=True)
class KernelLimit:
    """A kernel that dies at run time under known conditions, and the flag change that avoids it."""

    kind: FailureKind              # failure class it produces
    backend: str
    capability_majors: frozenset[int]
    kv_dtypes: frozenset[str]
    message: str
    fix: FlagChange


@dataclass(frozen=True)
class RuleSet:
    vllm_min: tuple[int, ...]
    vllm_max: tuple[int, ...] | None           # exclusive
    backends: tuple[BackendRule, ...]
    # (platform, attention, capability major or None) -> backend names in vLLM's priority order
    priorities: dict[tuple[str, str, int | None], tuple[str, ...]]
    kernel_limits: tuple[KernelLimit, ...] = field(default=())

    def backend(self, name: str) -> BackendRule | None:
        return next((b for b in self.backends if b.name == name.upper()), None)


_HALF = frozenset({"auto", "float16", "bfloat16"})
_FP8 = frozenset({"fp8", "fp8_e4m3"})

VLLM_0_1X_TO_0_3X = RuleSet(
    vllm_min=(0, 10),
    vllm_max=None,
    backends=(
        BackendRule("FLASH_ATTN", "cuda", "full", (MultipleOf(16),), _HALF | _FP8,
                    min_capability=(8, 0), fp8_majors=frozenset({9, 10})),
        BackendRule("FLASHINFER", "cuda", "full", (16, 32, 64), _HALF | _FP8 | {"fp8_e5m2"},
                    min_capability=(8, 0), max_capability=(12, 1)),
        BackendRule("TRITON_ATTN", "cuda", "full", (MultipleOf(16),), _HALF | _FP8 | {"fp8_e5m2"},
                    fp8_min_capability=(8, 9)),
        BackendRule("FLASHMLA", "cuda", "mla", (64,), _HALF | _FP8 | {"fp8_ds_mla"},
                    capability_majors=frozenset({9, 10}), preferred_block_size=64),
        BackendRule("CUTLASS_MLA", "cuda", "mla", (128,), _HALF | _FP8,
                    capability_majors=frozenset({10}), preferred_block_size=128),
        BackendRule("FLASHINFER_MLA", "cuda", "mla", (32, 64), _HALF | _FP8,
                    capability_majors=frozenset({10}), preferred_block_size=32),
        BackendRule("TRITON_MLA", "cuda", "mla", (MultipleOf(16),), _HALF | _FP8,
                    fp8_min_capability=(8, 9)),
        BackendRule("FLASH_ATTN_MLA", "cuda", "mla", (MultipleOf(16),), _HALF,
                    capability_majors=frozenset({9})),
        # CPU_ATTN's kernel block sizes are the newest release's; ruleset_for sets each release's.
        BackendRule("CPU_ATTN", "cpu", "full", (MultipleOf(32),), frozenset({"auto", "fp8", "fp8_e4m3", "fp8_e5m2"}),
                    # The CPU platform picks CPU_ATTN without checking head sizes (head 16 serves).
                    preferred_block_size=128, cpu_fp8_needs_isa=True, fp8_head_size_multiple=32),
        # The reference CPU MLA kernel only compiles for block 16; vLLM overrides the user's size.
        BackendRule("CPU_MLA", "cpu", "mla", (16,), frozenset({"auto"}), preferred_block_size=16,
                    forced_block_size=16, head_sizes=frozenset({576})),
        # What an AMX host runs MLA on from 0.29 (planner/cpu_mla.py picks it): the platform forces no
        # block size and checks none (only a warning below multiples of 32: vLLM 0.32.0 platforms/cpu.py:295),
        # nor a head size, so the rule has none; 128 is the CPU's default (platforms/cpu.py:292-293).
        BackendRule("AMX_MLA", "cpu", "mla", (MultipleOf(1),), frozenset({"auto"}), preferred_block_size=128),
    ),
    # CUDA's order is release data (vllm_releases.backend_priorities), added by ruleset_for.
    priorities={
        ("cpu", "full", None): ("CPU_ATTN",),
        ("cpu", "mla", None): ("CPU_MLA",),
    },
    kernel_limits=(
        # TRITON_MLA decode with fp8 KV and 2 stages needs 102,400 B of shared memory per block;
        # SM12x allows 101,376 B. Tile sizes are not --block-size: only bf16 KV avoids it.
        KernelLimit(
            kind=FailureKind.KERNEL_OUT_OF_RESOURCES, backend="TRITON_MLA",
            capability_majors=frozenset({12}), kv_dtypes=FP8_KV_DTYPES,
            message=("TRITON_MLA's fp8 decode kernel needs 102,400 B of shared memory; SM12x allows "
                     "101,376 B per block: the worker dies with 'out of resource: shared memory'. "
                     "--block-size does not change the kernel's tiles."),
            fix=FlagChange({"--kv-cache-dtype": "auto"})),
    ),
)

RULESETS: tuple[RuleSet, ...] = (VLLM_0_1X_TO_0_3X,)


def cuda_priorities(release: str, backends: Sequence[BackendRule]
                    ) -> dict[tuple[str, str, int | None], tuple[str, ...]]:
    """vLLM's CUDA backend order for a known release, as priorities keyed like RuleSet's, keeping
    the backends kvwatch has a rule for. A release with no list of its own (0.10: a chain of ifs)
    takes the oldest list."""
    table = CUDA_PRIORITIES.get(release) or next(iter(CUDA_PRIORITIES.values()))
    modelled = {b.name for b in backends if b.platform == "cuda"}
    return {("cuda", attention, major): tuple(name for name in order if name in modelled)
            for (attention, major), (order, _source) in table.items()}


def priority_source(release: str, attention: str, major: int | None) -> str:
    """Where vLLM `release` gives the CUDA order used for `attention` on capability `major`."""
    used = release if release in CUDA_PRIORITIES else next(iter(CUDA_PRIORITIES))
    table = CUDA_PRIORITIES[used]
    _order, source = table.get((attention, major)) or table[(attention, None)]
    return f"vLLM {used}, {source}"


@functools.lru_cache(maxsize=64)
def _ruleset_for_release(release: str) -> RuleSet:
    version = parse_version(release)
    v = version.parts
    base = next((r for r in RULESETS if v >= r.vllm_min and (r.vllm_max is None or v < r.vllm_max)), RULESETS[-1])
    # CPU_ATTN's kernel block sizes are the release's (vllm_releases/kv_layout.py CPU_ATTN_KERNEL_MULTIPLE).
    cpu_kernel = (MultipleOf(cpu_attn_kernel_multiple(version)),)
    backends = tuple(replace(b, block_sizes=cpu_kernel) if b.name == "CPU_ATTN" else b for b in base.backends)
    return replace(base, backends=backends, priorities={**base.priorities, **cuda_priorities(release, backends)})


def ruleset_for(vllm_version: str | None) -> RuleSet:
    """The rules for a vLLM version, as the known release it is planned as (vllm_releases.resolve);
    the default release when the version is none or unreadable."""
    try:
        version = parse_version(vllm_version) if vllm_version else None
    except KvwatchError:
        version = None
    return _ruleset_for_release(str(resolve(version).used))


def with_learned_block_sizes(rules: RuleSet, learned: Mapping[str, Sequence[object]]) -> RuleSet:
    """The rules with the block sizes this host's engine reported for a backend (a failure's
    message beats the table: it is what the installed vLLM really accepts)."""
    backends = list(rules.backends)
    for name, sizes in learned.items():
        parsed = tuple(r for r in (parse_block_rule(s) for s in sizes) if r is not None)
        for i, backend in enumerate(backends):
            if backend.name == name.upper() and parsed:
                backends[i] = replace(backend, block_sizes=parsed)
    return replace(rules, backends=tuple(backends))
