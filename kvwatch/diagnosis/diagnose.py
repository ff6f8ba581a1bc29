"""Read an engine's output and name the root cause of its failure (pure: lines in, Diagnosis out).

The scanner looks at each line once, in order, with bounded memory:
- a line is cut to MAX_LINE_CHARS and stripped of ANSI colours;
- a cheap prefilter (substring keywords, tested on whole batches of lines at once) skips the
  ordinary INFO lines before any regex runs;
- per class, it keeps the best-placed evidence line and the facts found so far;
- wrappers ("Engine core initialization failed", "Worker failed with error '...'") never name
  a class: the root cause they wrap matches on its own line, or inside the wrapper's quote;
- when a new engine run starts in the same log (the API server's "non-default args:"),
  what came before is forgotten: the last run's failure is the one to fix.
The most specific class wins (patterns.py priorities); an engine that had been serving and
died with no other root cause is ENGINE_DIED.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import IO, Any

from kvwatch.diagnosis import normalise, refusals
from kvwatch.diagnosis.facts import FailureFacts, JsonFacts, facts_of
from kvwatch.diagnosis.patterns import (
    CHAIN_MARKERS,
    CONFIG_EXCEPTION,
    CONFIG_FIELD_ERROR,
    CONFIG_KEYWORDS,
    CONFIG_VALUE_ERROR,
    CONTEXT_PATTERNS,
    EXCEPTION_KEYWORDS,
    EXCEPTION_LINE,
    NEGATIVE_KV,
    NEGATIVE_KV_KEYWORDS,
    PATTERNS,
    READY_MARKERS,
    ROOT_KEYWORDS,
    RUN_START_MARKERS,
    TRACEBACK_START,
    WRAPPERS,
    Pattern,
)
from kvwatch.diagnosis.placement_wait import PROGRESS_MARKERS, SEEN_MARKERS, WAIT_MARKER, PlacementWait, fix_for
from kvwatch.failure_kinds import ALWAYS_FATAL, HELP, FailureKind
from kvwatch.planner.rules import FP8_KV_DTYPES, PACKED_MLA_BYTES

MAX_LINE_CHARS = 64 * 1024          # a giant line is cut, so no regex ever sees more
MAX_EVIDENCE_CHARS = 2000           # evidence reported (the line, trimmed)
MAX_LINE_BYTES = MAX_LINE_CHARS * 4  # the same cut on undecoded UTF-8
_BATCH_CHARS = 1 << 20              # feed_all joins lines into batches of about this size
_BLOCK_BYTES = 1 << 20              # feed_stream reads blocks of this size
_ANSI = normalise.ANSI
_PREFIX = re.compile(r"\((?P<proc>[A-Za-z_][\w.-]*)(?: rank=\d+)? pid=(?P<pid>\d+)(?:, ip=[\d.]+)?\)")
_API_SERVER = "APIServer"   # vLLM's front-end process: it serves requests, their text is anyone's
# The wrappers that report a failure of an engine core or worker (all but a bare "original error:").
_CORE_WRAPPERS = frozenset(name for _, name in WRAPPERS) - {"original_error"}
_RAISE_CALL = re.compile(r"\braise \w*\($")
_EXCEPTION_HEAD = re.compile(r"(?:Error|Exception|Resources): $")
_FLAG_REASONS = ("block_size", "kv_cache_dtype", "kv cache dtype", "FP8 KV cache", "fp8")

# Where a root cause may be written: vLLM's exception and error records, never its INFO/DEBUG
# records (a logged request, a generated output, a config dump, uvicorn's access log), whose text
# can be anyone's. A line's record: the vLLM/uvicorn level after the optional docker-compose and
# process prefixes; a line with no level continues the record above it unless it starts a
# traceback, an exception line or a process's own output.
_OUTER = r"^(?:[\w.-]+\s+\|\s)?\s*(?:\[rank\d+\]:\s*)?"
_RECORD_LEVEL = re.compile(_OUTER + r"(?:\([A-Za-z_][\w.-]*(?: rank=\d+)? pid=\d+(?:, ip=[\d.]+)?\)\s+)*"
                           r"(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)(?::\s|\s+\d\d-\d\d\s)")
_RECORD_START = re.compile(_OUTER + r"(?:\([A-Za-z_][\w.-]*(?: rank=\d+)? pid=\d+(?:, ip=[\d.]+)?\)|Traceback \(most recent|"
                           r"(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Resources|Warning)\b)")
_QUIET_LEVELS = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})   # never evidence of a failure
_LOOK_BACK_LINES = 400
# Classes that only a start can have: an engine that served with this plan is not refused it later.
_START_ONLY = frozenset({FailureKind.BLOCK_SIZE_UNSUPPORTED, FailureKind.KV_DTYPE_UNSUPPORTED,
                         FailureKind.KERNEL_OUT_OF_RESOURCES, FailureKind.KV_CACHE_TOO_SMALL,
                         FailureKind.NO_KV_CACHE_MEMORY, FailureKind.GPU_MEMORY_BUSY,
                         FailureKind.NO_ATTENTION_BACKEND, FailureKind.CONFIG_REFUSED,
                         FailureKind.MAMBA_CACHE_TOO_SMALL, FailureKind.COMPILE_FAILED,
                         FailureKind.TOOL_PARSER_UNKNOWN, FailureKind.PLACEMENT_GROUP_UNAVAILABLE,
                         # (not PORT_IN_USE: uvicorn says "Application startup complete" before it binds)
                         FailureKind.MODEL_UNAVAILABLE,
                         # NCCL fails a start for good; a serving engine's NCCL error may pass: restart it
                         FailureKind.NCCL_ERROR})


def _is_error_record(line: str) -> bool:
    """An ERROR/CRITICAL record, or a traceback or exception printed without a level."""
    m = _RECORD_LEVEL.match(line)
    if m is not None:
        return m["level"] in ("ERROR", "CRITICAL")
    return TRACEBACK_START in line or EXCEPTION_LINE.search(line) is not None


def _record_quiet(line: str) -> bool | None:
    """True/False when `line` starts a record (quiet: INFO/DEBUG); None when it continues one."""
    m = _RECORD_LEVEL.match(line)
    if m is not None:
        return m["level"] in _QUIET_LEVELS
    return False if _RECORD_START.match(line) else None

# The keywords the prefilter tests: one pass of `in` per keyword over a whole batch of lines.
_ALL_KEYWORDS: tuple[str, ...] = tuple(dict.fromkeys(
    ROOT_KEYWORDS + tuple(w for w, _ in WRAPPERS) + READY_MARKERS + RUN_START_MARKERS
    + tuple(k for k, *_ in CONTEXT_PATTERNS) + EXCEPTION_KEYWORDS + CONFIG_KEYWORDS
    + (TRACEBACK_START,) + CHAIN_MARKERS + NEGATIVE_KV_KEYWORDS
    + (WAIT_MARKER,) + SEEN_MARKERS + PROGRESS_MARKERS))
_PATTERNS_BY_PRIORITY: tuple[Pattern, ...] = tuple(sorted(PATTERNS, key=lambda p: -p.priority))


# The engine's version line: "vLLM API server version 0.34.0", "Initializing a V1 LLM engine (v0.34.0)".
RELEASE_LINE = re.compile(r"(?:vLLM API server version |LLM engine \(v)(\d{1,3}\.\d{1,3}\.\d{1,3}(?:\.post\d{1,3})?)")


@dataclass(frozen=True)
class Diagnosis:
    kind: FailureKind
    evidence: str | None          # the root-cause line as the engine printed it (ANSI stripped)
    facts: JsonFacts              # what the message says, as plain JSON values (the report's form)
    fatal: bool                   # no flag change can fix it
    release: str | None = None    # the vLLM release the log's version line names (None: it names none)

    @property
    def typed_facts(self) -> FailureFacts:
        """The facts typed for this class (diagnosis/facts.py): what the remedies and the watchdog read."""
        return facts_of(self.kind, self.facts)

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "evidence": self.evidence, "facts": self.facts,
                "fatal": self.fatal}


@dataclass
class _Candidate:
    score: tuple[int, int, int]    # (priority, placement quality, whole message 1 or its head 0)
    line: str
    facts: JsonFacts
    pattern: str
    merged: JsonFacts = field(default_factory=dict)
    after_ready: bool = False      # offered after this run's READY marker


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def clean_line(line: str | bytes) -> str:
    """One line as the scanner sees it: decoded, cut, without colours or the newline."""
    if isinstance(line, bytes):
        line = _decode(line[:MAX_LINE_BYTES])
    if len(line) > MAX_LINE_CHARS:
        line = line[:MAX_LINE_CHARS]
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    return line.rstrip("\r\n")


def _placement(line: str, start: int) -> int:
    """How well a match sits in its line: 2 the exception's own message, 1 other text,
    0 quoted by a wrapper or echoed from source code in a traceback."""
    head = line[:start]
    if any(w in head for w in ("Worker failed with error", "original error:")):
        return 0
    stripped = head.rstrip()
    if stripped.endswith(("(\"", "('", "\"", "'")) or _RAISE_CALL.search(stripped):
        return 0
    body = line.lstrip()
    if body.startswith(("raise ", "\"", "f\"", "'")):
        return 0
    return 2 if _EXCEPTION_HEAD.search(head) else 1


class LogScanner:
    """The incremental scanner: feed(line) for each line, result() at any time.

    Memory is bounded: one candidate per class, a few context values, one fallback line.
    """

    def __init__(self, *, served: bool = False) -> None:
        self.served = served
        self.lines = 0
        self._tail = ""                            # the last line of the previous text fed
        self._tail_quiet = False                   # the previous text ended inside a quiet record
        self.release: str | None = None            # from the log's version line (RELEASE_LINE)
        self._reset_run()

    def _reset_run(self) -> None:
        # Candidates by the process that wrote them: the API server's records hold text that is
        # not the engine's own (a request, a model's output quoted in a parser error); they name
        # the failure only when no engine core or worker reported an error of its own.
        self._best: dict[FailureKind, _Candidate] = {}
        self._best_api: dict[FailureKind, _Candidate] = {}
        self._engine_errors = False
        self._context: JsonFacts = {}
        self._wrappers: dict[str, int] = {}
        self._last_exception: str | None = None
        self._first_in_chain: str | None = None   # the exception closest to the raise, last traceback
        self._chained = False
        self._config_frame = False                 # the last traceback frame is vLLM's config code
        self._ready = False
        self._negative_kv: tuple[str, float] | None = None   # the profile left less than nothing for the cache
        self._placement = PlacementWait()          # Ray's placement-group waits: a start's progress

    # -- input -------------------------------------------------------------------------
    def feed(self, line: str | bytes) -> None:
        """One line (bytes are decoded as UTF-8, invalid sequences replaced)."""
        if isinstance(line, bytes):
            line = _decode(line[:MAX_LINE_BYTES])
        self._feed_text(line.rstrip("\r\n"))

    def feed_all(self, lines: Iterable[str | bytes]) -> LogScanner:
        """feed() for many lines, in batches of about a megabyte (the prefilter runs per batch)."""
        batch: list[str] = []
        size = 0
        for line in lines:
            if isinstance(line, bytes):
                line = _decode(line[:MAX_LINE_BYTES])
            line = line.rstrip("\r\n")
            batch.append(line)
            size += len(line)
            if size >= _BATCH_CHARS:
                self._feed_text("\n".join(batch))
                batch, size = [], 0
        if batch:
            self._feed_text("\n".join(batch))
        return self

    def feed_stream(self, stream: IO[bytes], block_bytes: int = _BLOCK_BYTES) -> LogScanner:
        """A byte stream (a file, stdin), read in blocks: what `kvwatch diagnose` uses. A line
        longer than MAX_LINE_BYTES is cut there and the rest of it skipped, unread into memory."""
        carry = b""
        skipping = False                       # inside a line already cut
        while data := stream.read(block_bytes):
            if skipping:
                nl = data.find(b"\n")
                if nl == -1:
                    continue
                data, skipping = data[nl + 1:], False
            data = carry + data
            nl = data.rfind(b"\n")
            if nl != -1:
                self._feed_text(_decode(data[:nl]))
                data = data[nl + 1:]
            if len(data) > MAX_LINE_BYTES:
                self._feed_text(_decode(data[:MAX_LINE_BYTES]))
                data, skipping = b"", True
            carry = data
        if carry:
            self._feed_text(_decode(carry))
        return self

    def _feed_text(self, text: str) -> None:
        """Whole lines joined by newlines. The prefilter runs on the whole text: one `in` per
        keyword; then only the lines holding a keyword are looked at, in order."""
        self.lines += text.count("\n") + 1
        if self.release is None and ("version " in text or "LLM engine (v" in text):
            found = RELEASE_LINE.search(text)
            self.release = found[1] if found else None
        if "\x1b" in text:
            text = _ANSI.sub("", text)
        text = normalise.normalise(text)
        present = [k for k in _ALL_KEYWORDS if k in text]
        previous_tail, self._tail = self._tail, text[text.rfind("\n") + 1:][:MAX_LINE_CHARS]
        tail_quiet = self._tail_quiet
        self._tail_quiet = self._quiet_at(text, len(text), tail_quiet)
        if not present:
            return
        starts: set[int] = set()
        for keyword in present:
            at = text.find(keyword)
            while at != -1:
                start = text.rfind("\n", 0, at) + 1
                if at + len(keyword) <= start + MAX_LINE_CHARS:     # beyond the cut: not seen
                    starts.add(start)
                end = text.find("\n", at)
                at = text.find(keyword, end) if end != -1 else -1
        for start in sorted(starts):
            end = text.find("\n", start)
            end = len(text) if end == -1 else end
            whole = text[start:min(end, start + MAX_LINE_CHARS)].rstrip("\r")
            context_quiet: bool | None = None
            for line in normalise.split_pasted(whole):
                hits = [k for k in present if k in line]
                if not hits:
                    continue
                quiet = _record_quiet(line)
                if quiet is None:
                    if context_quiet is None:
                        context_quiet = self._quiet_at(text, start, tail_quiet)
                    quiet = context_quiet
                if "[type=" in hits:   # a pydantic field error names its field on the line before
                    before = text[text.rfind("\n", 0, start - 1) + 1:start - 1] if start else previous_tail
                    self._process(line, hits, before.rstrip("\r"), quiet=quiet)
                else:
                    self._process(line, hits, quiet=quiet)

    @staticmethod
    def _quiet_at(text: str, end: int, before_text: bool) -> bool:
        """Whether the record that the text before `end` was in is quiet (INFO/DEBUG)."""
        at = end
        for _ in range(_LOOK_BACK_LINES):
            if at <= 0:
                return before_text
            start = text.rfind("\n", 0, at - 1) + 1 if at > 0 else 0
            quiet = _record_quiet(text[start:min(at, start + 300)])
            if quiet is not None:
                return quiet
            at = start - 1 if start > 0 else 0
            if start == 0:
                return before_text
        return False

    def _process(self, line: str, hits: list[str], previous: str = "", quiet: bool = False) -> None:
        if any(k in RUN_START_MARKERS for k in hits):
            self._reset_run()
        if any(k in READY_MARKERS for k in hits):
            self._ready = True
        for key, regex, name, convert in CONTEXT_PATTERNS:
            if key in hits and (m := regex.search(line)):
                try:
                    self._context[name] = convert(m[1])
                except ValueError:
                    pass
        self._track_placement(line, hits)
        if any(k in NEGATIVE_KV_KEYWORDS for k in hits) and (m := NEGATIVE_KV.search(line)) is not None:
            # vLLM's own profile, at INFO: a start whose raise was cut off still says this much.
            self._negative_kv = (line[:MAX_EVIDENCE_CHARS], float(m[1]))
        if quiet:
            return   # an INFO/DEBUG record (or a line of one): anyone's text, never a root cause
        if not self._engine_errors and process_of(line).get("process", _API_SERVER) != _API_SERVER \
                and _is_error_record(line):
            self._engine_errors = True
        wrapped = False
        for text, name in WRAPPERS:
            if text in hits:
                self._wrappers[name] = self._wrappers.get(name, 0) + 1
                wrapped = True
        if self._config_refusal(line, hits, previous):
            return
        for pattern in _PATTERNS_BY_PRIORITY:
            if not any(k in hits for k in pattern.keywords):
                continue
            m = pattern.regex.search(line)
            if m is not None:
                self._offer(pattern, m, line)
                return
            if pattern.head is not None and (m := pattern.head.search(line)) is not None:
                self._offer(pattern, m, line, whole=False)      # the message cut after its head
                return
        if not wrapped and any(k in hits for k in EXCEPTION_KEYWORDS) and EXCEPTION_LINE.search(line):
            if self._config_frame and (m := CONFIG_EXCEPTION.regex.search(line)) is not None:
                self._offer(CONFIG_EXCEPTION, m, line)
                return
            if refusals.VALIDATION_HEADER.search(line):
                return                      # pydantic's header: the sentence follows on its own line
            self._last_exception = line[:MAX_EVIDENCE_CHARS]
            if self._first_in_chain is None:
                self._first_in_chain = self._last_exception

    def _track_placement(self, line: str, hits: list[str]) -> None:
        """Progress, whatever the record's level: the placement-group waits and what ends them."""
        if WAIT_MARKER in hits:
            self._placement.observe_wait(line)
        elif any(k in PROGRESS_MARKERS or k in READY_MARKERS for k in hits):
            self._placement.progressed()
        if any(k in SEEN_MARKERS for k in hits):
            self._placement.observe_figures(line)

    def _config_refusal(self, line: str, hits: list[str], previous: str) -> bool:
        """vLLM's validation refusing its configuration; True when the line was one."""
        if TRACEBACK_START in hits:
            if not self._chained:
                self._first_in_chain = None
            self._chained = False
        if any(k in hits for k in CHAIN_MARKERS):
            self._chained = True
        if 'File "' in hits:
            self._config_frame = refusals.CONFIG_FRAME.search(line) is not None
            return True
        if "validation error" in hits and (h := refusals.VALIDATION_HEADER.search(line)) is not None:
            self._context["config_class"] = h["config"]
        if "Value error, " in hits and (m := CONFIG_VALUE_ERROR.regex.search(line)) is not None:
            facts = CONFIG_VALUE_ERROR.extract(m)
            # A sentence another class knows better (a block size, a KV dtype) goes to that class.
            if facts.get("refusal") == "other" and any(p.regex.search(m["sentence"]) for p in PATTERNS):
                return False
            self._offer(CONFIG_VALUE_ERROR, m, line, facts)
            return True
        if "[type=" in hits and (m := CONFIG_FIELD_ERROR.regex.search(line)) is not None:
            named = refusals.FIELD_NAME_LINE.search(previous) if previous else None
            self._offer(CONFIG_FIELD_ERROR, m, line,
                        refusals.field_error_facts(named["field"] if named else None, m))
            return True
        return False

    def _offer(self, pattern: Pattern, m: re.Match[str], line: str, facts: JsonFacts | None = None,
               whole: bool = True) -> None:
        try:
            facts = pattern.extract(m) if facts is None else facts
        except (ValueError, IndexError, TypeError):   # a mangled number: keep the class, drop the facts
            facts = {}
        score = (pattern.priority, _placement(line, m.start()), int(whole))
        best = self._best_api if process_of(line).get("process") == _API_SERVER else self._best
        current = best.get(pattern.kind)
        if current is None:
            current = best[pattern.kind] = _Candidate(score, line[:MAX_EVIDENCE_CHARS], facts,
                                                      pattern.name, after_ready=self._ready)
        elif score > current.score:
            current.score, current.line, current.facts, current.pattern = (
                score, line[:MAX_EVIDENCE_CHARS], facts, pattern.name)
            current.after_ready = self._ready
        for key, value in facts.items():
            current.merged.setdefault(key, value)

    # -- output ------------------------------------------------------------------------
    def _candidates(self) -> dict[FailureKind, _Candidate]:
        """Where the failure is named. When an engine core or worker failed (it wrote an error of its
        own, or the API server says so: a core that died or did not start), only the engine's own
        records name it, and the API server's only as that death. Otherwise the API server failed
        alone (a refused configuration): its records count too, the better placed per class."""
        core_failed = self._engine_errors or FailureKind.ENGINE_DIED in self._best_api \
            or any(name in _CORE_WRAPPERS for name in self._wrappers)
        if core_failed:
            died = self._best_api.get(FailureKind.ENGINE_DIED)
            if died is None or FailureKind.ENGINE_DIED in self._best:
                return self._best
            return {**self._best, FailureKind.ENGINE_DIED: died}
        merged = dict(self._best_api)
        for kind, candidate in self._best.items():
            if kind not in merged or candidate.score >= merged[kind].score:
                merged[kind] = candidate
        return merged

    def result(self) -> Diagnosis:
        """The diagnosis so far, with the release the log's version line names."""
        found = self._result()
        return replace(found, release=self.release) if self.release else found

    def _result(self) -> Diagnosis:
        served = self.served or self._ready
        candidates = self._candidates()
        root = [c for k, c in candidates.items() if k is not FailureKind.ENGINE_DIED]
        if root:
            best = max(root, key=lambda c: c.score[0])
            kind = next(k for k, c in candidates.items() if c is best)
            if not ((self.served or best.after_ready) and kind in _START_ONLY):
                return self._diagnosis(kind, best, served)
            # The engine served with this plan, so this start-up refusal is not its failure now
            # (e.g. the words came from a request): it died, and the plan stays.
            died = candidates.get(FailureKind.ENGINE_DIED)
            facts: JsonFacts = {"after_ready": True, "ignored": {"kind": kind.value, "evidence": best.line[:300]}}
            if self._context:
                facts["context"] = dict(self._context)
            return Diagnosis(FailureKind.ENGINE_DIED, died.line if died else self._first_in_chain or self._last_exception,
                             facts, fatal=False)
        if self._placement.stuck() and not served:
            # No exception, and the start never got past Ray's placement group.
            facts = {**self._placement.facts(), "pattern": "placement_group_wait", **process_of(self._placement.line)}
            return Diagnosis(FailureKind.PLACEMENT_GROUP_UNAVAILABLE, self._placement.line[:MAX_EVIDENCE_CHARS],
                             facts, fatal=True)
        died = candidates.get(FailureKind.ENGINE_DIED)
        if died is not None or served:   # the log's own READY counts as the probe's: one verdict either way
            facts = dict(died.merged) if died else {}
            facts.update(died.facts if died else {})
            if died:
                facts["pattern"] = died.pattern
            facts["after_ready"] = served
            if self._context:
                facts["context"] = dict(self._context)
            return Diagnosis(FailureKind.ENGINE_DIED, died.line if died else self._last_exception,
                             facts, fatal=False)
        if self._negative_kv is not None:
            line, gib = self._negative_kv
            facts = {"available_kv_gib": gib, "pattern": "negative_available_kv", **process_of(line)}
            if self._context:
                facts["context"] = dict(self._context)
            facts["help"] = _NO_KV_HELP
            return Diagnosis(FailureKind.NO_KV_CACHE_MEMORY, line, facts, fatal=False)
        facts = {}
        if self._wrappers:
            facts["wrappers"] = dict(self._wrappers)
        if self._context:
            facts["context"] = dict(self._context)
        return Diagnosis(FailureKind.UNKNOWN, self._first_in_chain or self._last_exception, facts, fatal=False)

    def _diagnosis(self, kind: FailureKind, best: _Candidate, served: bool) -> Diagnosis:
        facts: JsonFacts = {**best.merged, **best.facts, "pattern": best.pattern, **process_of(best.line)}
        if served:
            facts["after_ready"] = True
        if self._context:
            facts["context"] = dict(self._context)
        fatal = False
        if kind is FailureKind.NO_ATTENTION_BACKEND:
            reasons = facts.get("reasons") or {}
            fatal = (bool(reasons) and not flag_fixable_backends(reasons) and not facts.get("reasons_cut")
                     and best.pattern != "selected_backend_invalid")   # a forced backend can be dropped
            if fatal:
                facts["help"] = ("every attention backend is ruled out by the hardware or the model: "
                                 "another GPU, another vLLM version or another model")
        elif kind is FailureKind.KERNEL_OUT_OF_RESOURCES:
            dtype = self._context.get("kv_cache_dtype")
            fatal = dtype is not None and not is_8bit_kv(dtype)
            if fatal:
                facts["help"] = ("the kernel's limit is not tied to an 8-bit KV cache here: "
                                 "another attention backend, GPU or vLLM version")
        elif kind is FailureKind.CONFIG_REFUSED:
            fatal = not refusals.is_fixable(facts.get("refusal"))
            if fatal:
                facts["help"] = refusals.help_for(facts.get("refusal"))
            if "config_class" in self._context:
                facts["config_class"] = self._context["config_class"]
            sentence = facts.get("sentence")
            evidence = sentence
            if sentence and facts.get("field"):
                given = f" [input_value={facts['value']}]" if "value" in facts else ""
                evidence = f"{facts['field']}: {sentence}{given}"
            return Diagnosis(kind, (evidence or best.line)[:MAX_EVIDENCE_CHARS], facts, fatal)
        elif kind is FailureKind.NO_KV_CACHE_MEMORY:
            facts["help"] = _NO_KV_HELP
        elif kind is FailureKind.PLACEMENT_GROUP_UNAVAILABLE:
            fatal = True
            gpus = facts.get("gpus")
            asked = gpus if isinstance(gpus, (int, float)) else self._placement.gpus_asked
            facts["help"] = fix_for(asked, self._placement.ray_gpus)
            if self._placement.ray_gpus is not None:
                facts["ray_gpus"] = self._placement.ray_gpus
            if self._placement.waits:
                facts.update(placement_group_waits=self._placement.waits, waited_s=self._placement.seconds)
        elif kind in ALWAYS_FATAL:
            fatal = True
            facts["help"] = HELP[kind]
        return Diagnosis(kind, best.line, facts, fatal)


