"""The one loop every daemon runs around its sans-I/O core (DESIGN.md section 2: cores do
no I/O and read no clock; adapters are thin), shaped like aioquic's asyncio protocol
(`aioquic/asyncio/protocol.py`: feed an input, transmit, drain events, re-arm one timer).

    runner = CoreRunner(core, executors={SendFrame: send, LookupTwin: lookup},
                        on_event=catalogue_hook, log=bug_line, bug_metric=count_bug,
                        name="rmb-peer")
    runner.feed(core.receive_frame, frame, peer)   # core.receive_frame(frame, peer, now=now)
    runner.pump()                                  # after any input fed another way
    runner.close()                                 # on shutdown (or: await runner.aclose())

The core (`Core` below) takes its inputs as its own methods with a `now` keyword, and hands
its outputs back, in order, from `next_event()` (None when there are none left): commands
(things the adapter must do: write a frame, start a lookup) and events (things that
happened: logged and counted). One `get_timer()` deadline says when it next wants
`handle_timer(now)`.

A pass (`pump()`): the `drain` hooks run first, each called as `hook(now)` (for cores that
hand out some output another way, e.g. Marlin's `frames_to_send(now)` and `next_job()`);
then every item of `next_event()` is dispatched (`dispatch()`, the one drain loop, which
an adapter also uses for the sub-cores its core is made of, e.g. REMP's) by its exact type (the MRO is walked once
per type, the answer cached): to the executor registered for it (commands) or, when none
is, to `on_event` (events: the protocol's catalogue turns one into log lines and metrics);
an item nobody takes is a bug. An executor that returns an awaitable gets it run as a
tracked task. Then the timer is re-armed: cancelled when `get_timer()` is None, left as it
is when the deadline did not change, else replaced.

The clock rule (one for every daemon): a core's `now` is unix seconds from the wall clock
(`time.time()`, the runner's `wall`), because cores compare it with timestamps carried on
the wire (attestations, envelope expiry, receipts) that other machines wrote; a core's
deadline (`get_timer()`) is therefore unix seconds too. The runner arms its one asyncio
timer on the loop's monotonic clock with the delay `deadline - now` (never negative), so a
wall-clock step moves at most the timer that is armed when it happens. Rate limiting of the
bug log uses the loop's monotonic clock.

Ordered mode (`ordered=True`, for adapters whose commands do I/O that must finish before
the next command of the same input, e.g. the RMB relay: an offline-queue XADD before the
next one keeps per-sender order): a pass only collects the core's items into `pending`;
the caller that fed the input executes them with `await runner.execute(current)`, in
order, awaiting each executor's awaitable before the next item, and the items the core
produced meanwhile (an executor's own feed, a write that failed) run next, ahead of the
rest (as a nested pass would). Each caller executes only what it took, in its own task
(the relay: one read loop per connection, one task per twin lookup), so an awaited
executor holds that caller's later items, not unrelated traffic. `current` (what the
caller serves, e.g. its connection) is `runner.current` while an executor is called.
Items of a pass nobody executes (the timer's, `execute_soon()`) get a tracked task.
`feed_now(fn, *args)` dispatches that input's own items at once instead (awaitables become
tasks), leaving items other inputs left pending in place.

The guard (one for every daemon, `daemon_runtime.guard.Guard`): `bug(exc, where, src)`
counts the exception (`bug_metric(where, exc)`) and writes one log line per (where,
exception type) per `bug_window` seconds through `daemon_runtime.ratelimit.LogLimiter`; the
daemon continues.
Exceptions of an executor, an `on_event` hook, a drain hook, `next_event`/`get_timer`,
`handle_timer` and of a spawned task go to it. `feed` lets the input's own exception
propagate (after the pass): the adapter's input boundary decides whether it is a remote
error (a counted drop) or a bug.
"""
from __future__ import annotations

import asyncio
import inspect
import sys
import time
import traceback
from typing import Any, Awaitable, Callable, Iterable, Mapping, Protocol, runtime_checkable

from .guard import BUG_WINDOW, Guard

__all__ = ["Core", "CoreRunner", "BUG_WINDOW"]

_UNSEEN = object()      # dispatch(): a type not yet in the handler table


@runtime_checkable
class Core(Protocol):
    """What the runner needs of a sans-I/O core (its inputs are its own methods taking
    `now`, unix seconds)."""

    def next_event(self) -> Any | None:
        """The next command or event, in the order the core produced them; None: none left."""

    def get_timer(self) -> float | None:
        """Unix seconds at which `handle_timer` is next due; None: no timer."""

    def handle_timer(self, now: float) -> None:
        """Whatever was due by `now` (unix seconds); called at or after `get_timer()`."""


