"""The upgrade check: one engine command planned for two vLLM releases, each difference with its
reason and the source line of the release that makes it (pure).

The reasons come from the releases' own data (vllm_releases/defaults.py): a changed default
utilization, a CUDA graph estimate now taken from the budget, another batch tier for the card, another
default block size. A figure that only follows from those (blocks, tokens, the KV share) says so.
The command's own flags are read by both releases' parsers (vllm_releases/generated/flags.py): a flag whose
meaning changes (removed, now ambiguous, another option, the other polarity, an inverse gained,
other choices or arity) is a difference with the release's source line.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvwatch.planner.devices import Device
from kvwatch.planner.extensible_kv import withheld_bytes
from kvwatch.planner.gpu_budget import GpuBudget
from kvwatch.planner.plan import Plan
from kvwatch.planner.serve_options import Match, ReleaseOptions, ServeOption, release_options, vllm_spelling
from kvwatch.planner.units import format_bytes
from kvwatch.values.versions import VllmVersion
from kvwatch.vllm_releases import resolve
from kvwatch.vllm_releases.cudagraph_sizes import WIDE_SOURCE
from kvwatch.vllm_releases.defaults_shape import ReleaseDefaults
from kvwatch.vllm_releases.generated.flags import PARSERS
from kvwatch.vllm_releases.release_defaults import defaults_for


@dataclass(frozen=True)
class Difference:
    field: str
    a: Any
    b: Any
    reason: str
    source: str            # "vLLM X.Y.Z, file:line" of what makes it, "" when it only follows

    def to_json(self) -> dict[str, Any]:
        return {"field": self.field, "a": self.a, "b": self.b, "reason": self.reason, "source": self.source}


@dataclass(frozen=True)
class ReleaseComparison:
    version_a: str
    version_b: str
    used_a: str            # the known release each is planned as
    used_b: str
    notes: tuple[str, ...]  # why a release is planned as another
    differences: tuple[Difference, ...]

    def to_json(self) -> dict[str, Any]:
        return {"a": {"version": self.version_a, "planned_as": self.used_a},
                "b": {"version": self.version_b, "planned_as": self.used_b},
                "notes": list(self.notes), "differences": [d.to_json() for d in self.differences]}


def _tier_source(d: ReleaseDefaults, device: Device) -> str:
    if device.platform == "cpu":
        return d.cite(d.cpu_source)
    tier = d.gpu_batch_tier(device.total_memory_bytes or 0, device.name, device.compute_capability)
    return d.cite(tier.source)


def _cause_rows(a: Plan, b: Plan, da: ReleaseDefaults, db: ReleaseDefaults, device: Device) -> list[Difference]:
    """What the releases themselves change, each with the newer-side source line."""
    out: list[Difference] = []
    ga, gb = a.gpu_budget, b.gpu_budget
    if ga is not None and gb is not None:
        if ga.utilization != gb.utilization:
            given = da.gpu_memory_utilization != db.gpu_memory_utilization
            out.append(Difference("utilization", ga.utilization, gb.utilization,
                                  "the default --gpu-memory-utilization" if given else "the utilization",
                                  f"{_utilization_source(da, ga.extensible is not None)}; "
                                  f"{_utilization_source(db, gb.extensible is not None)}") if not (
                ga.extensible is None and gb.extensible is not None) else Difference(
                "utilization", ga.utilization, gb.utilization,
                f"an unset --gpu-memory-utilization means {gb.utilization} with vLLM {db.release}'s extensible "
                "KV cache, sized from the memory measured after warm-up and CUDA graph capture",
                f"{da.cite(da.gpu_memory_utilization_source)}; {db.cite(db.extensible.utilization_source)}"
                if db.extensible is not None else ""))
        if (ga.extensible is None) != (gb.extensible is None):
            side = db if gb.extensible is not None else da
            assert side.extensible is not None
            out.append(Difference("kv_sizing", "profile estimate" if ga.extensible is None else "after warm-up",
                                  "after warm-up" if gb.extensible is not None else "profile estimate",
                                  "the extensible KV cache: total x utilization less what the engine keeps "
                                  "after warm-up, a margin of max(1 GiB, 0.75 x the transient peak) and that peak",
                                  f"{side.cite(side.extensible.source)}; {side.cite(side.extensible.margin_source)}"))
        cap = _explicit_cap(gb, db)
        if cap is not None:
            out.append(cap)
        if ga.cuda_graph_bytes and gb.cuda_graph_bytes and ga.cuda_graph_bytes != gb.cuda_graph_bytes:
            out.append(Difference("cuda_graphs", ga.cuda_graph_bytes, gb.cuda_graph_bytes,
                                  "both count the graphs; 0.34 captures wider grids on the SM100 family, and the "
                                  "graph pool holds the widest graph's working set (vllm_releases/cudagraph_sizes.py)",
                                  WIDE_SOURCE))
        elif ga.cuda_graph_bytes != gb.cuda_graph_bytes:
            side = db if gb.cuda_graph_bytes else da
            out.append(Difference("cuda_graphs", ga.cuda_graph_bytes, gb.cuda_graph_bytes,
                                  f"CUDA graph estimate taken from the KV budget in vLLM {side.release} "
                                  f"(VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS {side.cudagraph_estimate})",
                                  f"{side.cite(side.cudagraph_estimate_source)}; {side.cite(side.cudagraph_applied_source)}"))
        for name in ("max_num_batched_tokens", "max_num_seqs"):
            va, vb = getattr(ga, name), getattr(gb, name)
            if va != vb:
                out.append(Difference(name, va, vb, f"the scheduler's default for {device.name}",
                                      f"{_tier_source(da, device)}; {_tier_source(db, device)}"))
        if ga.activation_peak_bytes != gb.activation_peak_bytes:
            why = "the profile run's batch" if (ga.max_num_batched_tokens, ga.max_num_seqs) != (
                gb.max_num_batched_tokens, gb.max_num_seqs) else f"the sampler: {gb.release.split(';')[0]}"
            out.append(Difference("activation_peak", ga.activation_peak_bytes, gb.activation_peak_bytes,
                                  f"follows from {why}", ""))
        for name in ("weights_bytes", "non_torch_bytes"):
            va, vb = getattr(ga, name), getattr(gb, name)
            if va != vb:
                out.append(Difference(name.removesuffix("_bytes"), va, vb, "the memory profile's estimate", ""))
    if a.block_size != b.block_size:
        source = f"{da.cite(da.block_size_source)}; {db.cite(db.block_size_source)}" \
            if da.block_size != db.block_size else ""
        out.append(Difference("block_size", a.block_size, b.block_size,
                              f"{a.block_size_source} -> {b.block_size_source}", source))
    if a.backend != b.backend:
        out.append(Difference("backend", a.backend, b.backend, "the release's backend priorities", ""))
    return out


def _utilization_source(d: ReleaseDefaults, extensible: bool) -> str:
    if extensible and d.extensible is not None:
        return d.cite(d.extensible.utilization_source)
    return d.cite(d.gpu_memory_utilization_source)


def _explicit_cap(budget: GpuBudget, d: ReleaseDefaults) -> Difference | None:
    """An explicit utilization below 1.0 under the extensible KV cache caps it: what leaving it unset
    would give back (vLLM warns from 1 GiB: vLLM 0.34.0, vllm/v1/worker/extensible_kv_cache.py:654-677)."""
    sizing = budget.extensible
    if sizing is None or budget.utilization >= sizing.utilization:
        return None
    withheld = withheld_bytes(sizing, budget.cuda_total_bytes, budget.utilization, budget.free_at_start_bytes,
                              budget.resident_bytes, budget.transient_bytes)
    if withheld <= 0:
        return None
    return Difference("utilization_cap", None, budget.utilization,
                      f"--gpu-memory-utilization {budget.utilization} now caps the KV cache: it keeps "
                      f"{format_bytes(withheld)} out of it that leaving the flag unset ({sizing.utilization}) would "
                      f"give; keep it only to leave room for memory vLLM does not measure (another process)",
                      d.cite(sizing.utilization_source))


def _result_rows(a: Plan, b: Plan, causes: list[Difference]) -> list[Difference]:
    """What follows: the KV share, blocks, tokens, max model len, concurrency."""
    named = ", ".join(c.field for c in causes) or "the plan"
    pairs = [("kv_memory_bytes", a.kv_memory_bytes, b.kv_memory_bytes),
             ("num_blocks", a.num_blocks, b.num_blocks),
             ("kv_cache_tokens", a.kv_cache_tokens, b.kv_cache_tokens),
             ("max_model_len", a.max_model_len, b.max_model_len),
             ("max_concurrency", round(a.max_concurrency or 0.0, 2), round(b.max_concurrency or 0.0, 2))]
    return [Difference(name, va, vb, f"follows from {named}", "") for name, va, vb in pairs if va != vb]


def _refusal_rows(a: Plan, b: Plan) -> list[Difference]:
    wa = {(w.kind.value, w.message) for w in a.warnings}
    wb = {(w.kind.value, w.message) for w in b.warnings}
    out = [Difference(f"refusal {kind}", "yes", None, message, "") for kind, message in sorted(wa - wb)]
    out += [Difference(f"refusal {kind}", None, "yes", message, "") for kind, message in sorted(wb - wa)]
    return out


def _option_tokens(argv: Sequence[str], opts: ReleaseOptions) -> list[tuple[str, str | None]]:
    """The command's option tokens (as vLLM spells them) with the value each takes, as `opts` reads them."""
    out: list[tuple[str, str | None]] = []
    tokens = [vllm_spelling(t) for t in argv]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        found = opts.match(token)
        i += 1
        if found is None:
            continue
        value = found.explicit
        option = found.option
        if value is None and option is not None and option.takes_value and option.nargs in (None, 1) \
                and i < len(tokens) and opts.match(tokens[i]) is None:
            value, i = tokens[i], i + 1
        out.append((token.split("=", 1)[0] if "=" in token else token, value))
    return out


