#!/usr/bin/env python3
"""Generate kvwatch/vllm_releases/texts.py: every wording of the failures kvwatch diagnoses, per vLLM release.

For each release's unpacked source (a directory per release holding its `vllm/` package, as the wheels
unpack), every string literal that holds one of ANCHORS is read with `ast` (f-strings and implicitly
joined literals as one template, a placeholder shown as `{expression}`), with its file and line. Also
read: the --max-lora-rank values each release accepts (diagnosis/remedies.py proposes one of them).

    python scripts/gen_vllm_texts.py SOURCE_ROOT [RELEASE ...]      (default: every directory there)

The output is pure data; tests/test_release_texts.py renders each template with sample values and
checks that kvwatch's diagnosis names the class recorded here. Nothing of vLLM is imported or copied
beyond these messages.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "kvwatch" / "vllm_releases" / "texts.py"

# (text id, the class kvwatch must name, a substring only that message holds)
ANCHORS: tuple[tuple[str, str, str], ...] = (
    ("kv_cache_too_small", "kv_cache_too_small", "To serve at least one request with the"),
    ("kv_cache_too_small_old", "kv_cache_too_small", "is larger than the maximum number of tokens that can be stored"),
    ("no_cache_blocks", "no_kv_cache_memory", "No available memory for the cache blocks"),
    ("auto_fit_no_memory", "no_kv_cache_memory", "Cannot auto-fit max_model_len"),
    ("mamba_cache_too_small", "mamba_cache_too_small", "exceeds available Mamba cache blocks"),
    ("free_memory_on_startup", "gpu_memory_busy", "on startup is less than desired GPU memory utilization"),
    ("free_memory_on_startup", "gpu_memory_busy", "on startup is less than the engine's budget"),
    ("no_common_block_size", "block_size_unsupported", "No common block size for"),
    ("aligned_block_size", "block_size_unsupported", "is not supported by attention backend"),
    ("block_size_multiple", "block_size_unsupported", "Block size must be a multiple of"),
    ("no_valid_attention_backend", "no_attention_backend", "No valid attention backend found"),
    ("selected_backend_invalid", "no_attention_backend", "is not valid for this configuration"),
    ("cpu_fp8_head_size", "kv_dtype_unsupported", "FP8 KV cache requires head_size"),
    ("cpu_fp8_isa", "kv_dtype_unsupported", "FP8 KV cache on CPU requires"),
    ("triton_fp8_kv", "kv_dtype_unsupported", "FP8 KV cache is not supported by the Triton"),
    ("sampler_warmup_oom", "cuda_oom", "CUDA out of memory occurred when warming up sampler"),
    ("model_load_oom", "cuda_oom", "Failed to load model - not enough GPU memory"),
    ("max_model_len_above_derived", "config_refused", "is greater than the derived max_model_len"),
    ("tensor_parallel_size_not_dividing_heads", "config_refused", "must be divisible by tensor parallel size ("),
    ("max_num_batched_tokens_below_max_model_len", "config_refused", ") is smaller than max_model_len ("),
    ("max_num_batched_tokens_below_max_num_seqs", "config_refused", "must be greater than or equal to max_num_seqs"),
    ("architecture_not_supported", "config_refused", "are not supported for now"),
    ("lora_rank_above_max", "lora_rank_too_large", "is greater than max_lora_rank"),
    ("tool_parser_unknown", "tool_parser_unknown", "invalid tool call parser"),
    ("placement_group_unavailable", "placement_group_unavailable", "Cannot provide a placement group"),
    ("engine_dead", "engine_died", "EngineCore encountered an issue"),
)


def _template(node: ast.AST) -> str | None:
    """A string expression as a template: literal text, `{expr}` for each placeholder."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                spec = ""
                if part.format_spec is not None:
                    spec = ":" + (_template(part.format_spec) or "")
                out.append("{" + ast.unparse(part.value) + spec + "}")
        return "".join(out)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left), _template(node.right)
        if left is not None and right is not None:
            return left + right
    return None


_QUIET_LOG_CALLS = {"debug", "info", "warning", "warn", "info_once", "warning_once", "debug_once"}


