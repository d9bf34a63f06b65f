"""Property test (hypothesis) of the relay core's remote input: whatever bytes a connected
peer sends, RelayCore.receive_frame never raises; it answers, drops or closes (commands
only), and the session stays usable unless the core closed it."""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings, strategies as st

from rmb_relay.core import CloseConnection, Log, RelayCommand, RelayCore, WriteFrame
from tests.test_relay_core import T0, make_env

HERE = "relay.here:1"


@dataclass
class Rec:
    relays: list


def _core():
    core = RelayCore([HERE], max_size=2048)
    core.peer_connected("A", (1, None), T0)
    core.queue_replayed("A", T0)
    core.peer_connected("B", (2, None), T0)
    core.queue_replayed("B", T0)
    core.twin_resolved(3, Rec([HERE]), T0)
    core.take()
    return core


VALID = [make_env(src=(1, None), dst=(d, None), kind=k).SerializeToString()
         for d in (2, 3, 4) for k in ("request", "response", "ping")]


def _mutations():
    def mutate(args):
        base, pos, byte, cut = args
        data = bytearray(base)
        if data:
            data[pos % len(data)] = byte
        return bytes(data[: max(0, len(data) - cut)])
    return st.tuples(st.sampled_from(VALID), st.integers(0, 4096), st.integers(0, 255),
                     st.integers(0, 40)).map(mutate)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.binary(max_size=3000), _mutations()), min_size=1, max_size=8))
def test_receive_frame_only_ever_produces_commands(frames):
    core = _core()
    for data in frames:
        if core.state_of((1, None)) is None:
            break                               # closed by the core: no more frames
        core.receive_frame("A", data, T0 + 1)
        cmds = core.take()
        assert all(isinstance(c, RelayCommand) for c in cmds)
        for c in cmds:
            if isinstance(c, CloseConnection):
                assert c.conn == "A" and c.code == 1007
                core.peer_disconnected("A", T0 + 1)
            elif isinstance(c, WriteFrame):
                assert c.conn in ("A", "B")
            elif isinstance(c, Log):
                assert c.event.startswith("rmb.relay.")
