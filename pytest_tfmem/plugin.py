"""The ``pytest11`` entry point ``tfmem``: lists the features, each a pytest plugin of its own.

The core comes first (it adds tfmem's hook specifications and options); the features meet
through the core and those hooks. Nothing here holds logic, and nothing imports this module.
"""

pytest_plugins: list[str] = [
    "pytest_tfmem.core.manager",
    "pytest_tfmem.gates.plugin",
    "pytest_tfmem.trace.plugin",
    "pytest_tfmem.isolate.plugin",
    "pytest_tfmem.journal.plugin",
    "pytest_tfmem.gpu.plugin",
    "pytest_tfmem.explain.plugin",
    "pytest_tfmem.leaks.marker",
    "pytest_tfmem.workers.plugin",
    "pytest_tfmem.html.plugin",
    "pytest_tfmem.session.plugin",
    "pytest_tfmem.kernels.plugin",
]