def _polarity(found: Match) -> str:
    assert found.option is not None
    return "off" if found.spelling in found.option.negative else "on"


def _meaning(found: Match) -> str:
    """What a matched token sets: the option, with `off` for a switch's inverse."""
    assert found.option is not None
    return f"{found.option.name} off" if found.option.form == "bool" and _polarity(found) == "off" \
        else found.option.name


def _cite(release: str, option: ServeOption) -> str:
    return option.source if option.source.startswith("vLLM ") else f"vLLM {release}, {option.source}"


def _meaning_row(token: str, value: str | None, ra: str, rb: str, ma: Match, mb: Match) -> Difference | None:
    """How `token` (with its `value`) reads in release ra and in rb, when that differs."""
    field = f"flag {token}"
    oa, ob = ma.option, mb.option
    if oa is None and ob is None:
        return None
    if oa is not None and ob is None:
        if mb.ambiguous:
            return Difference(field, _meaning(ma), "ambiguous",
                              f"vLLM {rb} refuses it: ambiguous, could match {', '.join(mb.ambiguous[:4])}",
                              PARSERS[rb])
        return Difference(field, _meaning(ma), "unknown", f"vLLM {rb} has no such option: its parser refuses it",
                          _cite(ra, oa))
    if oa is None and ob is not None:
        why = f"ambiguous in vLLM {ra}" if ma.ambiguous else f"unknown to vLLM {ra}"
        return Difference(field, "ambiguous" if ma.ambiguous else "unknown", _meaning(mb),
                          f"{why}; vLLM {rb} reads it as {_meaning(mb)}", _cite(rb, ob))
    assert oa is not None and ob is not None
    if oa.dest != ob.dest:
        return Difference(field, _meaning(ma), _meaning(mb), f"the prefix now means {ob.name}", _cite(rb, ob))
    pa = _polarity(ma) if oa.form == "bool" else "on"
    pb = _polarity(mb) if ob.form == "bool" else "on"
    if pa != pb:
        return Difference(field, f"{oa.name} {pa}", f"{ob.name} {pb}", f"turns {ob.name} {pb} in vLLM {rb}",
                          _cite(rb, ob))
    if oa.choices != ob.choices:
        lost = sorted(set(oa.choices or ()) - set(ob.choices or ()))
        gained = sorted(set(ob.choices or ()) - set(oa.choices or ()))
        if ob.choices is None:
            why = f"vLLM {rb}'s parser checks no choices (the value is left to the config)"
        elif value is not None and value not in ob.choices:
            why = f"vLLM {rb} refuses {value!r}: invalid choice"
        else:
            why = "choices " + "; ".join(p for p in (f"lost {', '.join(lost)}" if lost else "",
                                                      f"gained {', '.join(gained)}" if gained else "") if p)
        return Difference(field, value, value, why, _cite(rb, ob))
    if oa.nargs != ob.nargs or (oa.form == "value") != (ob.form == "value"):
        return Difference(field, f"{oa.form} {oa.nargs}", f"{ob.form} {ob.nargs}",
                          f"takes {'no value' if not ob.takes_value else 'a value'} in vLLM {rb}", _cite(rb, ob))
    gained_inverse = sorted(ob.negative - oa.negative)
    if gained_inverse:
        return Difference(field, pa, pb, f"same meaning; vLLM {rb} adds the inverse {', '.join(gained_inverse)}",
                          _cite(rb, ob))
    return None


