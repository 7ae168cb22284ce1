"""The page's drawn-update acknowledgements: tokens, waits, and which clients are on this machine."""
from __future__ import annotations

import threading

import pytest

import specdemo.app.clocks.drawn as drawn
from specdemo.app.clocks.drawn import DrawnUpdates, same_machine


def test_a_marked_token_is_waited_for_and_spent():
    acks = DrawnUpdates()
    token = acks.expect()
    threading.Timer(0.05, acks.mark, [token]).start()
    assert acks.wait(token, timeout=10.0)
    assert len(acks) == 0  # spent
    assert not acks.wait(token, timeout=0.01)  # a spent token does not come back


def test_unknown_and_unanswered_tokens():
    acks = DrawnUpdates()
    acks.mark("not-a-token")  # ignored
    assert not acks.wait("not-a-token", timeout=0.01)
    token = acks.expect()
    assert not acks.wait(token, timeout=0.01) and len(acks) == 0


def test_tokens_are_unique_and_bounded(monkeypatch):
    monkeypatch.setattr(drawn, "MAX_PENDING", 3)
    acks = DrawnUpdates()
    tokens = [acks.expect() for _ in range(5)]
    assert len(set(tokens)) == 5 and len(acks) == 3
    acks.mark(tokens[-1])
    assert acks.wait(tokens[-1], timeout=0.01)


@pytest.mark.parametrize("host, local", [("127.0.0.1", True), ("::1", True), ("localhost", True), ("127.3.2.1", True),
                                         ("10.0.0.5", False), ("203.0.113.9", False), ("", False), (None, False),
                                         ("example.org", False)])
def test_same_machine(host, local):
    assert same_machine(host) is local