def _docstrings(tree: ast.AST) -> set[int]:
    """Strings that are no failure: docstrings, and the arguments of INFO/WARNING log calls."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr)):
            ids.add(id(node.value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _QUIET_LOG_CALLS:
            for arg in node.args:
                ids.update(id(n) for n in ast.walk(arg))
    return ids


def texts_of(release_dir: Path) -> list[tuple[str, str, str, str, int]]:
    found: dict[tuple[str, str], tuple[str, str, str, str, int]] = {}
    for path in sorted((release_dir / "vllm").rglob("*.py")):
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        # A message is often split over implicitly joined literals: a file is read when it holds the
        # anchor's longest word; the anchor itself is looked for in the joined template.
        anchors = [a for a in ANCHORS if max(a[2].split(), key=len) in source]
        if not anchors:
            continue
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        skip = _docstrings(tree)
        rel = path.relative_to(release_dir).as_posix()
        claimed: set[int] = set()
        for node in ast.walk(tree):
            if id(node) in skip or id(node) in claimed or not isinstance(node, (ast.BinOp, ast.JoinedStr, ast.Constant)):
                continue
            text = _template(node)
            if text is None:
                continue
            for name, kind, anchor in anchors:
                if anchor in text:
                    for child in ast.walk(node):
                        claimed.add(id(child))
                    key = (name, text)
                    if key not in found:
                        found[key] = (name, kind, text, rel, node.lineno)
    return sorted(found.values(), key=lambda t: (t[0], t[3], t[4]))


def lora_ranks_of(release_dir: Path) -> tuple[tuple[int, ...], str, int] | None:
    for rel in ("vllm/config/lora.py", "vllm/config.py"):
        path = release_dir / rel
        if not path.exists():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name = node.targets[0].id
                value = node.value
                if name == "MaxLoRARanks" and isinstance(value, ast.Subscript):
                    value = value.slice
                if name in ("MaxLoRARanks", "possible_max_ranks") and isinstance(value, ast.Tuple):
                    ranks = tuple(e.value for e in value.elts if isinstance(e, ast.Constant) and isinstance(e.value, int))
                    if ranks:
                        return ranks, rel, node.lineno
    return None


def _release_key(name: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else 0 for p in name.replace(".post", ".").split("."))


def render(releases: dict[str, list[tuple[str, str, str, str, int]]],
           lora: dict[str, tuple[tuple[int, ...], str, int]]) -> str:
    out = ['"""The failure wordings of each vLLM release that kvwatch diagnoses (generated; do not edit).',
           "",
           "Generated by scripts/gen_vllm_texts.py from each release's source: every message template with the",
           "file and line it is in (cite as \"vLLM X.Y.Z, FILE:LINE\"), the text id and the class kvwatch names",
           "it; and the --max-lora-rank values each release accepts. Pure data.",
           '"""',
           "from __future__ import annotations",
           "",
           "from typing import NamedTuple",
           "",
           "",
           "class ReleaseText(NamedTuple):",
           "    text_id: str      # the wording's id (kvwatch/diagnosis/patterns.py names its pattern alike)",
           "    kind: str         # the FailureKind value kvwatch must name for it",
           "    template: str     # the message, each placeholder as {expression}",
           "    file: str         # in the release's source",
           "    line: int",
           "",
           "",
           "TEXTS: dict[str, tuple[ReleaseText, ...]] = {"]
    for release in sorted(releases, key=_release_key):
        out.append(f"    {release!r}: (")
        for name, kind, text, rel, line in releases[release]:
            out.append(f"        ReleaseText({name!r}, {kind!r},")
            out.append(f"                    {text!r},")
            out.append(f"                    {rel!r}, {line}),")
        out.append("    ),")
    out.append("}")
    out.append("")
    out.append("# The values --max-lora-rank takes: (ranks, file, line) per release.")
    out.append("LORA_RANKS: dict[str, tuple[tuple[int, ...], str, int]] = {")
    for release in sorted(lora, key=_release_key):
        out.append(f"    {release!r}: {lora[release]!r},")
    out.append("}")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[0])
    names = argv[1:] or sorted((p.name for p in root.iterdir() if (p / "vllm").is_dir()), key=_release_key)
    releases, lora = {}, {}
    for name in names:
        releases[name] = texts_of(root / name)
        if (ranks := lora_ranks_of(root / name)) is not None:
            lora[name] = ranks
        print(f"{name}: {len(releases[name])} texts", file=sys.stderr)
    OUT.write_text(render(releases, lora), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
