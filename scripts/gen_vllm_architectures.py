#!/usr/bin/env python3
"""Generate kvwatch/vllm_releases/generated/architectures.py (and architecture_details.py): for every architecture a vLLM release registers,
the KV cache layers vLLM builds for it, read from the release's own source with `ast` (nothing of
vLLM or transformers is imported or copied).

    python scripts/gen_vllm_architectures.py SRC_ROOT [--transformers DIR] [--releases 0.32.0,...] [--check]

SRC_ROOT holds one unpacked wheel per release: SRC_ROOT/<version>/vllm/... (default: the
KVWATCH_VLLM_SRC environment variable). --transformers is an unpacked transformers package (its
`transformers/` directory): the config-class defaults of the fields vLLM reads come from there.

How a layer kind is found, per architecture (model_executor/models/registry.py names its module and
class):
- every class of the release's model and layer files is indexed, with the names its module imports;
- from the architecture's class, the classes it names (bases, constructors, default arguments, lambdas
  of make_layers) are followed, transitively, through the modules that import them;
- a class reached that holds a cache (it defines get_kv_cache_spec, or it is a MambaBase whose
  `mamba_type` names its backend) is a layer kind, named by that class (Attention, MLAAttention,
  ChunkedLocalAttention, ...) or by its Mamba backend (MAMBA1, MAMBA2, SHORT_CONV, LINEAR, GDN_ATTN),
  with the MambaStateDtypeCalculator rule of its state dtype and the class whose get_kv_cache_spec
  it runs (a subclass that redefines it reshapes the spec: 0.33's Qwen gated delta net);
- keyword arguments at the attention constructors say which variants a model uses:
  per_layer_sliding_window (sliding window), kv_sharing_target_layer_name (KV sharing), attn_type
  (encoder-only, encoder-decoder);
- the interfaces in the class's bases (IsHybrid, IsAttentionFree, SupportsMultiModal, pooling);
- a call of init_vllm_registered_model: a wrapper that delegates to the language model its
  text_config names (resolved by vLLM at load time, so no kinds of its own beyond its encoders).
The kinds are those the source can build: a file that serves several variants lists them all.

The config fields each architecture's classes read (config.X, getattr(config, "X", ...)) are
matched against transformers' config class of the model types that name the architecture
(transformers/models/auto/modeling_auto.py, auto_mappings.py): a field the class gives a default
is listed with that default, since vLLM reads it when config.json leaves it out.
"""
from __future__ import annotations

import argparse
import ast
import os
import pprint
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "kvwatch" / "vllm_releases" / "generated" / "architectures.py"
DETAILS_OUT = ROOT / "kvwatch" / "vllm_releases" / "generated" / "architecture_details.py"
# Every release kvwatch knows from the first one read here (0.32.0): a release added to
# kvwatch.vllm_releases.KNOWN is read with them.
FIRST_RELEASE = (0, 32, 0)


def _known_releases() -> tuple[str, ...]:
    sys.path.insert(0, str(ROOT))
    from kvwatch.vllm_releases import KNOWN
    return tuple(str(v) for v in KNOWN if v.parts >= FIRST_RELEASE)


RELEASES = _known_releases()
_REGISTRY = "vllm/model_executor/models/registry.py"
_GROUPS = ("_TEXT_GENERATION_MODELS", "_EMBEDDING_MODELS", "_LATE_INTERACTION_MODELS", "_REWARD_MODELS",
           "_TOKEN_CLASSIFICATION_MODELS", "_SEQUENCE_CLASSIFICATION_MODELS", "_MULTIMODAL_MODELS",
           "_SPECULATIVE_DECODING_MODELS", "_TRANSFORMERS_SUPPORTED_MODELS", "_TRANSFORMERS_BACKEND_MODELS")
