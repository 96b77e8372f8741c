"""One launch of the barrier job, watched from the driver's main thread until it has an outcome.

The job runs in a thread; the tasks' messages come over the run's channel into a bounded inbox the main thread
drains into the display, watching the clock (timeout), the tasks' silence (stall watchdog) and the first failure.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import re
import threading
import time
from typing import Callable

from .. import _protocol as events
from .._protocol import Msg, RunEvent
from ..errors import STALLED, ConfigError, RunTimeoutError, TaskFailure
from ..monitor.display import show
from .hooks import LaunchHooks
from .jobs import DriverPs, exchange_overdue, run_jobs
from .options import RunOptions
from .resources import Ask, Placement, refused_by_spark
from .spark import _driver_host
from .verdict import (_EXECUTOR_LOST, _boot_error, _boot_report, _cause, _Life, _locate, _Outcome, _refusal_error,
                      _spark_failure)

log = logging.getLogger(__name__)

_CANCEL_WAIT = 20.0     # seconds to let Spark kill tasks after a cancel before giving up waiting
_STACK_WAIT = 5.0       # seconds to wait for the stacks of a stalled run's train_fn processes
_DRAIN_SLICE = 0.05     # seconds of task messages handled before the watch loop looks at its clock again
# events handed to the display at once: few enough to die young (at 2,048 tasks the garbage collector took
# 0.04 CPU-s/s at 500 events, 0.02 at 100)
_SHOW_EVERY = 100
_RESIZE = "tfnb._task.resize.Resize"  # how a task reports the epoch-boundary stop of a run being resized
_MAX_SHOWN_LINE = 2000  # characters of a log line the display gets; the run's log file has it whole
_VOTE_SKEW = 30.0  # seconds a custom loop's workers may reach the same epoch boundary apart (a checkpoint each)


class _Attempt:
    """One launch of the barrier job, watched from the driver's main thread."""

    def __init__(self, spark, spec_kwargs: dict, opts: RunOptions, hooks: LaunchHooks,
                 display: Callable[[RunEvent], None], deadline: float | None = None, *,
                 placement: Placement | None = None, resize: threading.Event | None = None):
        """``spec_kwargs``: the launch's TaskSpec but its channel (``num_workers``: this launch's)."""
        from .channel import Inbox
        from .runlog import RunLog

        self.spark, self.spec_kwargs, self.attempt = spark, spec_kwargs, spec_kwargs["attempt"]
        self.opts, self.hooks, self.num_workers, self.num_ps = opts, hooks, spec_kwargs["num_workers"], opts.num_ps
        self.num_tasks = self.num_workers + self.num_ps
        self.placement = placement or Placement(workers=Ask(1, 0.0))
        self._addrs: dict[int, dict] = {}  # rank -> its TensorFlow server's address and rows, as tasks report
        self._heard: dict[int, float] = {}  # rank -> when it reported them
        self.display, self.deadline, self.resize = display, deadline, resize
        self.q = Inbox()
        self.runlog = RunLog.for_run(spec_kwargs["run_id"], opts.model_dir)
        resized = spec_kwargs.get("resized_from")
        self.runlog.note(f"attempt {self.attempt} (failed launches allowed: {opts.max_attempts}), "
                         f"{spec_kwargs['num_workers']} workers" + (f", resized from {resized}" if resized else ""))
        if self.attempt == 1 and self.runlog.path:
            display(RunEvent(events.STATE, "driver", 0, {"log_file": self.runlog.path}))
        self._dropped_shown = (0, time.monotonic())
        self.tag = f"tfnb-{spec_kwargs['run_id']}-{self.attempt}"
        self.failures: list[TaskFailure] = []
        self.done_ranks: set[int] = set()
        self.lives: dict[int, _Life] = {}
        self.refused: str | None = None  # Spark refused the run's resource profile (read from the job's error)
        self.lost: list[TaskFailure] = []  # tasks whose executor or Python worker vanished
        self.job_error: BaseException | None = None
        self.boot: dict | None = None  # why tfnb could not start in a task or its train_fn process
        self.first_bad: float | None = None  # when the first sign of failure arrived
        self.decided = False  # past this point, disconnects are tfnb's own stopping of the tasks
        self._batch: list | None = None  # events of the current _drain pass, for the display
        self._feed: dict[int, tuple[int, bool]] = {}  # rank -> (rows so far, whole) while data= streams
        self._feed_told = 0.0
        self._counts: list[int] | None = None  # rows per worker, when counted before launch
        self.resizing = False  # asked: every task, connected or still to come, stops at its next epoch boundary
        # ranks in an elastic run's epoch-boundary vote (tfnb._task.resize), and when to check every worker is
        self.voters: set[int] = set()
        self._vote_check: float | None = None

    def _show(self, event: RunEvent) -> None:
        # inside _drain the display gets the pass's events as one batch (one redraw, one write)
        if self._batch is not None:
            self._batch.append(event)
        else:
            self.display(event)

    def _on_message(self, peer: dict, msg: dict) -> None:
        kind = msg.get("kind")
        if kind == Msg.FEED:  # answered here, in milliseconds: train_fn waits for these rows
            self._on_feed(peer, msg)
            return
        if kind == Msg.ADDR:  # likewise: every task waits for the others' addresses to start train_fn
            self._addrs[int(peer.get("rank", -1))] = {"addr": msg.get("addr"), "rows": msg.get("rows", 0)}
            self._heard[int(peer.get("rank", -1))] = time.monotonic()
            if self.decided:  # a task whose job started after the attempt ended: it stops, never trains
                self.channel.broadcast({"kind": Msg.STOP})
                return
            if len(self._addrs) == self.num_tasks and all(r in self._addrs for r in range(self.num_tasks)):
                # a resize asked before every task had connected reaches them all with the cluster (_resize)
                self.channel.broadcast({"kind": Msg.CLUSTER, "tasks": [self._addrs[r] for r in range(self.num_tasks)],
                                        "counts": self._counts, "resize": self.resizing})
            return
        # the channel thread: the file gets every line even while the display is behind
        self.runlog.message(peer, msg)
        self.q.put_message(peer, msg)

    def _on_feed(self, peer: dict, msg: dict) -> None:
        from ..data.feeding import agree_counts

        self._feed[int(peer.get("rank", -1))] = (int(msg.get("rows", 0)), bool(msg.get("done")))
        answer = agree_counts(self._feed, self.num_workers)
        # the smallest count at most 20 times a second (every answer goes to every task); the final at once
        if answer is not None and ("counts" in answer or time.monotonic() - self._feed_told >= 0.05):
            self._feed_told = time.monotonic()
            self.channel.broadcast(answer)

    def _log(self, life: _Life, msg: dict) -> None:
        lines = msg.get("lines")
        if type(lines) is not list:  # one line; a carriage-return update when partial
            lines = [msg.get("line", "")]
        life.line = str(lines[-1]) if lines else ""
        stream, partial, now = msg.get("stream"), msg.get("partial"), time.time()
        for line in lines:
            line = line if type(line) is str else str(line)
            if len(line) > _MAX_SHOWN_LINE:
                more = len(line) - _MAX_SHOWN_LINE
                line = f"{line[:_MAX_SHOWN_LINE]} … [{more} more characters in the run's log file]"
            # partial: a carriage-return update, which the next line of this task replaces
            data = {"stream": stream, "line": line, "partial": True} if partial else {"stream": stream, "line": line}
            self._show(RunEvent(events.LOG, life.job_name, life.task_index, data, now))

    def _job(self, spec) -> None:
        data = self.opts.data
        if data is not None and self.hooks.feeder is not None:
            source = data  # a feeder's DataFrame already has one partition per task
        elif data is not None:
            from ..data.feeding import split_for_workers

            source, self._counts = split_for_workers(data, self.num_workers, self.num_ps)
        else:
            n = self.num_workers if self.placement.ps is not None or self.placement.ps_on_driver else self.num_tasks
            source = self.spark.range(0, n, 1, n)
        run_jobs(self.spark, spec, self.placement, source, self.num_ps, self.tag, self.q.put)

    def _handle(self, peer: dict, msg: dict) -> None:
        """Every message from a task: its last sign of life, step, line and state, then what it tells the run."""
        rank, kind = int(peer.get("rank", -1)), msg.get("kind")
        life = self.lives.get(rank)
        if life is None:
            life = self.lives[rank] = _Life(peer.get("job_name", "?"), int(peer.get("task_index", -1)),
                                            peer.get("host", ""))
        if kind == Msg.DISCONNECTED:
            if not life.final and not self.decided and self.job_error is None and \
                    not any(not f.retryable for f in self.failures):
                # gone without a word, not killed by Spark after a failure: its executor or Python worker died
                self._lost(life, "the task ended without a report: its executor or Spark Python worker was lost")
            life.final = True
            return
        life.seen = time.monotonic()
        job, idx = life.job_name, life.task_index
        if kind == Msg.BATCH:  # what a task gathered over a short window, handled as one unit
            for m in msg.get("items") or ():
                if isinstance(m, dict):
                    self._handle(peer, m)
        elif kind == Msg.LOG:
            self._log(life, msg)
        elif kind == Msg.EVENT:
            data = msg.get("data") or {}
            if msg.get("event", events.PROGRESS) == events.PROGRESS:
                step = {k: data[k] for k in ("epoch", "step") if data.get(k) is not None}
                if step:
                    life.step = step
                    if life.first_epoch is None and isinstance(step.get("epoch"), int):
                        life.first_epoch = step["epoch"]
            if msg.get("event") == events.STATE and data.get("epoch_vote"):
                self.voters.add(rank)  # bookkeeping, nothing to show
                if data["epoch_vote"] == "boundary" and self._vote_check is None:
                    # a custom loop's worker joins at its first boundary: its peers reach theirs within the time
                    # their last collective step allows
                    self._vote_check = time.monotonic() + max(self.opts.failure_grace, _VOTE_SKEW)
                return
            if data.get("epoch_end") and rank in self.voters and self._vote_check is None:
                self._vote_check = time.monotonic() + self.opts.failure_grace
            self._show(RunEvent(msg.get("event", events.PROGRESS), job, idx, data))
        elif kind == Msg.STATE:
            life.state = str(msg.get("state", ""))
            life.final = life.final or life.state in ("done", "stopped")
            self._show(RunEvent(events.STATE, job, idx, {k: v for k, v in msg.items() if k != "kind"}))
            if msg.get("state") == "done":
                if job == "chief" and self.num_ps > 0:  # ps and worker tasks serve until the coordinator is done
                    self.channel.broadcast({"kind": Msg.STOP})
                self.done_ranks.add(rank)
                daemons = self.hooks.daemon_ranks
                if daemons and len(self.done_ranks - daemons) == self.num_tasks - len(daemons):
                    # daemon tasks (tfnb.compat's ps/evaluator) serve until every other task is done
                    self.channel.broadcast({"kind": Msg.STOP})
                elif len(self.done_ranks) == self.num_tasks and self.spec_kwargs.get("linger"):
                    # finished train_fn processes kept their TensorFlow servers up for the peers' last
                    # collectives; now that every task is done they may exit
                    self.channel.broadcast({"kind": Msg.END})
        elif kind == Msg.FAILED:
            life.final = True
            f = msg.get("failure") or {}
            failure = life.failure(f.get("exc_type", "Error"), f.get("message", ""), self.attempt,
                                   traceback=f.get("traceback", ""), exit_code=f.get("exit_code"))
            self.failures.append(failure)
            if f.get("boot"):  # the train_fn process could not import tfnb
                self.boot = self.boot or {**f, "host": failure.host, "child": True}
            self._show(RunEvent(events.FAILED, job, idx, {"exc_type": failure.exc_type, "message": failure.message}))
            self._trouble()  # the others keep running until _settled(): their reports decide the retry
        elif kind == Msg.STACK:
            life.stack = str(msg.get("text", ""))

    def run(self) -> _Outcome:
        from .._task.setup import TaskSpec
        from .channel import DriverChannel

        self.channel = DriverChannel(_driver_host(self.spark), self._on_message)
        spec = TaskSpec(channel=self.channel.address, token=self.channel.token, **self.spec_kwargs)
        job = threading.Thread(target=self._job, args=(spec,), name="tfnb-job", daemon=True)
        driver_ps = None
        try:
            if self.placement.ps_on_driver:
                driver_ps = DriverPs(spec, self.channel.address[0], self._driver_ps_died).start()
            job.start()
            return self._watch(job)
        finally:
            self.q.put(("closed",))  # lifts the queue's bound so the channel thread never waits on it
            self.channel.close()
            if driver_ps is not None:
                driver_ps.stop()
            self.runlog.close()

    def _driver_ps_died(self, rank: int, failure: dict) -> None:
        """A ps process on the driver ended with an error while the run needed it: a death, like a task's."""
        peer = {"job_name": "ps", "task_index": rank - (self.num_workers), "rank": rank, "host": "driver"}
        self.q.put_message(peer, {"kind": Msg.FAILED, "failure": failure})

    def _stop_everything(self, job: threading.Thread) -> None:
        from .spark import interrupt_jobs

        self.decided = True  # from here on, disconnects are tfnb's own stopping of the tasks
        self.channel.broadcast({"kind": Msg.STOP})
        try:
            interrupt_jobs(self.spark, self.tag)
        except Exception as e:  # noqa: BLE001 - the session may already be gone
            log.debug("interruptTag failed: %s", e)
        end = time.monotonic() + _CANCEL_WAIT
        while job.is_alive() and time.monotonic() < end:
            self._drain(0.2)
        self.channel.wait_disconnected(max(0.0, end - time.monotonic()))

    def _drain(self, timeout: float):
        """Handle the tasks' messages for up to _DRAIN_SLICE s; returns a driver item ("done", ...) if one came."""
        try:
            items = self.q.get_many(timeout)
        except queue.Empty:
            return None
        end = time.monotonic() + _DRAIN_SLICE
        self._batch, done = [], 0
        try:
            while True:
                for item in items:
                    if item[0] != "msg":
                        break  # the job's end: always the last of the items
                    done += 1  # an interrupted message is not handled twice
                    self._handle(item[1], item[2])
                    if len(self._batch) >= _SHOW_EVERY:
                        batch, self._batch = self._batch, []
                        show(self.display, batch)
                if item[0] != "msg" or time.monotonic() > end:
                    break
                try:
                    items, done = self.q.get_many(0), 0
                except queue.Empty:
                    break
        except BaseException:
            self.q.unget(items[done:])  # interrupted (Ctrl-C): the messages not reached wait for the next pass
            raise
        finally:
            batch, self._batch = self._batch, None
            show(self.display, batch)
        dropped, shown = self._dropped_shown
        if self.q.dropped > dropped and time.monotonic() - shown > 5.0:
            # progress reports merged while the driver was behind: say so, without repeating it often
            self._dropped_shown = (self.q.dropped, time.monotonic())
            self.display(RunEvent(events.PROGRESS, "driver", 0, {"dropped_progress": self.q.dropped}))
        return None if item[0] == "msg" else item

    def _watch(self, job: threading.Thread) -> _Outcome:
        try:
            while True:
                left = None if self.deadline is None else self.deadline - time.monotonic()
                if left is not None and left <= 0:
                    self._stop_everything(job)
                    raise RunTimeoutError(
                        "tfnb.run timed out; the job was cancelled and its processes stopped. Raise "
                        "timeout= (or TFNB_TIMEOUT), or checkpoint to model_dir and resume")
                if self.hooks.cancel is not None and self.hooks.cancel.is_set():
                    raise KeyboardInterrupt  # stopped and reported like the notebook's stop button
                if self.resize is not None and self.resize.is_set() and self.first_bad is None:
                    self._resize()
                one_sided = self._one_sided_vote()
                if one_sided is not None:
                    self._stop_everything(job)
                    return one_sided
                if self.first_bad is not None and self._settled():
                    return self._failed(job)
                stalled = self._stalled()
                if stalled:
                    return self._on_stall(job, stalled)
                late = exchange_overdue(self._heard, self.num_workers, self.num_ps, self.opts.ps_job_wait) \
                    if self.placement.ps is not None and self.first_bad is None else None
                if late is not None:  # other jobs hold the slots one of the run's two jobs needs
                    self._stop_everything(job)
                    failure = _Life("driver", 0).failure("ClusterError", str(late), self.attempt)
                    return _Outcome(failure=failure, error=late, cause=str(late).split(":")[0])
                item = self._drain(0.5 if left is None else min(0.5, left))
                if item is None:
                    continue
                if item[0] == "done":
                    self.channel.wait_disconnected(10.0)
                    self._drain_rest()
                    if self.failures or self.lost:
                        return self._failed(job)
                    import cloudpickle

                    values = [None] * self.num_tasks  # by rank: the chief's alone, unless hooks ask for all
                    for row in item[1]:
                        values[row["rank"]] = cloudpickle.loads(row["result"])
                    value = values if self.hooks.all_results else values[0]
                    return _Outcome(value=value, resumed_epoch=self._resumed_epoch())
                # the job failed: what the tasks report (until _settled) says more than Spark's wrapper text
                self.job_error = self.job_error or item[1]  # the first: a second is often its cancellation
                # tfnb's bootstrap could not start, or Spark's Python worker failed before it ran
                self.boot = self.boot or _boot_report(str(item[1]))
                self.refused = self.refused or refused_by_spark(str(item[1]))
                if _EXECUTOR_LOST.search(str(item[1])):
                    # "barrier task ResultTask(<stage>, <partition>) finished unsuccessfully": the partition is the rank
                    m = re.search(r"ResultTask\(\d+, (\d+)\)", str(item[1]))
                    first = next((l for l in str(item[1]).splitlines() if l.strip()), type(item[1]).__name__)
                    self._lost(self.lives.get(int(m.group(1))) if m else None, first.strip()[:500])
                self._trouble()
        except KeyboardInterrupt:
            while True:  # a second press of the stop button must not cut the cleanup short
                with contextlib.suppress(KeyboardInterrupt):
                    self._stop_everything(job)
                    break
            raise  # tfnb.run raises it as RunCancelledError

    def _lost(self, life: _Life | None, message: str) -> None:
        """A task (``life``; None: unknown) whose executor or Spark Python worker vanished."""
        self.lost.append((life or _Life("spark", -1)).failure("ExecutorLost", message, self.attempt))
        self._trouble()

    def _trouble(self) -> None:
        if self.first_bad is None:
            self.first_bad = time.monotonic()

    def _settled(self) -> bool:
        """Enough is known to decide the attempt's outcome (or the failure grace is over)."""
        if self.boot or self.refused or any(f.died or f.exc_type == _RESIZE for f in self.failures):
            return True  # nothing else that arrives changes the verdict
        if self.lost:
            # Let Spark declare the executor lost (the job fails) before cancelling, or the relaunch
            # may be scheduled on the executor that is gone.
            return self.job_error is not None or time.monotonic() >= self.first_bad + self.opts.failure_grace
        if self.lives and len(self.lives) >= self.num_tasks and all(l.final for l in self.lives.values()):
            return True
        return time.monotonic() >= self.first_bad + self.opts.failure_grace

    def _verdict(self) -> tuple[TaskFailure, bool]:
        """(the failure that explains the attempt, whether a relaunch may fix it). A death wins (the other errors
        are its consequences); else a plain exception is a bug; only peer-loss errors alone are bad luck."""
        deaths = sorted((f for f in (*self.failures, *self.lost) if f.died),
                        key=lambda f: (f.task_index < 0, f.exc_type != "ProcessDied"))
        if deaths:
            return deaths[0], True
        bugs = [f for f in self.failures if not f.retryable]
        if bugs:
            return bugs[0], False
        if self.failures:
            return self.failures[0], True
        return _spark_failure(self.job_error, self.attempt), True

    def _epoch_of(self, failure: TaskFailure) -> int | None:
        own = next((l for l in self.lives.values() if (l.job_name, l.task_index) ==
                    (failure.job_name, failure.task_index)), None)
        if own is not None and isinstance(own.step.get("epoch"), int):
            return own.step["epoch"]
        return max((l.step["epoch"] for l in self.lives.values() if isinstance(l.step.get("epoch"), int)), default=None)

    def _resumed_epoch(self) -> int | None:
        return min((l.first_epoch for l in self.lives.values() if l.first_epoch is not None), default=None)

    def _failed(self, job: threading.Thread) -> _Outcome:
        failure, retryable = self._verdict()
        self.decided = True
        if job.is_alive() or self.channel.connected:
            self._stop_everything(job)
        self._drain_rest()
        others = tuple(f for f in self.failures if f is not failure)
        if self.boot or self.refused:
            error = _boot_error(_locate(self.spark, self.boot, self.num_tasks), self.opts.max_attempts) \
                if self.boot else _refusal_error(self.refused, self.placement.worker_profile)
            return _Outcome(failure=failure, others=others, error=error, cause=str(error).split(";")[0])
        epoch = self._epoch_of(failure)
        if not failure.died and any(f.exc_type == _RESIZE for f in self.failures):
            # every worker stopped at the same epoch boundary (tfnb._task.resize): a resize, nothing failed
            return _Outcome(failure=failure, resize=True, cause="resized", epoch=epoch,
                            resumed_epoch=self._resumed_epoch())
        return _Outcome(failure=failure, others=others, retryable=retryable,
                        cause=_cause(failure, retryable, epoch), epoch=epoch,
                        resumed_epoch=self._resumed_epoch())

    def _resize(self) -> None:
        """The elastic watch set ``resize``: the tasks stop at their next epoch boundary. Tasks still starting hear
        it with the cluster's addresses: set first, broadcast second, so each hears it one way or the other."""
        self.resize = None
        self.resizing = True
        self.runlog.note("the run is resized: the tasks stop at their next epoch boundary")
        self.channel.broadcast({"kind": Msg.RESIZE})

    def _one_sided_vote(self) -> _Outcome | None:
        """An elastic run where some workers take no part in the epoch-boundary vote (a collective: the run would
        hang or fail there). Checked once: a grace after a voter's first epoch end, _VOTE_SKEW after a custom loop's
        worker joined at its first boundary, or at a failure after either (which the one-sided vote explains)."""
        if self._vote_check in (None, float("inf")) or time.monotonic() < self._vote_check and self.first_bad is None:
            return None
        self._vote_check = float("inf")  # checked
        missing = [r for r in range(self.num_workers) if r not in self.voters]
        if not missing or self.num_ps:
            return None
        label = lambda r: self.lives[r].label if r in self.lives else f"rank {r}"  # noqa: E731
        voters = ", ".join(label(r) for r in sorted(self.voters))
        absent = ", ".join(label(r) for r in missing)
        error = ConfigError(
            f"{absent} {'takes' if len(missing) == 1 else 'take'} no part in this elastic run's epoch-boundary vote, "
            f"which {voters} {'takes' if len(self.voters) == 1 else 'take'} at every epoch start: a collective, so "
            "the run would hang or fail there. Add ctx.progress_callback() to model.fit(callbacks=[...]) on every "
            "worker, not only on the chief (a custom loop: call ctx.epoch_boundary(strategy, epoch) on every worker)")
        failure = self.lives.get(missing[0], _Life("worker", missing[0])).failure("ConfigError", str(error),
                                                                                   self.attempt)
        self.runlog.note(str(error))
        return _Outcome(failure=failure, error=error, cause=str(error).split(":")[0])

    def _stalled(self) -> list[_Life]:
        """Tasks whose train_fn runs but has sent nothing for stall_timeout, quietest first."""
        if not self.opts.stall_timeout or self.first_bad is not None:
            return []
        now = time.monotonic()
        # ps servers and tfnb.compat's daemon tasks are silent by design
        silent = [l for rank, l in self.lives.items() if l.state == "training" and not l.final
                  and rank not in self.hooks.daemon_ranks and now - l.seen > self.opts.stall_timeout]
        return sorted(silent, key=lambda l: l.seen)

    def _on_stall(self, job: threading.Thread, stalled: list[_Life]) -> _Outcome:
        now = time.monotonic()
        worst = stalled[0]
        seconds = now - worst.seen
        message = f"silent for {seconds:.0f} s (no progress event, no output line)"
        if len(stalled) > 1:  # peers of a hung collective go quiet together
            message += "; also silent: " + ", ".join(l.label for l in stalled[1:])
        failure = worst.failure(STALLED, message, self.attempt)
        epoch, stall = self._epoch_of(failure), {"seconds": seconds, "last_step": dict(worst.step),
                                                 "last_line": worst.line}
        for life in stalled:
            self.display(RunEvent(events.STATE, life.job_name, life.task_index,
                                  {"state": "stalled", "seconds": round(now - life.seen, 1)}))
        # Every train_fn process dumps its stack: in a hung collective the stalled task's peers tell as much.
        running = [l for l in self.lives.values() if not l.final]
        for life in running:
            life.stack = None
        self.channel.broadcast({"kind": Msg.DUMP})
        end = now + _STACK_WAIT
        while any(l.stack is None for l in running) and time.monotonic() < end:
            self._drain(0.1)
        stall["stacks"] = {l.label: l.stack for l in running if l.stack}
        failure = dataclasses.replace(failure, traceback=worst.stack or "")
        self._stop_everything(job)
        self._drain_rest()
        return _Outcome(failure=failure, retryable=True, cause=_cause(failure, True, epoch), epoch=epoch,
                        resumed_epoch=self._resumed_epoch(), stall=stall)

    def _drain_rest(self) -> None:
        while self.q.qsize():
            self._drain(0)
