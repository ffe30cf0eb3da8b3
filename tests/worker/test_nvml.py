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