def flag_meaning_rows(argv: Sequence[str], release_a: str, release_b: str) -> list[Difference]:
    """The command's flags whose meaning differs between two known releases' `vllm serve` parsers."""
    opts_a, opts_b = release_options(release_a), release_options(release_b)
    out: list[Difference] = []
    seen: set[str] = set()
    for token, value in _option_tokens(argv, opts_a):
        ma, mb = opts_a.match(token), opts_b.match(token)
        if ma is None or mb is None or token in seen:
            continue
        seen.add(token)
        row = _meaning_row(token, value, release_a, release_b, ma, mb)
        if row is not None:
            out.append(row)
    return out


def refused_comparison(version_a: VllmVersion, version_b: VllmVersion, argv: Sequence[str],
                       refusal: str) -> ReleaseComparison:
    """The upgrade check when release B's parser refuses the command: no plan for B, only the
    flags whose meaning changes and B's refusal."""
    choice_a, choice_b = resolve(version_a), resolve(version_b)
    rows = flag_meaning_rows(argv, str(choice_a.used), str(choice_b.used))
    rows.append(Difference("refusal command_line", None, "yes", refusal, PARSERS[str(choice_b.used)]))
    return ReleaseComparison(str(version_a), str(version_b), str(choice_a.used), str(choice_b.used),
                             tuple(c.why for c in (choice_a, choice_b) if c.why), tuple(rows))


