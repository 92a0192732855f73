"""Sources of memory readings: the process (RSS, high-water mark), TensorFlow's allocators, NVML,
the memory limit that applies, TensorFlow's profiler, and the young-generation garbage collector; and the one sampler
thread every background reading runs on. Probes know nothing about pytest."""
