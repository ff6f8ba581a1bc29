"""The plan in force: computed in one place, from the model's config.json read once per launch.

The supervisor asks here whenever what decides the plan changes (the start, a corrected command, a
launch and its pin, a figure the engine's profile taught); every answer reads the same device, rule
table and environment, and the non-KV memory learned for the command's profile. The engine's GPU
budget (the CUDA total x the utilization vLLM takes) is the launch's too.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from kvwatch.boundary.device_probe import installed_vllm
from kvwatch.boundary.model_source import ModelSource, load_model_source
from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.gpu_budget import requested_bytes
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import RuleSet
from kvwatch.watchdog.preflight import plan_with_learned


class PlanInForce:
    def __init__(self, device: Device, rules: RuleSet, env: Callable[[], Mapping[str, str]],
                 read_model: Callable[[str], ModelSource] = load_model_source) -> None:
        self.device = device
        self.rules = rules            # replaced when a failure teaches the block sizes a backend takes
        self._env = env
        self._read_model = read_model
        self._models: dict[str, ModelSource] = {}
        self.plan: Plan | None = None

    def begin_launch(self) -> None:
        """Forget the model read: the next plan reads config.json again (once for this launch)."""
        self._models.clear()

    def model(self, name: str) -> ModelSource:
        if name not in self._models:
            self._models[name] = self._read_model(name)
        return self._models[name]

    def compute(self, command: EngineCommand, learned: Mapping[str, int] | None = None) -> Plan | None:
        """The plan for `command`, refined by the learned non-KV memory; it is the plan in force."""
        self.plan = plan_with_learned(command, self.device, self.rules, self._env(), learned, self.model)
        return self.plan

    def what_if(self, command: EngineCommand, learned: Mapping[str, int] | None = None) -> Plan | None:
        """The plan `command` would have (a recommended change), leaving the plan in force as it is."""
        return plan_with_learned(command, self.device, self.rules, self._env(), learned, self.model)

    def requested_bytes(self, command: EngineCommand) -> int | None:
        """The budget vLLM sizes its memory against: the CUDA total x the utilization it takes (the flag,
        else its release's default), where the device is a CUDA GPU with a known total (None elsewhere,
        or for a utilization vLLM refuses)."""
        device = self.device
        if device.platform != "cuda" or not device.total_memory_bytes:
            return None
        try:
            settings = command.settings()
        except KvwatchError:
            return None
        if not 0 < settings.gpu_memory_utilization <= 1:
            return None
        return requested_bytes(device, settings, installed_vllm(), self._env())