_NO_KV_HELP = ("more --gpu-memory-utilization if the GPU has room; else more GPUs "
               "(--tensor-parallel-size), a quantized checkpoint or a smaller model")


def process_of(line: str) -> JsonFacts:
    """The vLLM process that printed a line: `(Worker_TP0 pid=N)` -> process, pid (innermost)."""
    found = _PREFIX.findall(line[:300])
    if not found:
        return {}
    proc, pid = found[-1]
    return {"process": proc, "pid": int(pid)}


def is_8bit_kv(kv_cache_dtype: str | None) -> bool:
    if not kv_cache_dtype:
        return False
    return (kv_cache_dtype in FP8_KV_DTYPES or kv_cache_dtype in PACKED_MLA_BYTES
            or kv_cache_dtype.startswith(("fp8", "int8", "nvfp4")))


def is_flag_reason(reason: str) -> bool:
    """A backend rejection that a flag can lift (--block-size, --kv-cache-dtype)."""
    lowered = reason.lower()
    return any(r.lower() in lowered for r in _FLAG_REASONS)


def flag_fixable_backends(reasons: Mapping[str, Sequence[str]]) -> list[str]:
    """Backends (in vLLM's order) rejected only for reasons a flag can lift."""
    return [name for name, rs in reasons.items() if rs and all(is_flag_reason(r) for r in rs)]


def diagnose(lines: Iterable[str | bytes], *, served: bool = False) -> Diagnosis:
    """The root cause of a failure, from the engine's output (stdout and stderr, any order)."""
    return LogScanner(served=served).feed_all(lines).result()


def diagnose_stream(stream: IO[bytes], *, served: bool = False) -> Diagnosis:
    """diagnose() of a byte stream (a log file opened "rb", stdin's buffer)."""
    return LogScanner(served=served).feed_stream(stream).result()
