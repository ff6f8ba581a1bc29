"""The engine's processes as kvwatch proves them (ownership.py), through the supervisor's WatchdogOs:
before a launch, end what an earlier engine left and report anyone else's; while it runs, its tree
(DP engine cores included) and the proof recorded at spawn; at a stop, the whole group and what left
it; as PID 1, the orphans; the GPU's holders. The supervisor holds one and says which launch runs.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from kvwatch.boundary.proc_inspect import ProcRef
from kvwatch.errors import KvwatchError
from kvwatch.planner.devices import Device
from kvwatch.planner.engine_args import EngineCommand
from kvwatch.watchdog.config import Config
from kvwatch.watchdog.engine_tree import EngineTree
from kvwatch.watchdog.gpu_view import GpuView
from kvwatch.watchdog.host_registry import HostRegistry
from kvwatch.watchdog.os_interface import EngineHandle, Sleep, WatchdogOs
from kvwatch.watchdog.output_pump import OutputPump
from kvwatch.watchdog.ownership import EngineProof
from kvwatch.watchdog.state_store import EngineRecord

_LOG = logging.getLogger(__name__)


@dataclass
class Running:
    """One launch that spawned: its engine, its output, when, the processes seen."""
    proc: EngineHandle
    pump: OutputPump
    started: float
    tree: EngineTree = field(default_factory=EngineTree)
    ended: bool = False
    # The engine's output lines seen before kvwatch first signalled it at the end: what came after is
    # the engine answering kvwatch's own SIGTERM, never evidence of why it died (None: not signalled).
    lines_before_stop: int | None = None

    def said_before_stop(self) -> list[str]:
        """The engine's lines up to kvwatch's own stop signal: a worker that died of that SIGTERM is no cause."""
        return self.pump.lines() if self.lines_before_stop is None else self.pump.lines_before(self.lines_before_stop)


class EngineProcesses:
    def __init__(self, config: Config, os: WatchdogOs, running: Callable[[], Running | None],
                 record: Callable[[], EngineRecord], device: Callable[[], Device | None],
                 now: Callable[[], float], sleep: Sleep, changed: Callable[[], None],
                 gpu_pids: Callable[[], list[tuple[str, int]]] | None = None) -> None:
        self._config = config
        self._os = os
        self._running = running   # the launch running now (None between launches)
        self._record = record     # the state file's record (replaced at the start)
        self._device = device
        self._now = now
        self._sleep = sleep
        self._changed = changed   # the record changed: save the state file and publish the status
        self._gpu_pids = gpu_pids
        self._gpus: GpuView | None = None
        self._registry: HostRegistry | None = None   # the other instances' claims, read at a stop or clean-up
        self.proof: EngineProof | None = None   # what proves a process the running engine's (recorded at spawn)
        self.escaped = 0   # processes that looked like the engine's at the last stop or clean-up, not provably
        self.last_pids: frozenset[int] = frozenset()   # the last engine's processes, for the GPU-release wait

    def spawn(self, argv: list[str], env: dict[str, str], output: BinaryIO | None,
              on_exit: Callable[[], None]) -> Running | str:
        """Start the engine in its own group, its output pumped to `output`: the launch, or why it could
        not be started. Its proof is recorded before anything else: the next kvwatch proves its processes
        from it."""
        timeout = self._config.engine.stop_timeout_seconds
        try:
            proc = self._os.spawn(argv, env, reaper_grace=min(10.0, timeout))
        except OSError as exc:
            return f"cannot start {argv[0]}: {exc.strerror or exc}"
        proc.on_exit(on_exit)
        pump = OutputPump(self._config.name, proc.stdout, output).start()
        run = Running(proc, pump, self._now())
        _LOG.info("spawned: pid %d (group %d): %s", proc.pid, proc.pgid, " ".join(argv))
        record = self._record()
        record.pgid = proc.pgid
        self.proof = self._os.proof(proc)
        record.engine_proof = self.proof.to_json() if self.proof is not None else {}
        return run

    def clean_leftovers(self, command: EngineCommand) -> None:
        """Before a launch: end what is left of our earlier engines (and what holds the command's port),
        report anyone else's."""
        try:
            port: int | None = command.settings().port
        except KvwatchError:
            port = None
        record = self._record()
        refs = []
        for item in record.pids:
            try:
                refs.append(ProcRef.from_json(item))
            except (KeyError, TypeError, ValueError):
                continue
        report = self._os.clean_leftovers(refs, self.recorded_proof(), port, self._gpu_holders,
                                          self._config.engine.stop_timeout_seconds, self._sleep, self._others)
        record.foreign = report.foreign
        record.pids = []
        record.engine_proof = {}
        self._note_escaped(report.escaped)

    def refresh_tree(self, force: bool = False) -> None:
        run = self._running()
        if run is None:
            return
        infos = self._os.tree(run.proc)
        lost, changed = run.tree.update(infos, force)
        for rank in lost:
            _LOG.warning("engine core of data-parallel rank %d (pid %d) is gone while the others run",
                         rank, run.tree.ranks.lost[rank])
        if not changed:
            return
        self._record().pids = [p.to_json() for p in infos]
        self._changed()

    def reap_orphans(self) -> None:
        """As PID 1 (a container's entrypoint), reap the orphans re-parented to us."""
        run = self._running()
        keep = run.proc.own_pids if run is not None else frozenset()
        for pid in self._os.reap_orphans(keep):
            _LOG.info("reaped: orphan pid %d", pid)

    def end(self, run: Running) -> None:
        """Stop the whole group (whatever is left of it), drain the output, forget the pids."""
        timeout = self._config.engine.stop_timeout_seconds
        # Proven before the group is signalled, while the engine's session still has its leader: a
        # descendant that left the group (a double-forked daemon) goes with it.
        reaper = run.proc.own_pids - {run.proc.pid}   # kvwatch's child too, never the engine's
        seen = {r.pid for r in run.tree.refs}
        self.last_pids = frozenset(seen | {run.proc.pid})
        owned = list(run.tree.refs)
        for ref, why in self._os.owned(self.proof, run.tree.refs, reaper):
            if ref.pid not in seen:   # out of the tree kvwatch watches: say why it is ended
                _LOG.warning("stop: pid %d is the engine's: %s; ending it with the group", ref.pid, why)
                owned.append(ref)
        run.lines_before_stop = run.pump.catch_up(0.5)
        self._os.stop_group(run.proc, timeout, owned, self._now, self._sleep)
        # What forked meanwhile, or left the session: a second look, then the lookalikes reported.
        stopped, escaped = self._os.end_owned(self.proof, owned, timeout, self._sleep, reaper, self._others)
        if stopped:
            _LOG.warning("stop: ended %d engine process(es) outside its group: %s", len(stopped), stopped)
        self._note_escaped(escaped)
        run.proc.release_reaper()
        if run.pump.join(timeout=10):
            run.proc.close()
        else:
            _LOG.warning("pump %s: output still open after the group ended", self._config.name)
        _LOG.info("exited: pid %d, code %s", run.proc.pid, run.proc.returncode)
        self.reap_orphans()
        record = self._record()
        record.pids = []
        record.engine_proof = {}

    def recorded_proof(self) -> EngineProof | None:
        """The proof the state file kept of the last engine (an earlier kvwatch's, killed or not)."""
        record = self._record()
        if not record.engine_proof:
            return None
        try:
            return EngineProof.from_json(record.engine_proof)
        except ValueError as exc:
            _LOG.warning("state: %s; its processes cannot be proven the engine's", exc)
            return None

    def compute_seconds(self, run: Running) -> float | None:
        """On a CPU backend, the CPU time of the engine cores and workers (not the API server, nor helpers
        such as multiprocessing's resource tracker or adopted orphans): the stall detector's sign of
        progress; an engine whose processes carry no vLLM title, all of its tree but the process spawned."""
        device = self._device()
        if device is None or device.platform != "cpu":
            return None
        return self._os.cpu_seconds(run.tree.compute or (run.tree.live - {run.proc.pid}))

    def gpu_view(self) -> GpuView:
        if self._gpus is None:
            self._gpus = GpuView(self._device(), self._owned_pids)
        return self._gpus

    def gpu_free(self) -> int | None:
        gpu = self.gpu_view().context()
        return gpu.free_bytes if gpu else None

    def _others(self) -> frozenset[int]:
        """The pids other kvwatch instances on this host claim (never reported as escaped from ours)."""
        if self._registry is None:   # read only: this kvwatch's own claim is the exporter's to write
            self._registry = HostRegistry(self._config.state_dir, self._config.name)
        return self._registry.others()

    def _note_escaped(self, lines: list[str]) -> None:
        """Lookalikes not provably the engine's (ownership.py): logged by leftovers, kept, counted."""
        self._record().escaped = lines
        self.escaped = len(lines)

    def _owned_pids(self) -> frozenset[int]:
        """The running engine's processes, proven (ownership.py): for the GPU's holders."""
        run = self._running()
        proof = self.proof if run is not None else self.recorded_proof()
        recorded = run.tree.refs if run is not None else []
        reaper = run.proc.own_pids - {run.proc.pid} if run is not None else frozenset()
        return frozenset(r.pid for r, _ in self._os.owned(proof, recorded, reaper))

    def _gpu_holders(self) -> list[tuple[str, int]]:
        if self._gpu_pids is not None:
            return self._gpu_pids()
        return self.gpu_view().holders()
