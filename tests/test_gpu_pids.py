"""The trial's own server is recognised on its GPUs in a container too.

NVML lists host pids; in a container sleuth sees the server under the container's pids. The
procfs trees here are fakes of the two views (the container's `/proc`, and the host's as a
container sees it mounted at `/host/proc`), with NVML itself the in-memory `pynvml` the GPU
conformance suite uses, so the NVML backend's own code decides what it lists: no privileges,
no namespace is created.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from orchestrator.gpu.pids import INIT_PID_NS, PidResolver, ProcView
from orchestrator.runner.telemetry import TelemetrySampler
from tests.conformance.fake_pynvml import FakeGpu, FakeNvml

BOOT_TICKS = {7: 81_000, 8: 81_020}  # the server's processes' start times (clock ticks)


def _process(root: Path, pid: int, nspids: tuple[int, ...], start: int, comm: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(f"Name:\t{comm}\nPid:\t{pid}\n"
                              f"NSpid:\t{' '.join(map(str, nspids))}\nPPid:\t1\n")
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560", *["0"] * 12, str(start)]
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)} 0 0\n")


def _namespace(root: Path, ns: str) -> None:
    (root / "self" / "ns").mkdir(parents=True)
    os.symlink(ns, root / "self" / "ns" / "pid")  # readlink is all that is asked of it


@pytest.fixture()
def views(tmp_path):
    """A container whose server is pids 7 and 8 (host pids 4107, 4108), a host process
    (4200), and another container's process that is also pid 7 in its own namespace (5300)."""
    here, host = tmp_path / "proc", tmp_path / "host-proc"
    _namespace(here, "pid:[4026532999]")
    _namespace(host, INIT_PID_NS)
    for pid in (7, 8):
        _process(here, pid, (pid,), BOOT_TICKS[pid], "python3")
    _process(host, 4107, (4107, 7), BOOT_TICKS[7], "python3")
    _process(host, 4108, (4108, 8), BOOT_TICKS[8], "python3")
    _process(host, 4200, (4200,), 50_000, "train.py")
    _process(host, 5300, (5300, 7), 90_000, "python3")
    return ProcView(here), ProcView(host)


def _sampler(monkeypatch, listed: dict[int, int], resolver: PidResolver) -> TelemetrySampler:
    fake = FakeNvml([FakeGpu(0, processes=listed)])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    from orchestrator.gpu.nvml import NvmlGpuControl

    return TelemetrySampler(NvmlGpuControl(), 0.05, lambda: [7, 8], resolver)


def test_host_pids_are_mapped_to_the_server_through_nspid_and_start_time(views, monkeypatch):
    here, host = views
    listed = {4107: 2 << 30, 4108: 2 << 30, 4200: 1 << 30, 5300: 1 << 30}
    sampler = _sampler(monkeypatch, listed, PidResolver(here, host))
    sampler.sample_once()
    (sample,) = sampler.samples
    # The server's two processes are its own; a host process and another container's pid 7
    # (same inner pid, another start time) are not.
    assert sample.foreign_pids == (4200, 5300) and sample.unattributed_pids == ()
    summary = sampler.stop()
    assert summary["suspect"] and summary["foreign_pids"] == [4200, 5300]


def test_the_server_alone_on_its_gpus_is_not_suspect_in_a_container(views, monkeypatch):
    here, host = views
    sampler = _sampler(monkeypatch, {4107: 2 << 30, 4108: 2 << 30}, PidResolver(here, host))
    summary = sampler.stop()
    assert not summary["suspect"], summary["suspect_reason"]
    assert summary["foreign_pids"] == [] and summary["unattributed_pids"] == []


def test_a_translating_driver_lists_the_container_pids_themselves(views, monkeypatch):
    here, _host = views
    sampler = _sampler(monkeypatch, {7: 2 << 30, 8: 2 << 30}, PidResolver(here, None))
    summary = sampler.stop()
    assert not summary["suspect"] and summary["unattributed_pids"] == []


def test_without_an_outer_procfs_host_pids_are_unattributed_not_foreign(views, monkeypatch):
    here, _host = views
    # As many as the server has processes: they may all be its own, so not suspect.
    sampler = _sampler(monkeypatch, {4107: 2 << 30, 4108: 2 << 30}, PidResolver(here, None))
    summary = sampler.stop()
    assert not summary["suspect"] and summary["unattributed_pids"] == [4107, 4108]
    # More than it has: some are not its own.
    sampler = _sampler(monkeypatch, {4107: 1, 4108: 1, 4200: 1}, PidResolver(here, None))
    summary = sampler.stop()
    assert summary["suspect"]
    assert "3 process(es) on the GPUs outside this PID namespace, more than the server's 2" \
        in summary["suspect_reason"]


def test_on_the_host_a_pid_nvml_lists_that_is_not_the_server_s_is_foreign(tmp_path,
                                                                          monkeypatch):
    here = tmp_path / "proc"
    _namespace(here, INIT_PID_NS)
    for pid in (7, 8):
        _process(here, pid, (pid,), BOOT_TICKS[pid], "python3")
    resolver = PidResolver(ProcView(here), None)
    sampler = _sampler(monkeypatch, {7: 1, 8: 1, 9999: 1}, resolver)
    summary = sampler.stop()
    assert summary["foreign_pids"] == [9999] and summary["unattributed_pids"] == []


def test_a_server_in_a_namespace_below_sleuth_s_is_known_by_its_inner_pids_too(tmp_path):
    """sleuth on the host, the server started by a launcher into a PID namespace of its own
    (`unshare --pid`): a driver that answers in the server's namespace lists its inner pids."""
    here = tmp_path / "proc"
    _namespace(here, INIT_PID_NS)
    _process(here, 4107, (4107, 1), 81_000, "python3")
    resolver = PidResolver(ProcView(here), None)
    own = resolver.own_ids([4107])
    assert own == {4107, 1}
    assert resolver.split([1, 4107, 4200], own) == ((4200,), ())


def test_the_real_proc_reads():
    from orchestrator.util.process import start_time

    view = ProcView()
    me = os.getpid()
    assert view.nspids(me)[-1] == me or len(view.nspids(me)) > 1
    assert view.start_time(me) is not None and str(view.start_time(me)) in str(start_time(me))
    assert view.pid_namespace() is None or view.pid_namespace().startswith("pid:[")