def compare_releases(a: Plan, b: Plan, version_a: VllmVersion, version_b: VllmVersion,
                     device: Device, argv: Sequence[str] = ()) -> ReleaseComparison:
    choice_a, choice_b = resolve(version_a), resolve(version_b)
    da, db = defaults_for(version_a), defaults_for(version_b)
    causes = _cause_rows(a, b, da, db, device)
    flags = flag_meaning_rows(argv, str(choice_a.used), str(choice_b.used)) if argv else []
    return ReleaseComparison(
        str(version_a), str(version_b), str(choice_a.used), str(choice_b.used),
        tuple(c.why for c in (choice_a, choice_b) if c.why),
        tuple(flags + causes + _result_rows(a, b, causes) + _refusal_rows(a, b)))


_BYTE_FIELDS = {"cuda_graphs", "activation_peak", "weights", "non_torch", "kv_memory_bytes"}


def _cell(field: str, value: Any) -> str:
    if value is None:
        return "-"
    if field in _BYTE_FIELDS and isinstance(value, int):
        return format_bytes(value)
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_comparison(c: ReleaseComparison) -> str:
    head = f"vLLM {c.version_a} -> {c.version_b}"
    lines = [head, *(f"note: {n}" for n in c.notes)]
    if not c.differences:
        return "\n".join([*lines, "no difference: the two releases plan this command alike"])
    width = max(len(d.field) for d in c.differences)
    cells = [(_cell(d.field, d.a), _cell(d.field, d.b)) for d in c.differences]
    wa = max(len(x) for x, _ in cells)
    wb = max(len(y) for _, y in cells)
    for d, (x, y) in zip(c.differences, cells, strict=True):
        lines.append(f"{d.field:<{width}}  {x:>{wa}} -> {y:<{wb}}  {d.reason}")
        if d.source:
            lines.append(f"{'':<{width}}  {'':>{wa}}    {'':<{wb}}  source: {d.source}")
    return "\n".join(lines)
