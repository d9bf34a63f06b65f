"""daemon_runtime.runner.CoreRunner around a tiny sans-I/O core (a real core, not a mock of
the runner): dispatch by type, order, timer re-arm and cancel, the guard, async executors."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from daemon_runtime.runner import Core, CoreRunner


@dataclass
class Send:
    data: bytes


@dataclass
class UrgentSend(Send):
    pass


@dataclass
class Lookup:
    key: str


@dataclass
class Happened:
    what: str


class EchoCore:
    """Echoes every datagram as a Send, announces it as Happened; `wake_at(t, now)` asks for
    the timer at t; at the timer it emits Happened("timer"). No I/O, no clock."""

    def __init__(self):
        self.out: list = []
        self.timer: float | None = None
        self.fired: list[float] = []
        self.nows: list[float] = []

    def receive(self, data: bytes, *, now: float) -> int:
        self.nows.append(now)
        if data == b"bad":
            raise ValueError("bad datagram")
        self.out.append(UrgentSend(data) if data.startswith(b"!") else Send(data))
        self.out.append(Happened(f"got {data!r}"))
        return len(data)

    def lookup(self, key: str, *, now: float) -> None:
        self.out.append(Lookup(key))

    def wake_at(self, t: float | None, *, now: float) -> None:
        self.timer = t

    def next_event(self):
        return self.out.pop(0) if self.out else None

    def get_timer(self) -> float | None:
        return self.timer

    def handle_timer(self, now: float) -> None:
        self.fired.append(now)
        if self.timer is not None and now >= self.timer:
            self.timer = None
            self.out.append(Happened("timer"))


class Wall:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(core, **kw):
    lines: list[tuple[str, str]] = []
    bugs: list[int] = []
    done: list = []
    kw.setdefault("executors", {Send: done.append})
    kw.setdefault("on_event", done.append)
    runner = CoreRunner(core, log=lambda where, exc, src: lines.append((where, type(exc).__name__)),
                        bug_metric=lambda where, exc: bugs.append(1), name="test", **kw)
    return runner, done, lines, bugs


def test_the_core_satisfies_the_protocol():
    assert isinstance(EchoCore(), Core)


async def test_dispatch_by_type_in_order_and_subclasses_take_the_base_executor():
    core = EchoCore()
    runner, done, lines, bugs = make(core, wall=Wall())
    assert runner.feed(core.receive, b"a") == 1
    assert runner.feed(core.receive, b"!b") == 2
    assert done == [Send(b"a"), Happened("got b'a'"), UrgentSend(b"!b"), Happened("got b'!b'")]
    assert core.nows == [1_700_000_000.0] * 2      # now: the wall clock, as a keyword
    assert runner._handlers[UrgentSend] is runner._handlers[Send]   # MRO walked once, cached
    assert lines == [] and bugs == []


async def test_an_item_nobody_takes_is_a_bug_and_the_pass_goes_on():
    core = EchoCore()
    runner, done, lines, bugs = make(core, on_event=None)
    runner.feed(core.receive, b"a")
    assert done == [Send(b"a")]
    assert lines == [("Happened", "LookupError")] and bugs == [1]


async def test_feed_propagates_the_inputs_error_after_the_pass():
    core = EchoCore()
    runner, done, lines, bugs = make(core)
    core.out.append(Happened("before"))
    with pytest.raises(ValueError):
        runner.feed(core.receive, b"bad")
    assert done == [Happened("before")]            # the pass ran anyway
    assert bugs == []                               # the input boundary decides, not the guard


async def test_executor_exceptions_are_counted_logged_once_per_window_and_the_daemon_continues():
    core = EchoCore()

    def send(item):
        raise OSError("socket gone")

    done: list = []
    runner, _, lines, bugs = make(core, executors={Send: send}, on_event=done.append)
    for i in range(5):
        runner.feed(core.receive, b"x%d" % i)
    assert len(bugs) == 5                          # every one counted
    assert lines == [("Send", "OSError")]           # one line per (where, type) per window
    assert [e.what for e in done] == [f"got b'x{i}'" for i in range(5)]   # the rest went on


async def test_the_bug_window_lets_the_next_line_through_after_it_ends():
    core = EchoCore()
    runner, _, lines, bugs = make(core, executors={Send: lambda item: 1 / 0}, bug_window=0.01)
    runner.feed(core.receive, b"a")
    await asyncio.sleep(0.02)
    runner.feed(core.receive, b"b")
    assert lines == [("Send", "ZeroDivisionError")] * 2 and len(bugs) == 2


async def test_the_timer_is_armed_at_the_core_deadline_on_the_loop_clock_and_fires():
    core = EchoCore()
    wall = Wall()
    runner, done, lines, bugs = make(core, wall=wall)
    loop = asyncio.get_running_loop()
    runner.feed(core.wake_at, wall.t + 30.0)
    assert runner.deadline == wall.t + 30.0
    assert runner._timer.when() - loop.time() == pytest.approx(30.0, abs=1.0)   # deadline - now
    runner.feed(core.wake_at, wall.t + 60.0)       # moved: the old timer is replaced
    assert runner.deadline == wall.t + 60.0
    assert runner._timer.when() - loop.time() == pytest.approx(60.0, abs=1.0)
    runner.feed(core.wake_at, None)                # gone: cancelled
    assert runner.deadline is None and runner._timer is None
    runner.feed(core.wake_at, wall.t - 5.0)        # already due: delay 0
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert core.fired == [wall.t] and done[-1] == Happened("timer")
    assert runner.deadline is None and runner._timer is None


async def test_the_same_deadline_keeps_the_armed_timer():
    core = EchoCore()
    runner, *_ = make(core, wall=Wall())
    runner.feed(core.wake_at, 2e9)
    handle = runner._timer
    runner.feed(core.receive, b"a")
    assert runner._timer is handle


async def test_handle_timer_errors_go_to_the_guard_and_the_timer_is_re_armed():
    class Broken(EchoCore):
        def handle_timer(self, now):
            super().handle_timer(now)
            raise RuntimeError("timer bug")

    core = Broken()
    wall = Wall()
    runner, done, lines, bugs = make(core, wall=wall)
    runner.feed(core.wake_at, wall.t)
    core_timer = wall.t + 100.0
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert lines == [("timer", "RuntimeError")]
    assert done == [Happened("timer")]             # what it emitted before is dispatched
    runner.feed(core.wake_at, core_timer)
    assert runner.deadline == core_timer
    runner.close()
    assert runner._timer is None


async def test_async_executors_run_as_tracked_tasks_and_their_errors_go_to_the_guard():
    core = EchoCore()
    found: list[str] = []

    async def lookup(item: Lookup) -> None:
        await asyncio.sleep(0)
        if item.key == "missing":
            raise KeyError(item.key)
        found.append(item.key)
        runner.feed(core.receive, item.key.encode())   # the answer goes back as an input

    done: list = []
    runner, _, lines, bugs = make(core, executors={Lookup: lookup, Send: done.append}, on_event=done.append)
    runner.feed(core.lookup, "alice")
    runner.feed(core.lookup, "missing")
    assert len(runner.tasks) == 2
    await asyncio.gather(*list(runner.tasks), return_exceptions=True)
    await asyncio.sleep(0)
    assert found == ["alice"] and done[0] == Send(b"alice")
    assert lines == [("task lookup", "KeyError")] and bugs == [1]
    assert not runner.tasks


async def test_drain_hooks_run_before_the_events_with_now():
    core = EchoCore()
    seen: list = []
    runner, done, *_ = make(core, wall=Wall(5.0), drain=[lambda now: seen.append(("hook", now, list(done)))])
    runner.feed(core.receive, b"a")
    assert seen == [("hook", 5.0, [])] and len(done) == 2


async def test_pump_soon_coalesces_and_close_cancels_tasks():
    core = EchoCore()
    runner, done, *_ = make(core)
    core.out.append(Happened("one"))
    runner.pump_soon()
    runner.pump_soon()
    assert done == []
    await asyncio.sleep(0)
    assert done == [Happened("one")]
    task = runner.spawn(asyncio.sleep(3600))
    await runner.aclose()
    assert task.cancelled() and not runner.tasks


def test_a_runner_can_be_built_before_the_loop_runs_and_pump_soon_can_wait():
    core = EchoCore()
    runner, done, *_ = make(core)                  # no running loop here

    async def main():
        core.out.append(Happened("later"))
        runner.pump_soon(0.01)
        runner.pump_soon()                         # coalesced with the pending one
        await asyncio.sleep(0)
        assert done == []
        await asyncio.sleep(0.05)
        assert done == [Happened("later")]
    asyncio.run(main())


# ------------------------------------------------------------------ ordered mode
class StoreCore(EchoCore):
    """EchoCore whose `stored(data)` input (the answer to an awaited Send) emits
    Happened("stored ...")."""

    def stored(self, data: bytes, *, now: float) -> None:
        self.out.append(Happened(f"stored {data!r}"))


def test_ordered_mode_awaits_each_input_in_order_follow_ups_first_others_unblocked():
    """An awaited executor holds the rest of ITS caller's items (and its follow-ups run
    before them), while another caller's input is executed meanwhile."""
    async def main():
        core = StoreCore()
        trace: list[str] = []
        gates: dict[bytes, asyncio.Event] = {}

        async def store(item: Send) -> None:
            trace.append(f"send {item.data!r} by {runner.current}")
            if item.data.startswith(b"slow"):
                gates[item.data] = asyncio.Event()
                await gates[item.data].wait()
            runner.feed(core.stored, item.data)          # the follow-up

        runner = CoreRunner(core, executors={Send: store}, ordered=True,
                            on_event=lambda ev: trace.append(ev.what))
        runner.feed(core.receive, b"slow1")
        runner.feed(core.receive, b"x")                  # same caller: behind slow1
        assert trace == [] and len(runner.pending) == 4  # a pass only collects
        first = asyncio.ensure_future(runner.execute("conn-1"))
        await asyncio.sleep(0)
        assert trace == ["send b'slow1' by conn-1"]
        runner.feed(core.receive, b"y")                  # another caller, not blocked
        await runner.execute("conn-2")
        assert trace[1:] == ["send b'y' by conn-2", "stored b'y'", "got b'y'"]
        gates[b"slow1"].set()
        await first
        assert trace[4:] == ["stored b'slow1'", "got b'slow1'", "send b'x' by conn-1",
                             "stored b'x'", "got b'x'"]
        assert runner.pending == [] and not runner.tasks
        # what the caller served is not kept past its execute() (it held the relay's last
        # served connection alive: its WebSocket, request handler and transport)
        assert runner.current is None
    asyncio.run(main())


