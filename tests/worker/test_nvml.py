"""NVML as the worker reads it, with a fake driver: every process's device memory, and None
wherever NVML cannot answer (the readers then fall back: the device's free memory, no figures)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_attnkit.worker import memory, nvml, out_of_memory


class FakeNvml:
    def __init__(self, processes: dict[int, int | None], fails: bool = False) -> None:
        self.processes, self.fails = processes, fails

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list:  # noqa: N802 - NVML's name
        if self.fails:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.processes.items()]


@pytest.fixture
def fake_device(monkeypatch: pytest.MonkeyPatch):
    def install(driver: FakeNvml | None) -> None:
        monkeypatch.setattr(nvml, "device", lambda: None if driver is None else (driver, "gpu0"))
        monkeypatch.setattr(memory, "_meter", False)  # looked up afresh
    return install


def test_every_process_s_bytes_are_listed(fake_device) -> None:
    fake_device(FakeNvml({10: 2**30, 11: None}))
    assert nvml.compute_processes() == {10: 2**30, 11: 0}  # None: NVML could not say, counted 0


@pytest.mark.parametrize("driver", [None, FakeNvml({}, fails=True)])
def test_no_nvml_or_a_failing_call_gives_none(fake_device, driver) -> None:
    fake_device(driver)
    assert nvml.compute_processes() is None


def test_the_meter_needs_nvml_to_see_this_process(fake_device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory.os, "getpid", lambda: 10)
    fake_device(FakeNvml({10: 512}))
    meter = memory.process_meter()
    assert meter is not None and meter.used() == 512
    fake_device(FakeNvml({99: 512}))  # another namespace's ids: this process is not listed
    assert memory.process_meter() is None


def test_without_a_cuda_device_there_is_no_nvml_device() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    nvml.device.cache_clear()
    assert nvml.device() is None
    assert out_of_memory.compute_processes is nvml.compute_processes


def test_a_memory_point_that_ran_out_of_memory_replies_with_the_failure_s_figures() -> None:
    """A memory sweep's point that ran out of memory gave the scheduler no figures (the H100's
    time table: "the failure gave no figures", results/2026-11-27-session11), so room was made by
    stopping every other worker. Now its reply carries what torch's whole message says, as any
    request's out-of-memory does, and its message keeps the first two sentences."""
    from pytest_attnkit.messages import Status
    from pytest_attnkit.records import MemoryPoint, PointStatus
    from pytest_attnkit.worker.suites.memory import out_of_memory_point

    text = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
            "which 1.50 GiB is free. Including non-PyTorch memory, this process has 3.25 GiB memory in use. "
            "Of the allocated memory 1.1 GiB is allocated by PyTorch.")
    reply = out_of_memory_point(MemoryPoint(32768, PointStatus.OOM, message=text))
    assert reply.status is Status.OUT_OF_MEMORY
    assert reply.message == "CUDA out of memory. Tried to allocate 2.00 GiB"
    assert MemoryPoint.from_dict(reply.data).message == reply.message  # the point the suite reads
    figures = reply.data["out_of_memory"]
    assert figures["requested_bytes"] == 2 * 2**30
    assert figures["free_at_failure_bytes"] == int(1.5 * 2**30)
    assert figures["process_at_failure_bytes"] == int(3.25 * 2**30)
