"""The gate: one piece of model work at a time, first come first served, a bounded line with a message."""
from __future__ import annotations

import threading

import pytest

from specdemo.app.clocks.gate import Busy, Gate


def test_first_come_first_served_and_a_bounded_line():
    gate = Gate(max_waiting=2)
    a, b, c = gate.join(), gate.join(), gate.join()
    assert gate.wait(a, 0) == 0  # a runs
    assert gate.wait(b, 0) == 1 and gate.wait(c, 0) == 2  # b and c wait, in order
    with pytest.raises(Busy, match="2 requests are already waiting \\(at most 2\\)"):
        gate.join()
    gate.leave(a)
    assert gate.wait(c, 0) == 1  # c may not jump the line
    assert gate.wait(b, 0) == 0
    gate.leave(c)  # a waiting request that goes away frees its place
    d = gate.join()
    gate.leave(b)
    assert gate.wait(d, 0) == 0 and gate.waiting() == 0


def test_turn_serialises_threads():
    gate = Gate(max_waiting=8)
    inside, most, lock = [0], [0], threading.Lock()

    def work():
        with gate.turn():
            with lock:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            threading.Event().wait(0.01)
            with lock:
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and gate.waiting() == 0


def test_the_gate_reports_when_work_takes_it_and_lets_go():
    held = []
    gate = Gate(2, on_hold=held.append)
    with gate.turn():
        assert held == [True]
        ticket = gate.join()
        assert gate.wait(ticket, 0.05) == 1  # a second piece of work waits in line, and is not reported
        gate.leave(ticket)  # nor is its leaving the line
        assert held == [True]
    assert held == [True, False]