def test_ordered_mode_timer_pass_gets_a_task_and_feed_now_leaves_others_pending():
    async def main():
        core = StoreCore()
        trace: list[str] = []
        bugs: list[str] = []

        def send(item: Send):
            if item.data == b"boom":
                raise RuntimeError("executor bug")
            trace.append(f"send {item.data!r}")

        runner = CoreRunner(core, executors={Send: send}, ordered=True,
                            on_event=lambda ev: trace.append(ev.what),
                            log=lambda where, exc, src: bugs.append(where))
        runner.feed(core.receive, b"a")                  # left for its caller
        runner.feed_now(core.receive, b"b")              # dispatched at once
        assert trace == ["send b'b'", "got b'b'"] and len(runner.pending) == 2
        core.out.append(Send(b"boom"))
        core.out.append(Happened("after boom"))
        runner.pump()                                    # not fed by a caller: a task runs it
        assert len(runner.tasks) == 1
        await asyncio.gather(*runner.tasks)
        assert trace[2:] == ["send b'a'", "got b'a'", "after boom"] and bugs == ["Send"]
        runner.feed(core.wake_at, 0.0)
        await asyncio.sleep(0.01)                        # the timer's pass, executed by a task
        await asyncio.gather(*runner.tasks)
        assert trace[-1] == "timer" and runner.pending == []
        runner.close()
    asyncio.run(main())


