"""GPU memory: NVML and TensorFlow allocator views per device, the GPU budget, the GPU limit and
memory growth options."""

from pytest_tfmem.gpu.plugin import TfmemDeviceWarning

__all__ = ["TfmemDeviceWarning"]
