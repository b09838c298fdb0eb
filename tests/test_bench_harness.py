"""The bench's interleaved device timer against a simulated GPU (no CUDA needed): calls per sample sized
to the kernel, samples interleaved across callables, a sleep that outlasts the host's enqueueing, and a
clear error for a callable that waits on the GPU from the host."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from xbackend.bench import _harness
from xbackend.bench._harness import MAX_SLEEP_US, SLEEP_CYCLES_PER_US, time_rotated, time_rotated_interleaved


class FakeGpu:
    """A stream: a sleep, then kernels of known device time; the host's enqueueing time is counted
    since the last sleep, and the sleep is 'over' once the host has spent longer than it."""

    def __init__(self) -> None:
        self.kernels: list[float] = []
        self.sleep_us = 0.0
        self.host_us = 0.0
        self.log: list[str] = []

    def sleep(self, cycles: int) -> None:
        self.sleep_us, self.host_us = cycles / SLEEP_CYCLES_PER_US, 0.0

    def kernel(self, name: str, device_us: float, host_us: float) -> Callable[..., None]:
        def launch(*args: object) -> None:
            self.kernels.append(device_us)
            self.host_us += host_us
            self.log.append(name)

        launch.__name__ = name
        return launch


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> FakeGpu:
    fake = FakeGpu()

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.mark = 0

        def record(self) -> None:
            self.mark = len(fake.kernels)

        def query(self) -> bool:  # True: the GPU left the sleep before the host finished enqueueing
            return fake.host_us > fake.sleep_us

        def synchronize(self) -> None:
            pass

        def elapsed_time(self, end: Event) -> float:
            return sum(fake.kernels[self.mark:end.mark]) / 1e3  # ms

    monkeypatch.setattr(_harness.torch.cuda, "Event", Event)
    monkeypatch.setattr(_harness.torch.cuda, "_sleep", fake.sleep)
    monkeypatch.setattr(_harness.torch.cuda, "synchronize", lambda *a, **k: None)
    return fake


def test_each_callable_gets_its_own_time_and_enough_calls_per_sample(gpu: FakeGpu) -> None:
    small = gpu.kernel("small", device_us=3.0, host_us=12.0)
    large = gpu.kernel("large", device_us=185.0, host_us=12.0)
    times = time_rotated_interleaved([(small, [()]), (large, [()])], reps=5, warmup=0)
    assert times == pytest.approx([3.0, 185.0])
    # after the one calibration sample (4 calls each): 64 calls of the 3 µs kernel, 4 of the 185 µs one
    timed = gpu.log[8:]
    assert timed[:64] == ["small"] * 64 and timed[64:68] == ["large"] * 4
    assert len(timed) == 5 * (64 + 4)


def test_samples_are_interleaved_and_arg_sets_rotate(gpu: FakeGpu) -> None:
    seen: list[int] = []
    a = gpu.kernel("a", device_us=100.0, host_us=5.0)

    def b(i: int) -> None:
        seen.append(i)
        gpu.kernels.append(100.0)
        gpu.log.append("b")

    time_rotated_interleaved([(a, [()]), (b, [(0,), (1,), (2,)])], reps=3, warmup=0)
    runs = [name for i, name in enumerate(gpu.log) if i == 0 or gpu.log[i - 1] != name]
    assert runs == ["a", "b"] * 4  # calibration, then three interleaved samples
    assert seen[:6] == [0, 1, 2, 0, 1, 2]


def test_the_sleep_grows_to_cover_a_slow_host(gpu: FakeGpu) -> None:
    slow = gpu.kernel("slow_host", device_us=3.0, host_us=300.0)  # 64 calls: 19 ms of enqueueing
    (us,) = time_rotated_interleaved([(slow, [()])], reps=3, warmup=0)
    assert us == pytest.approx(3.0)
    assert gpu.sleep_us >= 64 * 300.0


def test_a_callable_that_waits_on_the_gpu_is_refused_with_the_reason(gpu: FakeGpu) -> None:
    syncs = gpu.kernel("item_every_call", device_us=3.0, host_us=10 * MAX_SLEEP_US)
    with pytest.raises(RuntimeError, match="'item_every_call' cannot be queued ahead of the GPU"):
        time_rotated_interleaved([(syncs, [()])], reps=2, warmup=0)



def test_time_rotated_is_the_fixed_calls_single_callable_case(gpu: FakeGpu) -> None:
    kernel = gpu.kernel("k", device_us=7.0, host_us=5.0)
    assert time_rotated(kernel, [()], warmup=2, reps=3, calls_per_rep=16) == pytest.approx(7.0)
    assert len(gpu.log) == 2 + 3 * 16