def _default_log(name: str) -> Callable[[str, BaseException, str | None], None]:
    def log(where: str, exc: BaseException, src: str | None) -> None:
        print(f"{name} bug (daemon continues): " + "".join(
            traceback.format_exception(type(exc), exc, exc.__traceback__)), file=sys.stderr, flush=True)
    return log


class CoreRunner:
    """CoreRunner(core, *, executors={Type: fn(item)}, on_event=fn(event) | None,
    log=fn(where, exc, src) | None, bug_metric=fn(where, exc) | None, name="daemon",
    drain=(fn(now), ...), wall=time.time, bug_window=BUG_WINDOW, ordered=False): see the
    module doc.

    The loop is the one running when the runner first needs it (a pass, a timer, a task),
    so a runner may be built before the loop runs. `log` writes the one bug line (default:
    the traceback on stderr, prefixed "<name> bug (daemon continues): "); `bug_metric`
    counts every bug, logged or not."""

    def __init__(self, core: Core, *, executors: Mapping[type, Callable[[Any], Any]] | None = None,
                 on_event: Callable[[Any], Any] | None = None,
                 log: Callable[[str, BaseException, str | None], None] | None = None,
                 bug_metric: Callable[[str, BaseException], None] | None = None, name: str = "daemon",
                 drain: Iterable[Callable[[float], None]] = (),
                 wall: Callable[[], float] = time.time, bug_window: float = BUG_WINDOW,
                 ordered: bool = False):
        self.core = core
        self.name = name
        self.executors = dict(executors or {})
        self.on_event = on_event
        #: the guard (module doc): `bug(exc, where="loop", src=None)` counts, logs one line
        #: per (where, exception type) per bug_window and never raises
        self.guard = Guard(log or _default_log(name), bug_metric, bug_window)
        self.bug = self.guard.bug
        self.drain = list(drain)
        self.wall = wall
        self._loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task] = set()
        self._handlers: dict[type, Callable[[Any], Any]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._deadline: float | None = None
        self._soon = False
        self._closed = False
        #: ordered mode (module doc): items collected by passes, executed by execute()
        self.ordered = ordered
        self.pending: list[Any] = []
        #: what the caller of execute() serves (its `current`), while an executor is called
        self.current: Any = None
        self._feeding = False
        self._background = False

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    # ------------------------------------------------------------------ inputs
    def now(self) -> float:
        """The core's `now`: unix seconds (the clock rule)."""
        return self.wall()

    def feed(self, fn: Callable[..., Any], *args: Any) -> Any:
        """fn(*args, now=now) (an input method of the core), then a pass. Returns what fn
        returns; fn's exception propagates, after the pass. Ordered mode: the pass collects
        the items into `pending` for the caller's execute()."""
        feeding, self._feeding = self._feeding, True
        try:
            return fn(*args, now=self.wall())
        finally:
            self.pump()
            self._feeding = feeding

    def feed_now(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Ordered mode: fn(*args, now=now), then its own items are dispatched at once (an
        awaitable an executor returns runs as a tracked task); items other inputs left in
        `pending` stay there. Returns what fn returns; fn's exception propagates."""
        mark = len(self.pending)
        try:
            return self.feed(fn, *args)
        finally:
            items = self.pending[mark:]
            del self.pending[mark:]
            for item in items:
                try:
                    result = self._handler(type(item))(item)
                    if result is not None and inspect.isawaitable(result):
                        self.spawn(result)
                except Exception as exc:
                    self.bug(exc, type(item).__name__)

    async def execute(self, current: Any = None) -> None:
        """Ordered mode: executes every item in `pending` (taken at once, so concurrent
        callers never interleave one input's items), in order; an executor's awaitable is
        awaited before the next item; items the core produced meanwhile run next, ahead of
        the rest. An executor's exception goes to the guard and the next item runs."""
        items = self.pending
        if not items:
            return
        self.pending = []
        handlers = self._handlers
        i = 0
        while i < len(items):
            item = items[i]
            i += 1
            t = type(item)
            self.current = current
            try:
                result = (handlers.get(t) or self._resolve(t))(item)
                if result is not None:
                    await result
            except Exception as exc:
                self.bug(exc, t.__name__)
            if self.pending:
                items[i:i] = self.pending
                self.pending = []
        # not kept past the call: it held the last served connection (its WebSocket, handler
        # and transport) alive until the next execute()
        self.current = None

    def execute_soon(self) -> None:
        """Ordered mode: a tracked task executes `pending` once the running callback or
        task yields (one task for several calls before it starts)."""
        if not self._background:
            self._background = True
            self.spawn(self._execute_background(), "core timer")

    async def _execute_background(self) -> None:
        self._background = False
        await self.execute()

    # ------------------------------------------------------------------ the pass
    def pump(self) -> None:
        """Drain hooks, dispatch every item of next_event(), re-arm the timer. Never raises."""
        core = self.core
        try:
            if self.drain:
                now = self.wall()
                for hook in self.drain:
                    hook(now)
            if self.ordered:
                pending = self.pending
                pending.extend(iter(core.next_event, None))    # collected, for execute()
                if pending and not self._feeding:
                    self.execute_soon()
            else:
                self.dispatch(core.next_event, self._handlers, self._resolve)
            deadline = core.get_timer()
        except Exception as exc:
            self.bug(exc, "pump")
            return
        if deadline != self._deadline and not self._closed:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._deadline = deadline
            if deadline is not None:
                self._timer = self.loop.call_later(max(0.0, deadline - self.wall()), self._fire)

    def dispatch(self, next_event: Callable[[], Any], handlers: dict[type, Callable[[Any], Any] | None],
                 resolve: Callable[[type], Callable[[Any], Any] | None] | None = None, *,
                 where: str | None = None, guard: bool = True) -> None:
        """Every item of `next_event()` (until None), in order, to its handler by exact
        type: `handlers[type]`, else `resolve(type)` (stored in `handlers`; a None handler
        skips the items of that type; no `resolve`: None). An awaitable a handler returns
        runs as a tracked task. guard=True: a handler's exception goes to the guard (as
        `where`, default the item's type name) and the next item goes on; guard=False: it
        propagates. `next_event`'s own exception propagates. The pass runs the core's items
        through it; an adapter whose core is made of sub-cores drains each one with it."""
        while (item := next_event()) is not None:
            t = type(item)
            handler = handlers.get(t, _UNSEEN)
            if handler is _UNSEEN:
                handler = handlers[t] = resolve(t) if resolve is not None else None
            if handler is None:
                continue
            if not guard:
                result = handler(item)
                if result is not None and inspect.isawaitable(result):
                    self.spawn(result)
                continue
            try:
                result = handler(item)
                if result is not None and inspect.isawaitable(result):
                    self.spawn(result)
            except Exception as exc:
                self.bug(exc, where or t.__name__)

    def pump_soon(self, delay: float = 0.0) -> None:
        """One pass once the running callback or task yields, or `delay` seconds later
        (several calls before it, one pass): for inputs that arrive in slices, so a slice's
        output is dispatched once."""
        if not self._soon:
            self._soon = True
            if delay > 0:
                self.loop.call_later(delay, self._pump_deferred)
            else:
                self.loop.call_soon(self._pump_deferred)

    def _pump_deferred(self) -> None:
        self._soon = False
        self.pump()

    def _handler(self, t: type) -> Callable[[Any], Any]:
        return self._handlers.get(t) or self._resolve(t)

    def _resolve(self, t: type) -> Callable[[Any], Any]:
        for base in t.__mro__:
            fn = self.executors.get(base)
            if fn is not None:
                break
        else:
            fn = self.on_event if self.on_event is not None else self._unhandled
        self._handlers[t] = fn
        return fn

    def _unhandled(self, item: Any) -> None:
        raise LookupError(f"{self.name}: no executor for {type(item).__name__} and no on_event")

    def _fire(self) -> None:
        self._timer = None
        self._deadline = None
        try:
            self.core.handle_timer(self.wall())
        except Exception as exc:
            self.bug(exc, "timer")
        self.pump()

    @property
    def deadline(self) -> float | None:
        """The armed timer's deadline (unix seconds), None when none is armed."""
        return self._deadline

    # ------------------------------------------------------------------ tasks
    def spawn(self, aw: Awaitable[Any], where: str | None = None) -> asyncio.Task:
        """Run `aw` as a task the runner keeps until it ends; its exception goes to the
        guard (as `where`, default "task <coroutine name>") and is followed by a pass (what
        the core emitted before it is dispatched)."""
        task = self.loop.create_task(aw) if inspect.iscoroutine(aw) else asyncio.ensure_future(aw)
        self.tasks.add(task)
        task.add_done_callback(lambda t: self._task_done(t, where))
        return task

    def _task_done(self, task: asyncio.Task, where: str | None = None) -> None:
        self.tasks.discard(task)
        if task.cancelled() or task.exception() is None:
            return
        if where is None:
            coro = getattr(task, "get_coro", lambda: None)()
            where = f"task {getattr(coro, '__name__', '?')}"
        self.bug(task.exception(), where)
        if not self._closed:
            self.pump()

    # ------------------------------------------------------------------ shutdown
    def close(self, tasks: bool = True) -> None:
        """Cancel the timer and (tasks=True) every task; no timer is armed afterwards.
        close(tasks=False) lets the tasks run on (an adapter's drain), to be cancelled by a
        later close()."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._deadline = None
        if tasks:
            for t in list(self.tasks):
                t.cancel()

    async def aclose(self) -> None:
        """close(), then wait for the cancelled tasks to end."""
        tasks = list(self.tasks)
        self.close()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
