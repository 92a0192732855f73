"""``tfmem run``: a script, a module or any command run under the watchdog (the outside view),
with an agent in a Python script's process (where it was, TensorFlow's allocators); the peaks,
a death explained and advice at the end (``summary``), as JSON and as a plot."""