_INDEXED = ("vllm/model_executor/models", "vllm/models", "vllm/model_executor/layers")
_INTERFACES = {"IsHybrid": "hybrid", "IsAttentionFree": "attention_free", "SupportsMultiModal": "multimodal",
               "VllmModelForPooling": "pooling", "HasInnerState": "inner_state"}
_ATTN_KWARGS = {"per_layer_sliding_window": "sliding_window", "kv_sharing_target_layer_name": "kv_sharing"}
_ATTN_TYPES = {"ENCODER_ONLY": "encoder_only", "ENCODER_DECODER": "encoder_decoder", "ENCODER": "encoder"}
# The config fields that shape the KV cache (the others, MLP widths and vocabularies, do not).
_KV_FIELDS = ("head_dim", "global_head_dim", "num_key_value_heads", "num_global_key_value_heads", "sliding_window",
              "layer_types", "layers_block_type", "num_kv_shared_layers", "max_position_embeddings",
              "attention_chunk_size", "no_rope_layer", "full_attention_interval", "kv_lora_rank",
              "qk_rope_head_dim", "index_", "linear_", "conv_", "mamba_", "ssm_", "state_size", "n_groups",
              "attn_layer_", "max_window_layers", "use_sliding_window", "attention_k_eq_v", "hybrid_override_pattern",
              "expand", "time_step_rank", "hidden_size_per_head")
# Read for every model by vLLM's config convertor (transformers_utils/model_arch_config_convertor.py
# get_head_size, get_total_num_kv_heads, derive_max_model_len), whatever its model file reads.
_ALWAYS_READ = frozenset({"head_dim", "hidden_size_per_head", "num_key_value_heads", "max_position_embeddings"})
_CONFIG_NAMES = frozenset({"config", "hf_config", "text_config", "hf_text_config", "model_config"})


class SourceError(Exception):
    pass


@dataclass
class Module:
    name: str                      # dotted
    path: str                      # relative to the release root
    tree: ast.Module
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)   # local -> (module, name)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    variables: dict[str, list[ast.stmt]] = field(default_factory=dict)   # module-level assignments


