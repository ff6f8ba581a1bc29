"""The engine command line: read the flags kvwatch plans with, write corrected ones back.

Works on argv exactly as the user runs it: `vllm serve MODEL ...` or
`python -m vllm.entrypoints.openai.api_server --model MODEL ...`, with
`--flag value` and `--flag=value`. Rewrites keep every other token untouched.

The command is read as one release's `vllm serve` parser reads it (serve_options.py, from that
release's generated option table): its options and their spellings (from 0.33 `--disable-X` turns
`--enable-X` off), how many values each takes, its choices and value types, and its unique and
ambiguous prefixes. What that parser refuses is `refusal()`; a refusal that leaves the command
unreadable (an ambiguous prefix, a missing or invalid value) is one CommandError.
"""
from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from kvwatch.errors import CommandError
from kvwatch.planner.encoder_held import mm_limits
from kvwatch.planner.serve_options import (
    ReleaseOptions,
    ServeOption,
    convert_value,
    invalid_value,
    release_options,
    vllm_spelling,
)
from kvwatch.planner.units import parse_vllm_int
from kvwatch.values.json_text import parse_json
from kvwatch.values.versions import parse_version
from kvwatch.vllm_releases import DEFAULT_RELEASE
from kvwatch.vllm_releases.gdn_checkpoint import requested_gdn_prefill_backend
from kvwatch.vllm_releases.release_defaults import defaults_for

# Flags whose value is a count or a size: vLLM wants them positive (0 or less is a typo).
_COUNT_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size", "--max-num-seqs",
                "--max-num-batched-tokens", "--num-gpu-blocks-override", "--max-model-len", "--kv-cache-memory-bytes")
_HUMAN_FLAGS = frozenset({"--max-num-batched-tokens", "--max-model-len", "--kv-cache-memory-bytes"})
_MAX_COUNT = 1 << 60
_API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")


@dataclass(frozen=True)
class ParserRefusal:
    """Why the release's `vllm serve` parser refuses the command, in argparse's words."""
    complaint: str   # 'ambiguous', 'expected argument', 'ignored explicit argument', 'invalid value',
    #                  'invalid choice', 'unrecognized'
    token: str
    message: str


@dataclass(frozen=True)
class _Occurrence:
    start: int
    end: int                      # exclusive
    option: ServeOption
    spelling: str
    values: tuple[str, ...]       # what the option consumed (empty for a switch)


@dataclass(frozen=True)
class _Reading:
    occurrences: tuple[_Occurrence, ...]
    refusals: tuple[ParserRefusal, ...]   # in the order the parser meets them


def _read(argv: tuple[str, ...], start: int, options: ReleaseOptions) -> _Reading:
    """argv from `start` as argparse reads it: first every token classified (an ambiguous prefix is
    refused there, wherever it stands), then each option consuming its values by nargs."""
    tokens = [vllm_spelling(t) for t in argv]
    matches = [options.match(t) if i >= start else None for i, t in enumerate(tokens)]
    refusals: list[ParserRefusal] = []
    for m in matches:
        if m is not None and m.ambiguous:
            refusals.append(ParserRefusal("ambiguous", m.spelling, f"ambiguous option: {m.spelling} could match "
                                                                    f"{', '.join(m.ambiguous)}"))
            break
    found: list[_Occurrence] = []
    unknown: list[str] = []
    i = start
    while i < len(tokens):
        m = matches[i]
        if m is None or m.ambiguous:
            i += 1
            continue
        if m.option is None:
            unknown.append(tokens[i])
            i += 1
            continue
        option, label = m.option, f"argument {m.spelling}"
        if not option.takes_value:
            if m.explicit is not None:
                refusals.append(ParserRefusal("ignored explicit argument", tokens[i],
                                              f"{label}: ignored explicit argument {m.explicit!r}"))
            found.append(_Occurrence(i, i + 1, option, m.spelling, ()))
            i += 1
            continue
        values: tuple[str, ...]
        if m.explicit is not None:
            values, end = (m.explicit,), i + 1
        else:
            free = 0
            while i + 1 + free < len(tokens) and matches[i + 1 + free] is None:
                free += 1
            want = {None: 1, "?": min(free, 1), "+": max(free, 1), "*": free}.get(option.nargs, option.nargs)
            if free < want:
                refusals.append(ParserRefusal("expected argument", tokens[i], f"{label}: expected "
                                              f"{'one argument' if want == 1 else 'at least one argument'}"))
                i += 1
                continue
            values, end = tuple(tokens[i + 1:i + 1 + want]), i + 1 + want
        complaint = next(filter(None, (invalid_value(option, v) for v in values)), None)
        if complaint is not None:
            said = "invalid choice" if complaint.startswith("invalid choice") else "invalid value"
            refusals.append(ParserRefusal(said, tokens[i], f"{label}: {complaint}"))
        found.append(_Occurrence(i, end, option, m.spelling, values))
        i = end
    if unknown:
        refusals.append(ParserRefusal("unrecognized", unknown[0], f"unrecognized arguments: {' '.join(unknown)}"))
    return _Reading(tuple(found), tuple(refusals))


