"""policy.fixed_flags, the fleet invariants (issue 29): a correction that would change one of them is
not applied; kvwatch applies the next remedy that keeps them or gives up, and says which. As tables:
no engine, no files (the real CPU engine's exit 78 is in tests/test_fleet_engine_e2e.py)."""
from __future__ import annotations

import pytest

from kvwatch.diagnosis import Diagnosis, FailureKind, propose_remedy
from kvwatch.errors import ConfigError
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.flag_change import FlagChange
from kvwatch.policy import Policy, fixed_among
from kvwatch.watchdog import recovery
from kvwatch.watchdog.config import config_from_mapping
from kvwatch.watchdog.preflight import allowed
from kvwatch.watchdog.recovery import Action

SERVE = ("vllm", "serve", "m")
BLOCK_8 = SERVE + ("--block-size", "8")
FIXED_BLOCK = Policy(fixed_flags=("--block-size",))
BLOCK_FAILURE = Diagnosis(FailureKind.BLOCK_SIZE_UNSUPPORTED, "block size 8 is not accepted",
                          {"block_size": 8, "backend_block_sizes": {"CPU_ATTN": ["MultipleOf(32)"]}}, False)
# A KV cache too small for max-model-len 29000: first remedy the engine's estimate (--max-model-len),
# next a higher --gpu-memory-utilization.
KV_FAILURE = Diagnosis(FailureKind.KV_CACHE_TOO_SMALL, "29000 does not fit",
                       {"max_model_len": 29000, "estimated_max_model_len": 23648}, False)
KV_ARGV = SERVE + ("--max-model-len", "29000", "--gpu-memory-utilization", "0.9")


@pytest.mark.parametrize("diagnosis,argv,policy,action,next_argv,reason", [
    # without fixed flags: the block size is corrected
    (BLOCK_FAILURE, BLOCK_8, Policy(), Action.CORRECT, SERVE + ("--block-size", "32"), "corrected --block-size 32"),
    # --block-size fixed: no remedy keeps it (removing the flag changes it too), so kvwatch gives up and says why
    (BLOCK_FAILURE, BLOCK_8, FIXED_BLOCK, Action.GIVE_UP, None,
     "no remedy keeps policy.fixed_flags --block-size: --block-size 32 not applied"),
    # --max-model-len fixed: the next remedy that keeps it (utilization), saying what it kept
    (KV_FAILURE, KV_ARGV, Policy(fixed_flags=("--max-model-len",)), Action.CORRECT,
     SERVE + ("--max-model-len", "29000", "--gpu-memory-utilization", "0.95"), "corrected --gpu-memory-utilization"),
    # a fixed flag the remedy does not touch changes nothing
    (KV_FAILURE, KV_ARGV, FIXED_BLOCK, Action.CORRECT, SERVE + ("--max-model-len", "23648",
                                                                "--gpu-memory-utilization", "0.9"), "corrected"),
], ids=["free", "block-size fixed: give up", "max-model-len fixed: next remedy", "unrelated fixed flag"])
def test_decide_keeps_the_fixed_flags(diagnosis: Diagnosis, argv: tuple[str, ...], policy: Policy, action: Action,
                                      next_argv: tuple[str, ...] | None, reason: str) -> None:
    # 0.33's semantics, the release these remedies were written for: its unset utilization is 0.9, room to raise
    decision = recovery.decide(diagnosis, EngineCommand(argv, "0.33.0"), policy=policy)
    assert decision.action is action
    assert (decision.command.argv if decision.command else None) == next_argv
    assert reason in decision.reason
    for flag in policy.fixed_flags:
        assert decision.command is None or decision.command.values(flag) == EngineCommand(argv, "0.33.0").values(flag)


def test_the_next_remedy_says_what_the_fixed_flag_kept_from_being_applied() -> None:
    decision = recovery.decide(KV_FAILURE, EngineCommand(KV_ARGV), policy=Policy(fixed_flags=("--max-model-len",)))
    assert "the next remedy that keeps policy.fixed_flags --max-model-len: --max-model-len 23648 not applied" \
        in decision.remedy_reason
    assert decision.correction is not None and "--max-model-len 23648 not applied" in decision.correction.reason


def test_propose_remedy_never_returns_a_change_to_a_fixed_flag() -> None:
    assert propose_remedy(BLOCK_FAILURE, EngineCommand(BLOCK_8), policy=FIXED_BLOCK) is None
    assert propose_remedy(BLOCK_FAILURE, EngineCommand(BLOCK_8)) is not None


@pytest.mark.parametrize("flags,expected", [
    (("--block-size",), ("--block-size",)),
    (("--kv-cache-dtype", "--block-size"), ("--block-size",)),
    (("--max-model-len",), ()),
    (FlagChange(remove=("--block-size",)).flags, ("--block-size",)),
])
def test_fixed_among(flags: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert fixed_among(FIXED_BLOCK, flags) == expected


def test_preflight_does_not_fix_a_fixed_flag() -> None:
    assert allowed("--block-size", Policy()) and not allowed("--block-size", FIXED_BLOCK)
    assert allowed("--kv-cache-dtype", FIXED_BLOCK)


@pytest.mark.parametrize("value,expected", [
    (["--block-size"], ("--block-size",)),
    (["--block_size", "--kv-cache-dtype"], ("--block-size", "--kv-cache-dtype")),
    ([], ()),
])
def test_config_reads_fixed_flags(value: list[str], expected: tuple[str, ...]) -> None:
    assert config_from_mapping({"policy": {"fixed_flags": value}}).policy.fixed_flags == expected
    assert config_from_mapping({}).policy.fixed_flags == ()


@pytest.mark.parametrize("value,message", [
    (["--blok-size"], "policy.fixed_flags: '--blok-size' is not an option of vllm serve"),
    ("--block-size", "policy.fixed_flags: expected a list of strings"),
    (["block-size"], "'block-size' is not an option of vllm serve"),
])
def test_config_refuses_bad_fixed_flags(value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        config_from_mapping({"policy": {"fixed_flags": value}}, "k.toml")
