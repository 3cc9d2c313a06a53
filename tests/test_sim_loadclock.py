"""The sim's modeled load time is counted from the process's launch, not after its imports."""

from __future__ import annotations

import subprocess
import sys

from orchestrator.targets.sim.loadclock import MAX_CREDIT_S, LoadClock


def test_start_up_time_is_taken_off_the_modeled_sleeps_in_order():
    slept: list[float] = []
    clock = LoadClock(0.05, 0.08, sleep=slept.append)
    clock.sleep_modeled(4.0, credited=False)  # weight loading: in full, the credit kept
    clock.sleep_modeled(1.0)   # 50 ms wall: all of it already spent starting up
    clock.sleep_modeled(12.0)  # 600 ms wall, less the 30 ms of credit left
    clock.sleep_modeled(2.0)   # credit gone: the full 100 ms
    clock.sleep_modeled(0.0)
    assert [round(s, 6) for s in slept] == [0.2, 0.57, 0.1]
    assert clock.credit_s == 0.0


def test_credit_is_bounded():
    slept: list[float] = []
    clock = LoadClock(1.0, 3600.0, sleep=slept.append)  # a pid exec'd long after its birth
    clock.sleep_modeled(MAX_CREDIT_S + 1.0)
    assert [round(s, 6) for s in slept] == [1.0]
    assert LoadClock(1.0, -5.0).credit_s == 0.0


def test_seconds_since_launch_reads_this_process_start():
    code = ("import time; time.sleep(0.4);"
            "from orchestrator.targets.sim.loadclock import seconds_since_launch as s;"
            "print(s())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    # the kernel's start time has clock-tick (10 ms) resolution; a loaded machine only adds
    assert 0.35 <= float(out) < 30.0