# The parser refusals that leave kvwatch unable to read the command. The others are reported by
# refusal() while the reading goes on: an option or a choice the table lacks may be a newer
# release's, and `--switch=True` (LLM() keywords written as flags) still says what was meant.
_UNREADABLE = ("ambiguous", "expected argument", "invalid value")


_CUDAGRAPH_SIZE_FLAGS = ("--cudagraph-capture-sizes", "--max-cudagraph-capture-size")
_CUDAGRAPH_SIZE_KEYS = frozenset({
    "cudagraph_capture_sizes", "max_cudagraph_capture_size", "cudagraph_mode",
    "prefill_cudagraph_capture_token_sizes", "max_prefill_cudagraph_capture_tokens",
    "decode_cudagraph_capture_request_sizes", "max_decode_cudagraph_capture_requests",
    "max_decode_cudagraph_capture_tokens"})


@dataclass(frozen=True)
class EngineSettings:
    """The flags the planner needs, typed, with vLLM's defaults where it has one."""

    model: str
    block_size: int | None
    kv_cache_dtype: str
    dtype: str
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None
    max_model_len: int | None
    max_num_seqs: int | None
    max_num_batched_tokens: int | None
    enable_chunked_prefill: bool | None      # None: vLLM's default (on)
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int                  # engine cores, each with a KV cache of its own
    num_gpu_blocks_override: int | None
    attention_backend: str | None
    host: str
    port: int
    max_model_len_auto: bool = False          # --max-model-len auto / -1: vLLM fits it to the KV cache
    disable_hybrid_kv_cache_manager: bool = False
    enable_prefix_caching: bool | None = None  # None: vLLM's default
    mamba_cache_dtype: str = "auto"
    mamba_ssm_cache_dtype: str = "auto"
    enforce_eager: bool = False
    compilation_off: bool = False   # no torch.compile in the profile (planner/uma_host.py): eager, -O 0, mode 0
    enable_expert_parallel: bool = False     # --enable-expert-parallel: each rank holds whole experts
    gpu_memory_utilization_given: bool = False   # False: the value above is a default (the version's decides)
    quantization: str | None = None          # --quantization: what the engine does to the weights (fp8, gguf, ...)
    moe_backend: str | None = None           # --moe-backend (0.17+): the MoE kernel asked for (None: vLLM's "auto")
    enable_lora: bool = False                # --enable-lora: adapter slots with the weights (planner/lora_slots.py)
    max_loras: int | None = None             # --max-loras (None: vLLM's 1)
    max_lora_rank: int | None = None         # --max-lora-rank (None: vLLM's 16)
    lora_dtype: str | None = None            # --lora-dtype (None or "auto": the model's)
    fully_sharded_loras: bool = False        # --fully-sharded-loras: slots sharded another way, not sized
    cpu_offload_gb: float = 0.0              # --cpu-offload-gb: GiB of weights per GPU kept in host memory
    gdn_prefill_backend: str | None = None   # --gdn-prefill-backend (None: vLLM's "auto")
    mamba_cache_mode: str | None = None      # --mamba-cache-mode (None: the release's default)
    kv_cache_dtype_skip_layers: tuple[str, ...] = ()   # layer indices or "sliding_window" kept unquantized
    enable_extensible_kv_cache: bool | None = None   # 0.34+ --[no-]enable-extensible-kv-cache (None: vLLM decides)
    cudagraph_sizes_given: bool = False      # a flag or --compilation-config sets CUDA graph capture sizes
    # --speculative-config's method and num_speculative_tokens (None, 0: no speculative decoding)
    speculative_method: str | None = None
    num_speculative_tokens: int = 0
    speculative_config: bool = False   # --speculative-config is a JSON object (with or without a method)
    # len(draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids) in it (0: none; planner/hidden_states.py)
    speculative_aux_layers: int = 0
    runner: str = "auto"     # --runner (0.10.2+): generate, pooling, draft; auto: vLLM decides (planner/pooling_run.py)
    convert: str = "auto"    # --convert (0.10.2+): embed, classify, ... ; auto: vLLM decides
    skip_mm_profiling: bool = False   # --skip-mm-profiling (0.10+): no encoder pass nor encoder cache in the profile
    # --limit-mm-per-prompt's items per modality, as (modality, count) pairs given (planner/encoder_held.py)
    mm_limits: tuple[tuple[str, int], ...] = ()
    language_model_only: bool = False   # --language-model-only (0.17+): every modality's limit is 0 (planner/tower_skip.py)


