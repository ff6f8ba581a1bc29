"""The engine command line: read the flags kvwatch plans with, write corrected ones back.

Works on argv exactly as the user runs it: `vllm serve MODEL ...` or
`python -m vllm.entrypoints.openai.api_server --model MODEL ...`, with
`--flag value` and `--flag=value`. Rewrites keep every other token untouched.
"""
from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache

from kvwatch.errors import CommandError
from kvwatch.planner.units import parse_vllm_int
from kvwatch.planner.vllm_flags import SERVE_OPTIONS

# Short aliases of the flags kvwatch reads or writes, to their long name.
ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size", "-q": "--quantization",
           "-dp": "--data-parallel-size"}
# Flags whose value is a count or a size: vLLM wants them positive (0 or less is a typo).
_COUNT_FLAGS = ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size", "--max-num-seqs",
                "--max-num-batched-tokens", "--num-gpu-blocks-override", "--max-model-len", "--kv-cache-memory-bytes")
_HUMAN_FLAGS = frozenset({"--max-num-batched-tokens", "--max-model-len", "--kv-cache-memory-bytes"})
_MAX_COUNT = 1 << 60
_API_SERVER_MODULES = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")


@lru_cache(maxsize=1024)   # every lookup canonicalises every token; a prefix search scans vLLM's 406 options
def _canonical(flag: str) -> str:
    """The option vLLM's parser reads for `flag`: --block_size is --block-size, and (argparse's
    allow_abbrev) a unique prefix of an option is that option: --kv-cache-memory is
    --kv-cache-memory-bytes."""
    if flag in ALIASES:
        return ALIASES[flag]
    if not flag.startswith("--"):
        return flag
    flag = "--" + flag[2:].replace("_", "-")
    if flag in SERVE_OPTIONS or len(flag) < 4:
        return flag
    matches = [option for option in SERVE_OPTIONS if option.startswith(flag)]
    return matches[0] if len(matches) == 1 else flag


def _split(token: str) -> tuple[str, str | None]:
    """'--flag=value' -> ('--flag', 'value'); '--flag' -> ('--flag', None)."""
    if token.startswith("-") and "=" in token:
        flag, value = token.split("=", 1)
        return _canonical(flag), value
    return _canonical(token), None


def _occurrences(argv: Sequence[str], flag: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, value) of every occurrence of `flag` in argv; end is exclusive."""
    i = 0
    while i < len(argv):
        name, inline = _split(argv[i])
        if name == flag:
            if inline is not None:
                yield i, i + 1, inline
                i += 1
                continue
            if i + 1 >= len(argv):
                raise CommandError(f"{flag} needs a value")
            yield i, i + 2, argv[i + 1]
            i += 2
            continue
        i += 1


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
    gpu_memory_utilization_given: bool = False   # False: the value above is a default (the version's decides)
    quantization: str | None = None          # --quantization: what the engine does to the weights (fp8, gguf, ...)
    cpu_offload_gb: float = 0.0              # --cpu-offload-gb: GiB of weights per GPU kept in host memory


@dataclass(frozen=True)
class EngineCommand:
    argv: tuple[str, ...]

    @classmethod
    def parse(cls, argv: Sequence[str]) -> EngineCommand:
        if not argv:
            raise CommandError("no engine command given (expected e.g. `-- vllm serve MODEL ...`)")
        command = cls(tuple(argv))
        _ = command.model  # fail early, with one clear line, when no model is named
        return command

    # -- reading -----------------------------------------------------------
    def _model_position(self) -> int | None:
        """Index of the positional MODEL of `vllm serve MODEL`, if any."""
        for i, token in enumerate(self.argv):
            if token == "serve" and (i == 0 or posixpath.basename(self.argv[i - 1]) in ("vllm", "main")
                                     or self.argv[i - 1].endswith("vllm.entrypoints.cli.main")):
                nxt = i + 1
                if nxt < len(self.argv) and not self.argv[nxt].startswith("-"):
                    return nxt
                return None
        return None

    def values(self, flag: str) -> list[str]:
        """Every value given for `flag`, in order (argparse keeps the last)."""
        return [value for _, _, value in _occurrences(self.argv, _canonical(flag))]

    def get(self, flag: str) -> str | None:
        values = self.values(flag)
        return values[-1] if values else None

    def has(self, flag: str) -> bool:
        flag = _canonical(flag)
        return any(_split(t)[0] == flag for t in self.argv)

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
            gpu_memory_utilization=self._float("--gpu-memory-utilization", 0.92),
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
            gpu_memory_utilization_given=self.get("--gpu-memory-utilization") is not None,
            quantization=self.get("--quantization"),
            cpu_offload_gb=self._nonnegative_float("--cpu-offload-gb"),
        )

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
        """A boolean flag as argparse's BooleanOptionalAction reads it: the last of --X / --no-X."""
        negative = "--no-" + _canonical(flag)[2:]
        last = None
        for token in self.argv:
            name = _split(token)[0]
            if name == _canonical(flag):
                last = True
            elif name == negative:
                last = False
        return last

    def _float(self, flag: str, default: float) -> float:
        value = self.get(flag)
        if value is None:
            return default
        try:
            return float(value)
        except ValueError:
            raise CommandError(f"{flag} {value!r}: not a number") from None

    def _nonnegative_float(self, flag: str) -> float:
        value = self._float(flag, 0.0)
        if not 0 <= value < 1e6:
            raise CommandError(f"{flag} {self.get(flag)!r}: expected a number of GiB, 0 or more")
        return value

    # -- writing -----------------------------------------------------------
    def with_flag(self, flag: str, value: object) -> EngineCommand:
        """Set `flag` to `value`: the first occurrence is replaced in place, later ones dropped."""
        flag = _canonical(flag)
        spans = list(_occurrences(self.argv, flag))
        if not spans:
            return EngineCommand((*self.argv, flag, str(value)))
        start, end, _ = spans[0]
        token = self.argv[start]
        replacement = [f"{token.split('=', 1)[0]}={value}"] if end == start + 1 else [token, str(value)]
        out = [*self.argv[:start], *replacement, *self.argv[end:]]
        return EngineCommand(tuple(out)).without_flag(flag, keep_first=True)

    def without_flag(self, flag: str, keep_first: bool = False) -> EngineCommand:
        flag = _canonical(flag)
        spans = list(_occurrences(self.argv, flag))[1 if keep_first else 0:]
        drop = {i for start, end, _ in spans for i in range(start, end)}
        return EngineCommand(tuple(t for i, t in enumerate(self.argv) if i not in drop))

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
