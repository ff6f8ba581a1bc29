"""One change to an engine's flags: the flags it sets (to a value) and the flags it removes (pure).

The planner's warnings carry one as their fix, the diagnosis's remedies propose one, the watchdog
applies them before the launch (preflight) and after a failure, and the state file records them.
describe() is the one wording of a change everywhere kvwatch shows one ("--block-size 32,
remove --attention-backend"); to_json() is its one JSON form ({"set": {...}, "remove": [...]}).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvwatch.planner.engine_args import EngineCommand

NOTHING = "nothing"   # describe() of the empty change

# Every flag one of kvwatch's own changes sets or removes: the remedies, the plan's predicted fixes
# that preflight applies, and the autopilot's KV-pressure changes. A persisted command may differ
# from the configured one in these only (watchdog/persisted_command.py). tests/test_flag_change.py
# reads every FlagChange the code builds (ast) and holds this set equal to their flags.
CHANGED_FLAGS = frozenset({
    "--attention-backend", "--block-size", "--disable-hybrid-kv-cache-manager", "--gpu-memory-utilization",
    "--kv-cache-dtype", "--max-lora-rank", "--max-model-len", "--max-num-batched-tokens", "--max-num-seqs",
    "--tensor-parallel-size",
    # host memory, after the kernel's OOM killer (diagnosis/host_memory_remedies.py)
    "--cpu-offload-gb", "--kv-offloading-size", "--max-parallel-loading-workers",
    # 0.34's extensible KV cache, removed where the platform refuses it (planner/plan.py)
    "--enable-extensible-kv-cache",
    # Inkling's convolution rings assert bfloat16: a float16 model is refused (planner/inkling.py)
    "--dtype",
})


@dataclass(frozen=True)
class FlagChange:
    set: Mapping[str, object] = field(default_factory=dict)   # flag -> new value
    remove: tuple[str, ...] = ()                              # flags dropped from the command

    def __post_init__(self) -> None:
        # A private copy: the change is a value, whoever built it may keep mutating their dict.
        object.__setattr__(self, "set", dict(self.set))
        object.__setattr__(self, "remove", tuple(self.remove))

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.set.items(), key=lambda item: item[0])), self.remove))

    def __contains__(self, flag: object) -> bool:
        """Whether the change touches `flag` (sets or removes it)."""
        return flag in self.set or flag in self.remove

    @classmethod
    def from_flags(cls, flags: Mapping[str, object]) -> FlagChange:
        """From the planner's short form: flag -> new value, None removing the flag."""
        return cls({k: v for k, v in flags.items() if v is not None},
                   tuple(k for k, v in flags.items() if v is None))

    def as_flags(self) -> dict[str, object]:
        """The short form (flag -> value, None for a removal), as `kvwatch plan --json` shows a fix."""
        out: dict[str, object] = dict(self.set)
        out.update(dict.fromkeys(self.remove))
        return out

    @property
    def empty(self) -> bool:
        """Nothing to change: the same command (for a remedy, a restart of the same plan)."""
        return not self.set and not self.remove

    @property
    def flags(self) -> tuple[str, ...]:
        """Every flag the change touches, those it sets first."""
        return tuple(self.set) + tuple(f for f in self.remove if f not in self.set)

    def then(self, other: FlagChange) -> FlagChange:
        """This change followed by `other` (what `other` touches, it decides)."""
        merged = self.as_flags()
        merged.update(other.as_flags())
        return FlagChange.from_flags(merged)

    def apply(self, command: EngineCommand) -> EngineCommand:
        return command.apply(dict(self.set), self.remove)

    def describe(self) -> str:
        parts = [f"{k} {v}" for k, v in self.set.items()] + [f"remove {k}" for k in self.remove]
        return ", ".join(parts) or NOTHING

    def to_json(self) -> dict[str, Any]:
        return {"set": dict(self.set), "remove": list(self.remove)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FlagChange:
        """From to_json()'s form; ValueError on anything else."""
        values = data.get("set") or {}
        remove = data.get("remove") or []
        if not isinstance(values, Mapping) or not all(isinstance(k, str) for k in values):
            raise ValueError("flag change: 'set' is not a mapping of flags")
        if isinstance(remove, (str, bytes)) or not isinstance(remove, Iterable) \
                or not all(isinstance(f, str) for f in remove):
            raise ValueError("flag change: 'remove' is not a list of flags")
        return cls(dict(values), tuple(remove))


NO_CHANGE = FlagChange()