class Release:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, Module] = {}
        self._kinds: dict[tuple[str, str, str], tuple[str, str | None, str | None] | None] = {}
        for top in _INDEXED:
            for path in sorted((root / top).rglob("*.py")):
                rel = path.relative_to(root).as_posix()
                dotted = rel[:-3].replace("/", ".")
                if dotted.endswith(".__init__"):
                    dotted = dotted[: -len(".__init__")]
                try:
                    tree = ast.parse(path.read_text(encoding="utf-8"))
                except SyntaxError:
                    continue
                self.modules[dotted] = self._module(dotted, rel, tree)

    @staticmethod
    def _module(dotted: str, rel: str, tree: ast.Module) -> Module:
        mod = Module(dotted, rel, tree)
        package = dotted if rel.endswith("__init__.py") else dotted.rsplit(".", 1)[0]
        for node in ast.walk(tree):   # imports inside functions count too (lazy imports)
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - node.level + 1]
                    base = ".".join(parts + ([node.module] if node.module else []))
                for alias in node.names:
                    mod.imports[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    mod.imports[alias.asname or alias.name.split(".")[0]] = (alias.name, None)
        top: list[ast.stmt] = list(tree.body)
        while top:
            node = top.pop(0)
            if isinstance(node, ast.ClassDef):
                mod.classes[node.name] = node
            elif isinstance(node, ast.FunctionDef):
                mod.functions[node.name] = node
            elif isinstance(node, (ast.If, ast.Try)):   # `if TYPE_CHECKING: X = A else: X = f(A)`
                top.extend(node.body + node.orelse)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        mod.variables.setdefault(target.id, []).append(node)
        return mod

    def resolve(self, module: str, name: str, depth: int = 0) -> tuple[str, str, str] | None:
        """(module, name, "class"|"function") that `name` means in `module`, following imports."""
        mod = self.modules.get(module)
        if mod is None or depth > 8:
            return None
        if name in mod.classes:
            return module, name, "class"
        if name in mod.functions:
            return module, name, "function"
        if name in mod.variables:
            return module, name, "variable"
        target = mod.imports.get(name)
        if target is None:
            return None
        source, imported = target
        if imported is None:
            return None
        if f"{source}.{imported}" in self.modules:   # `from pkg import module`
            return None
        return self.resolve(source, imported, depth + 1)

    def node(self, ref: tuple[str, str, str]) -> ast.AST:
        mod = self.modules[ref[0]]
        if ref[2] == "variable":
            return ast.Module(body=list(mod.variables[ref[1]]), type_ignores=[])
        return mod.classes[ref[1]] if ref[2] == "class" else mod.functions[ref[1]]

    def bases(self, ref: tuple[str, str, str]) -> list[tuple[str, str, str]]:
        out = []
        node = self.node(ref)
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = _dotted(base)
                if name:
                    found = self.resolve(ref[0], name.split(".")[-1] if "." not in name else name.split(".")[0])
                    if found and found[2] == "class":
                        out.append(found)
                    elif found and found[2] == "variable":   # `Base = as_embedding_model(LlamaForCausalLM)`
                        out.extend(f for n in ast.walk(self.node(found)) if isinstance(n, ast.Name)
                                   and (f := self.resolve(found[0], n.id)) and f[2] == "class")
        return out

    def mro(self, ref: tuple[str, str, str]) -> Iterator[tuple[str, str, str]]:
        seen, queue = set(), [ref]
        while queue:
            cur = queue.pop(0)
            if cur in seen:
                continue
            seen.add(cur)
            yield cur
            queue.extend(self.bases(cur))

    def base_names(self, ref: tuple[str, str, str]) -> set[str]:
        names = set()
        for cur in self.mro(ref):
            node = self.node(cur)
            names.add(cur[1])
            if isinstance(node, ast.ClassDef):
                names.update(n for b in node.bases if (n := _dotted(b)))
        return {n.split(".")[-1] for n in names}

    def cache_kind(self, ref: tuple[str, str, str]) -> tuple[str, str | None, str | None] | None:
        """(kind, state dtype rule, spec class) of a class holding a cache, None otherwise."""
        if ref not in self._kinds:
            self._kinds[ref] = self._cache_kind(ref)
        return self._kinds[ref]

    def _cache_kind(self, ref: tuple[str, str, str]) -> tuple[str, str | None, str | None] | None:
        """(kind, state dtype rule, the class below the kind's own that redefines get_kv_cache_spec)."""
        backend: str | None = None
        spec_class: str | None = None
        dtype: str | None = None
        for cur in self.mro(ref):
            node = self.node(cur)
            if not isinstance(node, ast.ClassDef):
                continue
            methods = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
            if dtype is None and "get_state_dtype" in methods:
                dtype = _calculator_rule(methods["get_state_dtype"])
            if backend is None and "mamba_type" in methods:
                backend = _mamba_backend(methods["mamba_type"])
            if spec_class is None and "get_kv_cache_spec" in methods \
                    and cur[1] not in ("AttentionLayerBase", "MambaBase"):
                spec_class = cur[1]
        if backend:   # a Mamba backend names the kind; a subclass may still reshape its spec
            return backend, dtype, spec_class
        return (spec_class, dtype, None) if spec_class else None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    return None


def _mamba_backend(fn: ast.FunctionDef) -> str | None:
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Attribute):
            return node.value.attr
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
            return str(node.value.value).upper()
    return None


def _calculator_rule(fn: ast.FunctionDef) -> str | None:
    for node in ast.walk(fn):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "MambaStateDtypeCalculator":
            return node.attr
    return None


