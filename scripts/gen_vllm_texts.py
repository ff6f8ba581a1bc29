#!/usr/bin/env python3
"""Generate kvwatch/vllm_releases/generated/texts.py: every wording of the failures kvwatch diagnoses, per vLLM release.

For each release's unpacked source (a directory per release holding its `vllm/` package, as the wheels
unpack), every string literal that holds one of ANCHORS is read with `ast` (f-strings and implicitly
joined literals as one template, a placeholder shown as `{expression}`), with its file and line. Also
read: the --max-lora-rank values each release accepts (diagnosis/remedies.py proposes one of them).

    python scripts/gen_vllm_texts.py SOURCE_ROOT [RELEASE ...] [--check]   (default: every directory there)

--check fails (exit 1) when the committed texts.py is not what the sources give.

The output is pure data; tests/test_release_texts.py renders each template with sample values and
checks that kvwatch's diagnosis names the class recorded here. Nothing of vLLM is imported or copied
beyond these messages.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "kvwatch" / "vllm_releases" / "generated" / "texts.py"

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
    ("cpu_mla_kv_dtype", "kv_dtype_unsupported", "is not supported by MLA attention on CPU"),
    ("invalid_kv_cache_dtype", "kv_dtype_unsupported", "Invalid kv_cache_dtype: "),
    ("mismatched_16bit_kv", "kv_dtype_unsupported", "is incompatible with dtype="),
    ("extensible_kv_cache_refused", "config_refused", "enable_extensible_kv_cache: "),
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
    """The oldest release's texts whole, then each later release's changes against the one before:
    the texts it adds or moves (keyed by text id and template) and the keys it drops."""
    names = sorted(releases, key=_release_key)
    out = ['"""The failure wordings of each vLLM release that kvwatch diagnoses (generated by',
           "scripts/gen_vllm_texts.py from each release's source; do not edit by hand). Pure data, read",
           "through kvwatch/vllm_releases/texts.py (TEXTS, LORA_RANKS).",
           "",
           "A text is keyed by (text id, template) -> (the class kvwatch must name, file, line): the oldest",
           "release's whole, then per later release, oldest first, the texts it adds or whose file or line",
           "moved, and the keys it drops. The --max-lora-rank values: the oldest release's, then each change.",
           '"""',
           "from __future__ import annotations",
           "",
           f'BASE_RELEASE = "{names[0]}"',
           "",
           "BASE: dict[tuple[str, str], tuple[str, str, int]] = {"]
    current = {(n, t): (k, f, ln) for n, k, t, f, ln in releases[names[0]]}
    out += [f"    {key!r}: {value!r}," for key, value in current.items()]
    out += ["}", "", "CHANGES: dict[str, tuple[dict[tuple[str, str], tuple[str, str, int]], tuple[tuple[str, str], ...]]] = {"]
    for release in names[1:]:
        new = {(n, t): (k, f, ln) for n, k, t, f, ln in releases[release]}
        changed = {key: v for key, v in new.items() if current.get(key) != v}
        dropped = tuple(key for key in current if key not in new)
        out.append(f'    "{release}": ({{')
        out += [f"        {key!r}: {value!r}," for key, value in changed.items()]
        out.append(f"    }}, {dropped!r}),")
        current = new
    out += ["}", "", "# --max-lora-rank's values: (ranks, file, line), the oldest release's and each that differs.",
            "LORA_RANKS_CHANGES: dict[str, tuple[tuple[int, ...], str, int]] = {"]
    last = None
    for release in sorted(lora, key=_release_key):
        if lora[release] != last:
            out.append(f"    {release!r}: {lora[release]!r},")
            last = lora[release]
    out.append("}")
    return "\n".join(out) + "\n"


def default_releases() -> list[str]:
    """The releases texts.py holds (the older ones read for the diagnosis' V0 logs too) and every one
    kvwatch knows (kvwatch.vllm_releases.KNOWN): a release added there is read with them."""
    sys.path.insert(0, str(ROOT))
    from kvwatch.vllm_releases import KNOWN
    from kvwatch.vllm_releases.generated.texts import BASE_RELEASE, CHANGES
    return sorted({BASE_RELEASE, *CHANGES} | {str(v) for v in KNOWN}, key=_release_key)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    argv = [a for a in argv if a != "--check"]
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(argv[0])
    if not root.is_dir():
        print(f"error: {root} is not a folder of unpacked releases", file=sys.stderr)
        return 2
    names = argv[1:] or default_releases()
    missing = [n for n in names if not (root / n / "vllm").is_dir()]
    if missing:
        print(f"error: {', '.join(missing)} not unpacked under {root}", file=sys.stderr)
        return 2
    releases, lora = {}, {}
    for name in names:
        releases[name] = texts_of(root / name)
        if (ranks := lora_ranks_of(root / name)) is not None:
            lora[name] = ranks
        print(f"{name}: {len(releases[name])} texts", file=sys.stderr)
    text = render(releases, lora)
    if check:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(ROOT)} is not current: run scripts/gen_vllm_texts.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