async def test_dispatch_drains_a_sub_core_by_type_skipping_and_guarding_as_asked():
    bugs: list = []
    runner = CoreRunner(EchoCore(), log=lambda where, exc, src: None,
                        bug_metric=lambda where, exc: bugs.append((where, type(exc).__name__)))
    sub = EchoCore()
    for d in (b"a", b"!b", b"c"):
        sub.receive(d, now=0.0)
    got: list = []

    def on_send(item):
        if item.data == b"a":
            raise KeyError("a")
        got.append(item.data)

    table: dict = {}
    runner.dispatch(sub.next_event, table, lambda t: on_send if issubclass(t, Send) else None, where="event")
    assert got == [b"!b", b"c"]                    # Happened skipped, the bug did not stop the drain
    assert bugs == [("event", "KeyError")] and table[Happened] is None and table[UrgentSend] is on_send
    sub.receive(b"a", now=0.0)
    with pytest.raises(KeyError):                  # guard=False: the caller's guard decides
        runner.dispatch(sub.next_event, table, guard=False)
    assert len(bugs) == 1


def test_the_shared_guard_logs_every_line_without_a_window_and_never_raises(capsys):
    from daemon_runtime.guard import Guard
    lines, counted = [], []
    full = Guard(lambda where, exc, src: lines.append((where, src)), lambda where, exc: counted.append(where),
                 window=None)
    for _ in range(3):
        full.bug(ValueError("x"), "frame", "peer")
    assert lines == [("frame", "peer")] * 3 and counted == ["frame"] * 3
    limited = Guard(lambda where, exc, src: lines.append(where), window=60.0)
    limited.bug(ValueError("x"), "timer")
    limited.bug(ValueError("y"), "timer")
    limited.bug(KeyError("z"), "timer")
    assert lines[3:] == ["timer", "timer"]         # one per (where, type) per window
    Guard(lambda where, exc, src: 1 / 0).bug(ValueError("x"), "sink")   # a broken sink: not raised,
    err = capsys.readouterr().err                                        # but told on stderr
    assert "bug at sink: ValueError('x')" in err and "ZeroDivisionError" in err