@dataclass
class Found:
    kinds: dict[str, set[str]] = field(default_factory=dict)    # kind -> cache classes
    dtypes: set[str] = field(default_factory=set)
    spec_classes: set[str] = field(default_factory=set)   # kind:class whose get_kv_cache_spec it runs
    features: set[str] = field(default_factory=set)
    fields: set[str] = field(default_factory=set)
    files: set[str] = field(default_factory=set)


def _config_fields(node: ast.AST) -> Iterator[str]:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr[:1].islower():
            owner = sub.value
            name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
            if name in _CONFIG_NAMES and not sub.attr.startswith("_") and sub.attr not in ("get", "to_dict"):
                yield sub.attr
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in ("getattr", "hasattr"):
            if len(sub.args) >= 2 and isinstance(sub.args[1], ast.Constant) and isinstance(sub.args[1].value, str):
                owner = sub.args[0]
                name = owner.attr if isinstance(owner, ast.Attribute) else owner.id if isinstance(owner, ast.Name) else ""
                if name in _CONFIG_NAMES:
                    yield sub.args[1].value


def explore(release: Release, start: tuple[str, str, str]) -> Found:
    found = Found()
    seen: set[tuple[str, str, str]] = set()
    queue = [start]
    while queue:
        ref = queue.pop()
        if ref in seen:
            continue
        seen.add(ref)
        if ref[2] == "class":
            cache = release.cache_kind(ref)
            if cache is not None and ref != start:
                found.kinds.setdefault(cache[0], set()).add(ref[1])
                if cache[1]:
                    found.dtypes.add(f"{cache[0]}:{cache[1]}")
                if cache[2]:
                    found.spec_classes.add(f"{cache[0]}:{cache[2]}")
                continue
        node = release.node(ref)
        mod = release.modules[ref[0]]
        found.files.add(mod.path)
        if ref[0].startswith(("vllm.model_executor.models", "vllm.models")):
            found.fields.update(_config_fields(node))
        for sub in _walk_built(node):
            if isinstance(sub, ast.Call):
                _attention_call(release, ref[0], sub, found)
            name = sub.id if isinstance(sub, ast.Name) else None
            if name is None:
                continue
            if name == "init_vllm_registered_model":
                found.features.add("delegates_to_language_model")
            target = release.resolve(ref[0], name)
            if target is not None and target not in seen and target[0].startswith(_FOLLOWED):
                queue.append(target)
    return found


# Modules whose classes can build a model's layers; quantization and MoE kernels only check types.
_FOLLOWED = ("vllm.model_executor.models", "vllm.models", "vllm.model_executor.layers.attention",
             "vllm.model_executor.layers.mamba", "vllm.model_executor.layers.mla")


