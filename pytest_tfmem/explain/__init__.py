"""Explain: for a test over budget, the memory-by-line table of its body and TensorFlow's
heaviest allocations at the peak."""
