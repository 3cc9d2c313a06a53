"""Fewer trials at once than nodes: said once, and only when the experiment held back."""

from __future__ import annotations

from orchestrator.control.concurrency import HeldBack


def test_a_wait_with_an_idle_node_then_a_new_trial_is_said_once():
    held = HeldBack()
    held.waiting([1, 2], nodes=2)  # both nodes busy: nothing held back
    assert held.submitted() is None
    held.waiting([3], nodes=2)  # one node idle while the experiment waits on trial 3
    line = held.submitted()
    assert line is not None and line.startswith("1 of 2 nodes stood idle while the experiment"
                                                " waited for a result")
    assert "fewer trials than nodes can run at once" in line
    held.waiting([4], nodes=2)
    assert held.submitted() is None  # said once per run


def test_the_runs_last_trial_alone_says_nothing():
    """The last trial running while the other node idles is the run ending, not holding back:
    nothing is submitted after it, so nothing is said."""
    held = HeldBack()
    held.waiting([7], nodes=3)
    assert not held.said
    held.waiting([], nodes=3)  # nothing in flight: not a wait on a result
    assert held.submitted() is not None  # the earlier wait still counts when a trial follows


def test_a_trial_with_fewer_restarts_than_nodes_says_how_many_nodes_it_uses():
    from orchestrator.commands.trial import nodes_for

    assert nodes_for(3, 2) == (2, None)
    used, why = nodes_for(1, 2)
    assert used == 1 and why == ("restarts=1: 1 of nodes=2 used (one restart per node; the"
                                 " others would have none to run)")