def _walk_built(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk, less the arguments of isinstance/issubclass: a type checked is not a layer built."""
    stack = [node]
    while stack:
        cur = stack.pop()
        yield cur
        if isinstance(cur, ast.Call) and isinstance(cur.func, ast.Name) and cur.func.id in ("isinstance", "issubclass"):
            continue
        stack.extend(ast.iter_child_nodes(cur))


def _attention_call(release: Release, module: str, call: ast.Call, found: Found) -> None:
    name = _dotted(call.func)
    if not name or "." in name:
        return
    target = release.resolve(module, name)
    # `attn_cls(...)`, a local name for an attention class, is not resolved: only attention
    # constructors take these keywords, so a call naming them counts either way.
    if target is not None and (target[2] != "class" or release.cache_kind(target) is None):
        return
    for kw in call.keywords:
        if kw.arg in _ATTN_KWARGS and not (isinstance(kw.value, ast.Constant) and kw.value.value is None):
            found.features.add(_ATTN_KWARGS[kw.arg])
        if kw.arg == "attn_type":
            attr = _dotted(kw.value) or ""
            kind = _ATTN_TYPES.get(attr.split(".")[-1])
            if kind:
                found.features.add(kind)


def read_registry(root: Path) -> tuple[dict[str, tuple[str, str, str]], dict[str, str]]:
    """arch -> (group, module, class) and arch -> last release (previously supported)."""
    tree = ast.parse((root / _REGISTRY).read_text(encoding="utf-8"))
    groups: dict[str, ast.Dict] = {}
    previous: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in _GROUPS and isinstance(node.value, ast.Dict):
                groups[name] = node.value
            elif name == "_PREVIOUSLY_SUPPORTED_MODELS" and isinstance(node.value, ast.Dict):
                previous = ast.literal_eval(node.value)
    if "_TEXT_GENERATION_MODELS" not in groups:
        raise SourceError(f"{_REGISTRY}: no _TEXT_GENERATION_MODELS")
    archs: dict[str, tuple[str, str, str]] = {}
    for group in _GROUPS:
        if group not in groups:
            continue
        for key, value in zip(groups[group].keys, groups[group].values, strict=True):
            if key is None:   # a ** merge
                continue
            arch = ast.literal_eval(key)
            module, cls = ast.literal_eval(value)[:2]
            archs.setdefault(arch, (group.strip("_").lower().removesuffix("_models"), module, cls))
    return archs, previous


class Transformers:
    """transformers' config classes, read with ast: arch -> model types -> config class defaults."""

    def __init__(self, root: Path | None) -> None:
        self.arch_types: dict[str, set[str]] = {}
        self.config_class: dict[str, str] = {}
        self.defaults: dict[str, dict[str, object]] = {}     # config class -> field -> default
        self.sub_configs: dict[str, list[str]] = {}
        self.version = ""
        if root is None:
            return
        init = (root / "__init__.py").read_text(encoding="utf-8")
        self.version = next((line.split('"')[1] for line in init.splitlines() if line.startswith("__version__")), "")
        for name in ("models/auto/modeling_auto.py", "models/auto/auto_mappings.py", "models/auto/configuration_auto.py"):
            path = root / name
            if not path.exists():
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                        and isinstance(node.targets[0], ast.Name) and node.targets[0].id.endswith("_NAMES")):
                    continue
                pairs = node.value.args[0] if node.value.args else None
                if not isinstance(pairs, (ast.List, ast.Tuple)):
                    continue
                for pair in pairs.elts:
                    try:
                        model_type, value = ast.literal_eval(pair)
                    except (ValueError, TypeError):
                        continue
                    if node.targets[0].id == "CONFIG_MAPPING_NAMES":
                        self.config_class[model_type] = value
                        continue
                    for arch in (value,) if isinstance(value, str) else value:
                        self.arch_types.setdefault(arch, set()).add(model_type)
        for path in sorted((root / "models").glob("*/configuration_*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.defaults[node.name] = _class_defaults(node)
                    self.sub_configs[node.name] = _sub_configs(node)

    def defaults_for(self, arch: str, fields: set[str]) -> dict[str, object]:
        out: dict[str, object] = {}
        for model_type in sorted(self.arch_types.get(arch, ())):
            cls = self.config_class.get(model_type)
            for name in [cls, *self.sub_configs.get(cls or "", [])] if cls else []:
                for key, value in self.defaults.get(name, {}).items():
                    if key in fields and value is not None and key.startswith(_KV_FIELDS):
                        out.setdefault(key, value)
        return dict(sorted(out.items()))


def _class_defaults(node: ast.ClassDef) -> dict[str, object]:
    out: dict[str, object] = {}
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            try:
                out[stmt.target.id] = ast.literal_eval(stmt.value)
            except ValueError:
                continue
    return out


def _sub_configs(node: ast.ClassDef) -> list[str]:
    for stmt in node.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else stmt.target if isinstance(stmt, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "sub_configs" and isinstance(stmt.value, ast.Dict):
            return [n for v in stmt.value.values if (n := _dotted(v))]
    return []


def architectures(root: Path, transformers: Transformers) -> dict[str, dict[str, object]]:
    release = Release(root)
    archs, previous = read_registry(root)
    out: dict[str, dict[str, object]] = {}
    for arch, (group, module, cls) in sorted(archs.items()):
        dotted = module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"
        ref = release.resolve(dotted, cls)
        mod = release.modules.get(dotted)
        entry: dict[str, object] = {"group": group, "source": mod.path if mod else dotted, "class": cls}
        if module == "transformers":
            entry["backend"] = "transformers"
        if ref is None or ref[2] != "class":
            entry["kinds"] = ()
            entry["features"] = ("class_not_found",)
            out[arch] = entry
            continue
        found = explore(release, ref)
        interfaces = {_INTERFACES[n] for n in release.base_names(ref) if n in _INTERFACES}
        entry["kinds"] = tuple(sorted(found.kinds))
        entry["layer_classes"] = {k: tuple(sorted(v)) for k, v in sorted(found.kinds.items()) if v != {k}}
        entry["state_dtypes"] = tuple(sorted(found.dtypes))
        entry["spec_classes"] = tuple(sorted(found.spec_classes))
        entry["features"] = tuple(sorted(found.features | interfaces))
        entry["config_defaults"] = transformers.defaults_for(arch, found.fields | _ALWAYS_READ)
        entry["model_types"] = tuple(sorted(transformers.arch_types.get(arch, ())))
        out[arch] = entry
    for arch, last in sorted(previous.items()):
        out.setdefault(arch, {"group": "previously_supported", "source": _REGISTRY, "last_release": last,
                              "kinds": (), "features": ()})
    return out


_ENTRY_FIELDS = ("group", "source", "class", "kinds", "features", "spec_classes", "backend", "last_release")
_DETAIL_FIELDS = ("layer_classes", "state_dtypes", "config_defaults", "model_types")


def _changes(tables: dict[str, dict[str, object]]) -> tuple[str, dict[str, object],
                                                              list[tuple[str, dict[str, object], tuple[str, ...]]]]:
    """(oldest release, its table, then per later release the entries it adds or changes and the
    names it drops)."""
    releases = sorted(tables, key=lambda r: tuple(int(p) for p in r.split(".")))
    out = []
    for before, release in zip(releases, releases[1:], strict=False):
        old, new = tables[before], tables[release]
        out.append((release, {k: v for k, v in sorted(new.items()) if old.get(k) != v},
                    tuple(sorted(k for k in old if k not in new))))
    return releases[0], tables[releases[0]], out


def render(tables: dict[str, dict[str, dict[str, object]]], transformers_version: str) -> tuple[str, str]:
    """(generated/architectures.py, generated/architecture_details.py): what the planner reads on
    every plan, as tuples that load fast, and the details (cache classes, state dtypes, config-class
    defaults) beside it; each the oldest release's table and every later release's changes."""
    head = (
        '"""The KV cache layers vLLM builds for every architecture it registers, release by release\n'
        "(generated by scripts/gen_vllm_architectures.py from each release's own source; do not edit by\n"
        "hand; read through kvwatch/vllm_releases/architectures.py). Per architecture: the registry group,\n"
        "the model file (vLLM <release>, <source>), the class, the layer kinds its classes can build (a\n"
        "cache class, or a Mamba backend), the variants its attention constructors use and its interfaces,\n"
        "the class whose get_kv_cache_spec each Mamba kind runs, the backend (transformers) and, for a\n"
        "dropped architecture, the last release that served it. The oldest release's table, then per\n"
        "later release the entries it adds or changes and the names it drops. The cache classes, state\n"
        "dtypes and config-class defaults are in architecture_details.py.\n"
        'How kvwatch handles each kind is in kvwatch/planner/architecture_kinds.py."""\n'
        "from __future__ import annotations\n\n"
        "from kvwatch.vllm_releases.architecture_entry import ArchitectureEntry as E\n\n"
    )
    entries = {release: {arch: "E(" + ", ".join(repr(_field(entry, f)) for f in _ENTRY_FIELDS) + ")"
                         for arch, entry in table.items()} for release, table in tables.items()}
    base_release, base, changes = _changes(entries)   # type: ignore[arg-type]
    lines = [head, f'BASE_RELEASE = "{base_release}"\n\n', "BASE: dict[str, E] = {\n"]
    lines += [f"    {arch!r}: {text},\n" for arch, text in sorted(base.items())]
    lines.append("}\n\nCHANGES: dict[str, tuple[dict[str, E], tuple[str, ...]]] = {\n")
    for release, changed, dropped in changes:
        lines.append(f'    "{release}": ({{\n')
        lines += [f"        {arch!r}: {text},\n" for arch, text in changed.items()]
        lines.append(f"    }}, {dropped!r}),\n")
    lines.append("}\n")
    details = {release: {arch: {f: entry[f] for f in _DETAIL_FIELDS if entry.get(f)} for arch, entry in table.items()
                         if any(entry.get(f) for f in _DETAIL_FIELDS)} for release, table in tables.items()}
    d_base_release, d_base, d_changes = _changes(details)   # type: ignore[arg-type]
    detail_head = (
        '"""Details of kvwatch/vllm_releases/architectures.py (generated by scripts/gen_vllm_architectures.py;\n'
        "do not edit by hand; read through kvwatch/vllm_releases/architecture_details.py): per release and\n"
        "architecture, the cache classes behind each kind, the MambaStateDtypeCalculator rule of each\n"
        "recurrent kind, the transformers model types that name the architecture, and the defaults\n"
        f"transformers {transformers_version or '(not read)'} gives the KV-shaping config fields the model's "
        "classes read, when\nconfig.json leaves them out. The oldest release's, then each later release's "
        "changes. Not read on the plan path.\"\"\"\n"
        "from __future__ import annotations\n\n"
        "from typing import Any\n\n"
        f'BASE_RELEASE = "{d_base_release}"\n\n'
        "BASE: dict[str, dict[str, Any]] = "
    )
    detail = detail_head + pprint.pformat(d_base, width=110, sort_dicts=True) + "\n\n"
    detail += "CHANGES: dict[str, tuple[dict[str, dict[str, Any]], tuple[str, ...]]] = " + pprint.pformat(
        {release: (changed, dropped) for release, changed, dropped in d_changes}, width=110, sort_dicts=True) + "\n"
    return "".join(lines), detail


def _field(entry: dict[str, object], name: str) -> object:
    value = entry.get(name)
    if name in ("kinds", "features", "spec_classes"):
        return tuple(value) if value else ()   # type: ignore[call-overload]
    return value if value is not None else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src_root", nargs="?", default=os.environ.get("KVWATCH_VLLM_SRC"))
    parser.add_argument("--transformers", type=Path, default=None)
    parser.add_argument("--releases", default=",".join(RELEASES))
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if not args.src_root:
        parser.error("give SRC_ROOT (or set KVWATCH_VLLM_SRC)")
    transformers = Transformers(args.transformers)
    tables = {}
    for version in args.releases.split(","):
        root = Path(args.src_root) / version
        if not (root / _REGISTRY).exists():
            print(f"{version}: no {_REGISTRY} under {root}", file=sys.stderr)
            return 2
        tables[version] = architectures(root, transformers)
    outputs = dict(zip((OUT, DETAILS_OUT), render(tables, transformers.version), strict=True))
    if args.check:
        stale = [p for p, text in outputs.items() if p.read_text(encoding="utf-8") != text]
        for path in stale:
            print(f"{path.relative_to(ROOT)} differs from what the sources give", file=sys.stderr)
        return 1 if stale else 0
    for path, text in outputs.items():
        path.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}, {DETAILS_OUT.relative_to(ROOT)}: "
          + ", ".join(f"{v} {len(t)} architectures" for v, t in tables.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
