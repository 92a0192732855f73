"""Traces: a TensorBoard profiler trace and a memory timeline kept for tests that fail on memory
(or always), with their directories and the summary that points at them."""
