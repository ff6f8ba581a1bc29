"""The real GPU start-up logs of tests/fixtures/gpu_logs as planner inputs: each run's config.json,
flags, environment, vLLM version and card, planned as kvwatch plans them, and the figures the
issue's measure takes from them (the error of the KV memory and tokens, per term). Shared by
tests/test_gpu_budget.py and bench/bench_gpu_budget.py.

Every run carries a `split`: "fit" (the runs the memory terms were measured on, including every
run kvwatch was tuned to before issue 27) or "held_out" (never looked at while fitting: drawn once,
by the sha256 of the run's name among the runs added by issue 27, every other one in that order).
That split is by run: runs of one source (a repository, an author's notes, an issue thread) fall on
both sides of it. Issue 38's split holds out whole sources: every run carries its `source`, and
`source_split` draws the sources, not the runs (the bench prints both).
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.geometry import geometry_from_config
from kvwatch.planner.gpu_budget import GpuBudget
from kvwatch.planner.plan import MemoryInputs, Plan, make_plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.values.versions import parse_version

GiB = 2**30
CORPUS = Path(__file__).resolve().parent / "fixtures" / "gpu_logs" / "corpus.json"
WITHIN = 0.03      # the bar: a run is "within" when its |error| is at most 3 %
_CAPABILITY = {"A100": (8, 0), "H100": (9, 0), "H200": (9, 0), "3090": (8, 6), "4090": (8, 9), "4060": (8, 9),
               "4070": (8, 9), "L40S": (8, 9), "6000 Ada": (8, 9), "A40": (8, 6), "T4": (7, 5),
               "RTX PRO 6000": (12, 0), "RTX PRO 4000": (12, 0), "5090": (12, 0),
               "compute capability 7.5": (7, 5), "3050": (8, 6), "3060": (8, 6), "L40": (8, 9), "A10": (8, 6), "2060": (7, 5), "Volta": (7, 0), "B200": (10, 0), "GTX 1080": (6, 1), "L4": (8, 9), "RTX A6000": (8, 6), "RTX A5000": (8, 6), "L20": (8, 9), "5070": (12, 0), "RTX A4000": (8, 6), "2070": (7, 5), "H20": (9, 0)}
FIT, HELD_OUT = "fit", "held_out"


def all_runs() -> list[dict[str, Any]]:
    return list(json.loads(CORPUS.read_text()))


def _layers(cfg: Mapping[str, Any]) -> Any:
    return cfg.get("num_hidden_layers") or (cfg.get("text_config") or {}).get("num_hidden_layers")


def started_runs(split: str | None = None) -> list[dict[str, Any]]:
    """The runs where vLLM started with a KV cache and whose config.json is known (of one split)."""
    return [r for r in all_runs() if r.get("status") == "ok" and (r["logged"].get("available_kv_cache_gib") or 0) > 0
            and _layers(r["model_config"]) and (split is None or r["split"] == split)]


PATCHED = "patched engine"


def patched_runs() -> list[dict[str, Any]]:
    """Runs of a patched engine (a pull request's branch): kvwatch plans the release, which their
    source says behaved otherwise, so they are scored apart from the runs of released engines."""
    return [r for r in all_runs() if str(r.get("status", "")).startswith(PATCHED)]


def capability(gpu: str) -> tuple[int, int]:
    return next((cc for name, cc in _CAPABILITY.items() if name in gpu), (8, 0))


def env_of(run: dict[str, Any]) -> dict[str, str]:
    """Environment the run's flags list as `env NAME=VALUE`."""
    return dict(f.split(None, 1)[1].split("=", 1) for f in run["flags"] if f.startswith("env "))


def flags_of(run: dict[str, Any]) -> list[str]:
    """The run's engine flags (`name=value` of the offline API as `--name value`), serving-only ones dropped."""
    out: list[str] = []
    for flag in run["flags"]:
        if not flag.startswith("env "):
            out += shlex.split(flag if flag.startswith("-") else "--" + flag.replace("_", "-"))
    keep, i = [], 0
    while i < len(out):
        if out[i] in ("--port", "--host", "--served-model-name"):
            i += 2
            continue
        keep.append(out[i])
        i += 1
    if "--tensor-parallel-size" not in keep and "-tp" not in keep and run.get("tensor_parallel_size", 1) > 1:
        keep += ["--tensor-parallel-size", str(run["tensor_parallel_size"])]
    if not any(k.startswith("--gpu-memory-utilization") for k in keep):
        keep += ["--gpu-memory-utilization", str(run["gpu_memory_utilization"])]
    return keep


def model_config(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run["model_config"].items() if v is not None}


def device_of(run: dict[str, Any]) -> Device:
    """The card: the CUDA total the log states, else its name (kvwatch's table of CUDA totals)."""
    gib = run["total_gpu_memory_gib"]
    logged = run["total_gpu_memory_source"].startswith("logged")
    return Device("cuda", run["gpu"], capability(run["gpu"]), int(gib * GiB),
                  cuda_total_bytes=int(gib * GiB) if logged else None)


def version_of(run: dict[str, Any]) -> str:
    return str(run.get("planned_for_vllm_version") or run["vllm_version"])


def plan_run(run: dict[str, Any], model_dir: Path, logged_kv: bool = False) -> Plan:
    """kvwatch's plan before launch, for the vLLM the run used (`planned_for_vllm_version` where
    its log names no exact version; the corpus says why). `logged_kv`: the plan given the KV memory
    the engine logged (as a learned profile gives it), so that its tokens show the layout alone."""
    if run.get("model_file"):   # a single-file checkpoint (GGUF): its name carries the file type
        model_dir = model_dir / run["model_file"]
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text(json.dumps(model_config(run)))
    version = parse_version(version_of(run))
    command = EngineCommand.parse(["vllm", "serve", str(model_dir), *flags_of(run)])
    geometry = geometry_from_config(model_config(run))
    memory = MemoryInputs(vllm_version=version, vllm_env=tuple(env_of(run).items()),
                          flashinfer_installed=run.get("flashinfer_installed"))
    device = device_of(run)
    plan = make_plan(geometry, command.settings(), device, ruleset_for(None), memory)
    if not logged_kv or plan.gpu_budget is None:
        return plan
    non_kv = plan.gpu_budget.requested_bytes - logged_kv_bytes(run)
    learned = replace(memory, non_kv_bytes=non_kv)
    return make_plan(geometry, command.settings(), device, ruleset_for(None), learned)


def logged_kv_bytes(run: dict[str, Any]) -> int:
    return int(run["logged"]["available_kv_cache_gib"] * GiB)


def is_hybrid(plan: Plan) -> bool:
    """Several KV cache groups (sliding window beside full attention, Mamba or linear attention)."""
    return plan.kv_cache_groups > 1 or plan.recurrent_state_bytes > 0


# The memory terms a log can state beside the KV figure, and the budget part each is checked against.
_TERMS = (("weights", "model_weights_gib", "weights_bytes"),
          ("activation", "activation_peak_gib", "activation_peak_bytes"),
          ("non_torch", "non_torch_gib", "non_torch_bytes"))


def residual_terms(run: dict[str, Any], budget: GpuBudget) -> dict[str, float]:
    """Where kvwatch's KV memory differs from the logged one, in GiB of KV, term by term: for each
    part the log states, logged - kvwatch's (a part kvwatch underestimates gives it too much KV);
    CUDA graphs where the release counts them; the rest, what no logged line explains, as
    "unattributed". The terms add up to kvwatch's KV minus the logged KV."""
    logged = run["logged"]
    out: dict[str, float] = {}
    # From 0.27 the "peak activation" vLLM logs holds the CUDA graph estimate it applied
    # (v1/worker/gpu_worker.py: transient_peak_headroom + cudagraph_memory_estimate_applied), and
    # its "CUDAGraph memory" is the pool captured later: the two are one term then.
    joined = parse_version(version_of(run)).parts >= (0, 27, 0) and bool(budget.cuda_graph_bytes)
    for name, key, part in _TERMS:
        if logged.get(key) is not None:
            ours = getattr(budget, part) + (budget.cuda_graph_bytes if joined and name == "activation" else 0)
            out["activation+graphs" if joined and name == "activation" else name] = logged[key] - ours / GiB
    graphs = logged.get("cudagraph_gib")
    if budget.cuda_graph_bytes and graphs is not None and not joined:
        out["cuda_graphs"] = graphs - budget.cuda_graph_bytes / GiB
    total = budget.kv_cache_bytes / GiB - logged["available_kv_cache_gib"]
    out["unattributed"] = total - sum(out.values())
    return out


def worst_term(terms: Mapping[str, float]) -> tuple[str, float]:
    name = max(terms, key=lambda k: abs(terms[k]))
    return name, terms[name]


@dataclass(frozen=True)
class Summary:
    """The issue's figures over a set of runs' relative errors."""

    runs: int
    median: float       # median |error|
    mean: float         # mean |error| (what llm-d reports as MAE)
    within: float       # share of runs within 3 %
    zero_plans: int     # plans of no KV where vLLM started

    @classmethod
    def of(cls, errors: Iterable[float], zeros: int = 0) -> Summary:
        values = [abs(e) for e in errors]
        if not values:
            return cls(0, 0.0, 0.0, 0.0, zeros)
        return cls(len(values), statistics.median(values), statistics.fmean(values),
                   sum(v <= WITHIN for v in values) / len(values), zeros)


def within_interval(within: int, runs: int, confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a share `within` / `runs`: how far a held-out set of a few dozen
    runs leaves the true share of runs within 3 % open (37 runs at 73 % give about 57-85 %)."""
    if runs == 0:
        return 0.0, 1.0
    z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
    share = within / runs
    centre = (share + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z / (1 + z * z / runs) * (share * (1 - share) / runs + z * z / (4 * runs * runs)) ** 0.5
    return max(0.0, centre - half), min(1.0, centre + half)


def per_source_summary(errors: Iterable[tuple[str, float]]) -> Summary:
    """One figure per source: the median |error| of each source's runs, summarised over the sources,
    so that a source with many runs (one box, one author) weighs what one with a single run does."""
    per_source: dict[str, list[float]] = {}
    for source, error in errors:
        per_source.setdefault(source, []).append(abs(error))
    return Summary.of(statistics.median(values) for values in per_source.values())


def drawn_split(runs: list[dict[str, Any]]) -> dict[str, str]:
    """The split as it was drawn: runs tuned to before issue 27 fit; of the others of the first draw
    (`draw` 1), ordered by the sha256 of their name, every other one (the first included) held out;
    a run added later (`draw` 2 and on) is held out when the sha256 of its name is even, so that an
    addition never moves a run already drawn."""
    first = sorted((r["name"] for r in runs if not r["tuned_before_issue_27"] and r["draw"] == 1),
                   key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    held = set(first[::2]) | {r["name"] for r in runs if r["draw"] > 1
                              and int(hashlib.sha256(r["name"].encode()).hexdigest(), 16) % 2 == 0}
    return {r["name"]: HELD_OUT if r["name"] in held else FIT for r in runs}


def source_of_url(source_url: str) -> str:
    """The source a run's `source_url` names: a GitHub repository (github.com/owner/name), a vLLM
    issue or pull request thread (github.com/vllm-project/vllm#N), a web site (its host), or a stored
    file the search tool names no repository for (search-index file N)."""
    thread = re.match(r"(?:https://)?github\.com/vllm-project/vllm/(?:issues|pull)/(\d+)", source_url)
    if thread:
        return f"github.com/vllm-project/vllm#{thread.group(1)}"
    repo = re.match(r"(?:https://)?github\.com/([^/\s]+)/([^/\s]+)", source_url)
    if repo:
        return f"github.com/{repo.group(1)}/{repo.group(2)}"
    site = re.match(r"https://([^/\s]+)/", source_url)
    if site:
        return site.group(1)
    stored = re.search(r"search-index file id (\d+)", source_url)
    if stored:
        return f"search-index file {stored.group(1)}"
    raise ValueError(f"no source in {source_url!r}")


def source_split(runs: list[dict[str, Any]]) -> dict[str, str]:
    """Issue 38's split, by whole sources: a source with a run kvwatch was tuned to before issue 27
    is fit; of the others, a source is held out when the sha256 of its name is even, so that all the
    runs of one source fall on one side and an added run of a new source never moves another."""
    tuned = {r["source"] for r in runs if r["tuned_before_issue_27"]}
    held = {r["source"] for r in runs if r["source"] not in tuned
            and int(hashlib.sha256(r["source"].encode()).hexdigest(), 16) % 2 == 0}
    return {r["name"]: HELD_OUT if r["source"] in held else FIT for r in runs}
