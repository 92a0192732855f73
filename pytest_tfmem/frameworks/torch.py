"""PyTorch: CUDA allocator statistics per device, its runtime start, the CUDA cache, clean-up
and profiler.

``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` is a test's exact peak
per CUDA device; NVML reads the caching allocator's pool instead (what it reserved, freed or
not). On CPU PyTorch allocates through the C heap: the host figures carry its memory, and its
live tensors are named among the objects a test kept, by their bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .base import DeviceView, Holder, NamedItems, ProfilerBusy, imported, nothing_to_put_back

MODULE = "torch"


def _loaded() -> ModuleType | None:
    torch = imported(MODULE)
    return torch if torch is not None and "cuda" in vars(torch) else None


def _cuda_initialized(torch: ModuleType) -> bool:
    """CUDA's context exists (asking creates none)."""
    return bool(torch.cuda.is_initialized())


class CudaAllocator:
    """A peak source over one CUDA device's caching allocator: exact, resettable."""

    def __init__(self, cuda: Any, index: int) -> None:
        self._cuda = cuda
        self._index = index
        self.name = f"torch:cuda:{index}"

    def current(self) -> int:
        return int(self._cuda.memory_allocated(self._index))

    def peak(self) -> int:
        return int(self._cuda.max_memory_allocated(self._index))

    def reset_peak(self) -> None:
        self._cuda.reset_peak_memory_stats(self._index)


class Torch:
    """PyTorch behind the ``Framework`` protocol (``frameworks.base``)."""

    name = "PyTorch"
    module = MODULE
    keras_backend = "torch"
    view_prefix = "torch:"
    gpu_environment: dict[str, str] = {}  # its caching allocator takes memory as needed
    clear_cost = "the next CUDA allocations ask the driver again (slower than from the cache)"
    data_pipeline = "a torch.utils.data.DataLoader or keras.utils.PyDataset"
    first_use_in_keras = False  # a fit pays no LSTM kernel

    def __init__(self) -> None:
        self._started = False
        self._profile: Any = None  # the profiler session start_profiler entered

    def loaded(self) -> bool:
        return _loaded() is not None

    def runtime_started(self) -> bool:
        torch = _loaded()
        return torch is not None and (self._started or _cuda_initialized(torch))

    def runtime_started_elsewhere(self) -> bool:
        """Its import finished (on CPU its start is the import)."""
        return self.loaded()

    def start_runtime(self) -> None:
        """Run one tiny op on the CPU (its thread pools, oneDNN) and, where CUDA is there, on the
        first GPU (the CUDA context)."""
        torch = _loaded()
        if torch is None:
            return
        (torch.ones((8, 8)) @ torch.ones((8, 8))).sum().item()
        if torch.cuda.is_available():
            (torch.ones((8, 8), device="cuda") @ torch.ones((8, 8), device="cuda")).sum().item()
        self._started = True

    def warm_up(self) -> None:
        """A linear layer's loss taken back through autograd and an Adam step; conv, pooling and
        LSTM kernels run without gradients."""
        torch = _loaded()
        if torch is None:
            return
        nn = torch.nn
        layer = nn.Linear(4, 2)
        optimizer = torch.optim.Adam(layer.parameters())
        layer(torch.ones((8, 4))).square().mean().backward()
        optimizer.step()
        with torch.no_grad():
            features = nn.functional.conv2d(torch.ones((2, 1, 8, 8)), torch.zeros((2, 1, 3, 3)))
            nn.functional.max_pool2d(nn.functional.relu(features), 2)
            nn.LSTM(4, 2, batch_first=True)(torch.ones((2, 3, 4)))

    def keep_random_state(self) -> Callable[[], None]:
        """The CPU generator's state, and each GPU's where CUDA started (new layers draw from them)."""
        torch = _loaded()
        if torch is None:
            return nothing_to_put_back
        cpu = torch.get_rng_state()
        gpus = torch.cuda.get_rng_state_all() if _cuda_initialized(torch) else None

        def put_back() -> None:
            torch.set_rng_state(cpu)
            if gpus is not None:
                torch.cuda.set_rng_state_all(gpus)

        return put_back

    def missing_views(self) -> list[str]:
        return []  # its host memory is the host view's; its GPU views need only a GPU

    def device_views(self) -> list[CudaAllocator]:
        torch = _loaded()
        if torch is None or not _cuda_initialized(torch):
            return []
        return [CudaAllocator(torch.cuda, index) for index in range(torch.cuda.device_count())]

    def is_gpu_view(self, name: str) -> bool:
        return name.startswith("torch:cuda")

    def pooled_host_view(self, views: Sequence[DeviceView]) -> None:
        return None  # PyTorch serves CPU tensors from plain host memory

    def view_label(self, name: str) -> str:
        return f"PyTorch {name[6:]} allocator"

    def column_title(self, name: str) -> str:
        return f"torch {name[6:]}"

    def limit_gpu_memory(self, limit: int, runtime_started: bool) -> str:
        """``torch.cuda.set_per_process_memory_fraction``: the limit's share of each GPU."""
        torch = _loaded()
        if torch is None or not torch.cuda.is_available():
            return "PyTorch sees no GPU"
        for index in range(torch.cuda.device_count()):
            total = torch.cuda.get_device_properties(index).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), index)
        return ""

    def device_oom_message(self, error: BaseException) -> str | None:
        torch = _loaded()
        if torch is None or not isinstance(error, torch.cuda.OutOfMemoryError):
            return None
        return str(error)

    def holders(self) -> list[Holder]:
        torch = _loaded()
        if torch is None or not _cuda_initialized(torch):
            return []
        count = torch.cuda.device_count()
        cached = sum(
            int(torch.cuda.memory_reserved(index)) - int(torch.cuda.memory_allocated(index)) for index in range(count)
        )
        return [Holder("PyTorch CUDA cache (reserved, not allocated)", count, cached)]

    def named_items(self) -> NamedItems | None:
        return None  # its holders' items have no names worth following

    def flat_loop_advice(self, holder: str) -> str | None:
        return None  # nothing of PyTorch's was measured growing in a loop

    def clear(self) -> list[str]:
        torch = _loaded()
        if torch is None or not _cuda_initialized(torch):
            return []
        torch.cuda.empty_cache()
        return ["torch.cuda.empty_cache()"]

    def start_profiler(self, logdir: Path) -> None:
        torch = _loaded()
        assert torch is not None
        profiler = torch.profiler
        activities = [profiler.ProfilerActivity.CPU]
        if _cuda_initialized(torch):
            activities.append(profiler.ProfilerActivity.CUDA)
        self._profile = profiler.profile(
            activities=activities,
            profile_memory=True,
            record_shapes=True,
            on_trace_ready=profiler.tensorboard_trace_handler(str(logdir)),
        )
        try:
            self._profile.__enter__()
        except RuntimeError as error:  # another profiler is running
            raise ProfilerBusy(str(error)) from error

    def stop_profiler(self, logdir: Path) -> list[Path]:
        profile, self._profile = self._profile, None
        if profile is not None:
            profile.__exit__(None, None, None)
        return sorted(logdir.glob("*.pt.trace.json*"))

    def profile_description(self) -> str:
        return (
            "PyTorch profiler trace with memory events (*.pt.trace.json: open it in "
            "https://ui.perfetto.dev or chrome://tracing)"
        )

    def no_memory_profile(self) -> str:
        return "PyTorch's trace keeps its memory events for Perfetto, not in a profile xprof reads"