@dataclass(frozen=True)
class EngineCommand:
    argv: tuple[str, ...]
    # The release whose parser reads argv: a release of kvwatch's option table (vllm_releases.resolve
    # picks it for the release asked for); by default the one kvwatch's other facts were read from.
    release: str = field(default=str(DEFAULT_RELEASE))

    @classmethod
    def parse(cls, argv: Sequence[str], release: str | None = None) -> EngineCommand:
        if not argv:
            raise CommandError("no engine command given (expected e.g. `-- vllm serve MODEL ...`)")
        command = cls(tuple(argv), release or str(DEFAULT_RELEASE))
        _ = command.model  # fail early, with one clear line, when no model is named
        return command

    # -- reading -----------------------------------------------------------
    @property
    def options(self) -> ReleaseOptions:
        return release_options(self.release)

    def _serve_position(self) -> int | None:
        """Index of `serve` in `vllm serve ...` (or of the API server module after `-m`), if any."""
        for i, token in enumerate(self.argv):
            if token == "serve" and (i == 0 or posixpath.basename(self.argv[i - 1]) in ("vllm", "main")
                                     or self.argv[i - 1].endswith("vllm.entrypoints.cli.main")):
                return i
            if token in _API_SERVER_MODULES and i > 0 and self.argv[i - 1] == "-m":
                return i
        return None

    def _model_position(self) -> int | None:
        """Index of the positional MODEL of `vllm serve MODEL`, if any."""
        serve = self._serve_position()
        if serve is None or self.argv[serve] != "serve":
            return None
        nxt = serve + 1
        return nxt if nxt < len(self.argv) and not self.argv[nxt].startswith("-") else None

    @cached_property
    def _reading(self) -> _Reading:
        serve = self._serve_position()
        reading = _read(self.argv, 0 if serve is None else serve + 1, self.options)
        if serve is None:   # an unknown launcher: its own words are not vLLM's unknown options
            reading = _Reading(reading.occurrences, tuple(r for r in reading.refusals if r.complaint != "unrecognized"))
        return reading

    def refusal(self) -> ParserRefusal | None:
        """The first reason the release's parser refuses argv (argparse exits on it), if any."""
        return self._reading.refusals[0] if self._reading.refusals else None

    def _readable(self) -> _Reading:
        refusal = next((r for r in self._reading.refusals if r.complaint in _UNREADABLE), None)
        if refusal is not None:
            raise CommandError(f"vLLM {self.release} refuses this command line: {refusal.message}")
        return self._reading

    def _spans(self, flag: str) -> list[_Occurrence]:
        name = self.options.name_of(flag)
        return [o for o in self._readable().occurrences if o.option.name == name]

    def values(self, flag: str) -> list[str]:
        """Every value given for `flag`, in order (argparse keeps the last)."""
        out = []
        for o in self._spans(flag):
            if not o.values:
                raise CommandError(f"{o.spelling} needs a value")
            out.append(o.values[-1])
        return out

    def get(self, flag: str) -> str | None:
        values = self.values(flag)
        return values[-1] if values else None

    def has(self, flag: str) -> bool:
        return bool(self._spans(flag))

    @property
    def model(self) -> str:
        explicit = self.get("--model")
        if explicit:
            return explicit
        pos = self._model_position()
        if pos is not None:
            return self.argv[pos]
        raise CommandError("the engine command names no model (`vllm serve MODEL` or `--model MODEL`)")

    def settings(self) -> EngineSettings:
        auto_len = (self.get("--max-model-len") or "").strip().lower() in ("auto", "-1")
        for flag in _COUNT_FLAGS:
            if flag == "--max-model-len" and auto_len:
                continue   # vLLM fits the longest length the KV cache holds
            value = self._int(flag, human=flag in _HUMAN_FLAGS)
            if value is not None and not 0 < value <= _MAX_COUNT:
                raise CommandError(f"{flag} {self.get(flag)!r}: expected a positive whole number")
        return EngineSettings(
            model=self.model,
            block_size=self._int("--block-size"),
            kv_cache_dtype=self.get("--kv-cache-dtype") or "auto",
            dtype=self.get("--dtype") or "auto",
            # without the flag: the default of the release that reads the command (one source: its table)
            gpu_memory_utilization=self._float("--gpu-memory-utilization",
                                               defaults_for(parse_version(self.release)).gpu_memory_utilization),
            kv_cache_memory_bytes=self._int("--kv-cache-memory-bytes", human=True),
            max_model_len=None if auto_len else self._int("--max-model-len", human=True),
            max_num_seqs=self._int("--max-num-seqs"),
            max_num_batched_tokens=self._int("--max-num-batched-tokens", human=True),
            enable_chunked_prefill=self._switch("--enable-chunked-prefill"),
            tensor_parallel_size=self._int("--tensor-parallel-size") or 1,
            pipeline_parallel_size=self._int("--pipeline-parallel-size") or 1,
            data_parallel_size=self._int("--data-parallel-size") or 1,
            num_gpu_blocks_override=self._int("--num-gpu-blocks-override"),
            attention_backend=self.get("--attention-backend"),
            host=self.get("--host") or "127.0.0.1",
            port=self._int("--port") or 8000,
            max_model_len_auto=auto_len,
            disable_hybrid_kv_cache_manager=bool(self._switch("--disable-hybrid-kv-cache-manager")),
            enable_prefix_caching=self._switch("--enable-prefix-caching"),
            mamba_cache_dtype=self.get("--mamba-cache-dtype") or "auto",
            mamba_ssm_cache_dtype=self.get("--mamba-ssm-cache-dtype") or "auto",
            enforce_eager=bool(self._switch("--enforce-eager")),
            compilation_off=bool(self._switch("--enforce-eager")) or self._compilation_off(),
            enable_expert_parallel=bool(self._switch("--enable-expert-parallel")),
            gpu_memory_utilization_given=self.get("--gpu-memory-utilization") is not None,
            quantization=self.get("--quantization"),
            moe_backend=self.get("--moe-backend"),
            enable_lora=bool(self._switch("--enable-lora")),
            max_loras=self._positive_int("--max-loras"),
            max_lora_rank=self._positive_int("--max-lora-rank"),
            lora_dtype=self.get("--lora-dtype"),
            fully_sharded_loras=bool(self._switch("--fully-sharded-loras")),
            cpu_offload_gb=self._nonnegative_float("--cpu-offload-gb"),
            gdn_prefill_backend=requested_gdn_prefill_backend(self.get("--gdn-prefill-backend"),
                                                              self._additional_config()),
            kv_cache_dtype_skip_layers=self._last_values("--kv-cache-dtype-skip-layers"),
            mamba_cache_mode=self.get("--mamba-cache-mode"),
            enable_extensible_kv_cache=self._switch("--enable-extensible-kv-cache"),
            cudagraph_sizes_given=self._cudagraph_sizes_given(),
            runner=self.get("--runner") or "auto",
            convert=self.get("--convert") or "auto",
            skip_mm_profiling=bool(self._switch("--skip-mm-profiling")),
            mm_limits=mm_limits(self.get("--limit-mm-per-prompt")),
            language_model_only=bool(self._switch("--language-model-only")),
            **self._speculative(),
        )

    def _speculative(self) -> dict[str, Any]:
        """--speculative-config's method and num_speculative_tokens, where it is a JSON object."""
        value = self.get("--speculative-config")
        try:
            parsed = parse_json(value) if value else None
        except ValueError:
            return {}
        if not isinstance(parsed, dict):
            return {}
        tokens = parsed.get("num_speculative_tokens")
        method = parsed.get("method")
        draft = parsed.get("draft_model_config")
        hf_config = draft.get("hf_config") if isinstance(draft, dict) else None
        aux = hf_config.get("eagle_aux_hidden_state_layer_ids") if isinstance(hf_config, dict) else None
        return {"speculative_method": method if isinstance(method, str) else None, "speculative_config": True,
                "num_speculative_tokens": tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else 0,
                "speculative_aux_layers": len(aux) if isinstance(aux, list) else 0}

    def _compilation_off(self) -> bool:
        """--optimization-level 0 (vLLM 0.12+), or --compilation-config's mode (0.11.2+) or level set to 0
        (vLLM 0.11.2, vllm/config/compilation.py:609-618 maps level to mode): vLLM compiles nothing."""
        if (self.get("--optimization-level") or "").strip() == "0":
            return True
        value = (self.get("--compilation-config") or "").strip()
        try:
            parsed = parse_json(value) if value else None
        except ValueError:
            return False
        if isinstance(parsed, dict):
            parsed = parsed.get("mode", parsed.get("level"))
        return parsed == 0 and not isinstance(parsed, bool)

    def _cudagraph_sizes_given(self) -> bool:
        """Whether the command sets CUDA graph capture sizes: the two flags, or the keys of
        --compilation-config that size the graphs or choose which are captured (vLLM 0.34.0,
        vllm/config/compilation.py:699 cudagraph_mode, :762-801 the prefill and decode sizes)."""
        if any(self.get(flag) is not None for flag in _CUDAGRAPH_SIZE_FLAGS):
            return True
        value = self.get("--compilation-config")
        try:
            parsed = parse_json(value) if value else None
        except ValueError:
            return False
        return isinstance(parsed, dict) and not _CUDAGRAPH_SIZE_KEYS.isdisjoint(parsed)

    def _converted(self, flag: str) -> object:
        """The value vLLM's parser makes of `flag`'s last value by the type the option table records
        (a malformed one was refused while reading, with argparse's complaint); None: not given."""
        value = self.get(flag)
        if value is None:
            return None
        found = self.options.match(flag)
        return convert_value(found.option, value) if found is not None and found.option is not None else value

    def _additional_config(self) -> dict[str, object]:
        """--additional-config as VllmConfig takes it: a JSON object ({} when not given). The parser
        turns a value out of braces into a string, which VllmConfig's validation refuses (a dict or a
        SupportsHash object: vLLM 0.33.0, vllm/config/vllm.py:429; seen on 0.32.0: "Input should be a
        valid dictionary")."""
        value = self._converted("--additional-config")
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise CommandError(f"--additional-config {self.get('--additional-config')!r}: expected a JSON object, "
                               f"e.g. '{{\"gdn_prefill_backend\": \"triton\"}}' (vLLM refuses any other value)")
        return value

    def _last_values(self, flag: str) -> tuple[str, ...]:
        """A list option (nargs "+"): argparse keeps every value of its last occurrence."""
        spans = self._spans(flag)
        return tuple(spans[-1].values) if spans else ()

    def _int(self, flag: str, human: bool = False) -> int | None:
        value = self.get(flag)
        if value is None:
            return None
        if human:
            return parse_vllm_int(value)
        try:
            return int(value)
        except ValueError:
            raise CommandError(f"{flag} {value!r}: not an integer") from None

    def _switch(self, flag: str) -> bool | None:
        """A switch as the release's parser reads it: the last of its spellings wins, and a negative
        one (--no-X; from 0.33 --disable-X for --enable-X and the reverse) turns it off."""
        spans = self._spans(flag)
        if not spans:
            return None
        last = spans[-1]
        if last.option.form == "switch":
            return bool(last.option.const)
        return last.spelling not in last.option.negative

    def _float(self, flag: str, default: float) -> float:
        value = self.get(flag)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            raise CommandError(f"{flag} {value!r}: not a number") from None

    def _positive_int(self, flag: str) -> int | None:
        """A count vLLM validates as at least 1 (LoRAConfig max_loras ge=1, a rank from its list)."""
        value = self._int(flag)
        if value is not None and value < 1:
            raise CommandError(f"{flag} {value}: expected a whole number, 1 or more")
        return value

    def _nonnegative_float(self, flag: str) -> float:
        value = self._float(flag, 0.0)
        if not 0 <= value < 1e6:
            raise CommandError(f"{flag} {self.get(flag)!r}: expected a number of GiB, 0 or more")
        return value

    # -- writing -----------------------------------------------------------
    def with_flag(self, flag: str, value: object) -> EngineCommand:
        """Set `flag` to `value`: the first occurrence is replaced in place, later ones dropped."""
        flag = self.options.name_of(flag)
        spans = self._spans(flag)
        if not spans:
            return replace(self, argv=(*self.argv, flag, str(value)))
        start, end = spans[0].start, spans[0].end
        token = self.argv[start]
        replacement = [f"{token.split('=', 1)[0]}={value}"] if end == start + 1 else [token, str(value)]
        out = [*self.argv[:start], *replacement, *self.argv[end:]]
        return replace(self, argv=tuple(out)).without_flag(flag, keep_first=True)

    def without_flag(self, flag: str, keep_first: bool = False) -> EngineCommand:
        spans = self._spans(flag)[1 if keep_first else 0:]
        drop = {i for o in spans for i in range(o.start, o.end)}
        return replace(self, argv=tuple(t for i, t in enumerate(self.argv) if i not in drop))

    def apply(self, set_flags: dict[str, object], remove: Sequence[str] = ()) -> EngineCommand:
        command = self
        for flag in remove:
            command = command.without_flag(flag)
        for flag, value in set_flags.items():
            command = command.with_flag(flag, value)
        return command

    def health_url(self) -> str:
        s = self.settings()
        host = "127.0.0.1" if s.host in ("0.0.0.0", "", "::") else s.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{s.port}"
