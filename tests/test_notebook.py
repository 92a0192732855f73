"""``%load_ext pytest_tfmem`` in IPython: the ``%%tfmem`` and ``%tfmem`` magics, the guard, and the
next kernel naming the one the OOM killer took, run in real IPython shells in processes of their
own (IPython's shell is a process-wide singleton)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from cgroup_helpers import memory_cgroup, oom_kills

pytest.importorskip("IPython")

SESSION = r'''
from IPython.testing.globalipapp import start_ipython

shell = start_ipython()
shell.run_line_magic("load_ext", "pytest_tfmem")
shell.run_cell("import numpy as np")
print("CELL", end=" ")
shell.run_cell("%%tfmem\nkept = np.ones(50 * 2**20, dtype=np.uint8)\ntemporary = np.ones(30 * 2**20, dtype=np.uint8)\ndel temporary\n")
print("LINE", end=" ")
shell.run_cell("%tfmem 100MB line = np.ones(10 * 2**20, dtype=np.uint8)")
over = shell.run_cell("%%tfmem 20MB\nbig = np.ones(40 * 2**20, dtype=np.uint8)\n")
print("OVER", type(over.error_in_exec).__name__, isinstance(over.error_in_exec, Exception), "big" in shell.user_ns)
bad = shell.run_cell("%%tfmem 2 gigs\nnever = 1\n")
print("BAD", "never" in shell.user_ns, "kept" in shell.user_ns)
option = shell.run_cell("%tfmem --budget=2GB never = 1")
print("OPTION", "never" in shell.user_ns)
help_text = shell.run_cell("%%tfmem?")
'''


@pytest.mark.linux  # exact marks: a cell's peak is the kernel's high-water mark
def test_the_magics_measure_a_cell_and_a_line_hold_a_budget_and_refuse_bad_input(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", SESSION], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    cell = next(line for line in out.splitlines() if line.startswith("CELL "))
    # the cell's exact peak (both arrays at once), and what it left (the array it kept)
    assert cell.startswith(("CELL tfmem: peak 79.", "CELL tfmem: peak 80.")) and (
        "left behind +50." in cell or "left behind +49.9 MiB" in cell), cell
    line = next(line for line in out.splitlines() if line.startswith("LINE "))
    assert line.startswith(("LINE tfmem: peak 9.9 MiB", "LINE tfmem: peak 10.0 MiB")) and "left behind +10." in line, out
    assert "<= budget 100MB (95.4 MiB)" in out
    # over budget: one error an ``except Exception`` catches, with the figures and what used the memory;
    # what the cell made stays
    assert "OVER BudgetExceeded True True" in out
    assert "BudgetExceeded: tfmem: peak 40.0 MiB > budget 20MB (19.1 MiB) (host RSS 40.0 MiB)" in out or (
        "BudgetExceeded: tfmem: peak 39.9 MiB > budget 20MB" in out), out
    assert "tfmem: what used it: mostly host memory outside the frameworks' allocators" in out
    assert "IPython bug" not in out + done.stderr
    # bad input: a usage error that names it, and the cell does not run
    assert "UsageError: invalid budget '2 gigs'" in done.stderr and "BAD False True" in out
    assert "UsageError: unknown option '--budget=2GB'" in done.stderr and "OPTION False" in out
    assert "the most memory the cell needed above where it started" in out  # the help says what each figure counts


GUARDED = r'''
from IPython.testing.globalipapp import start_ipython

shell = start_ipython()
shell.run_line_magic("load_ext", "pytest_tfmem")
shell.run_cell("import numpy as np, time\nbefore = 'kept'")
for bad in ("%tfmem_guard 2 gigs", "%tfmem_guard 1MB", "%tfmem_guard 100TB", "%tfmem_auto sometimes"):
    refused = shell.run_cell(bad)
    print("REFUSED", bad, refused.error_before_exec is not None or refused.error_in_exec is not None)
shell.run_cell("%tfmem_guard 400MB")
grows = "chunks = []\nfor step in range(100):\n    chunks.append(np.ones(20 * 2**20, dtype=np.uint8))\n    time.sleep(0.01)\n"
over = shell.run_cell(grows)
print("TRIPPED", type(over.error_in_exec).__name__, isinstance(over.error_in_exec, Exception))
print("MESSAGE", over.error_in_exec)
shell.run_cell("print('ALIVE', before, 10 <= len(chunks) < 25)")
shell.run_cell("del chunks")
print("UNDER", shell.run_cell("small = [np.ones(2**20, dtype=np.uint8) for _ in range(20)]").success)
shell.run_cell("%tfmem_guard off")
print("OFF", shell.run_cell(grows.replace("range(100)", "range(25)")).success)
'''


@pytest.mark.linux  # the kernel's size: RSS
def test_the_guard_stops_a_growing_cell_where_it_is_and_keeps_the_kernel_and_its_variables(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", GUARDED], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for bad in ("2 gigs", "1MB", "100TB"):
        assert f"REFUSED %tfmem_guard {bad} True" in out, out
    assert "REFUSED %tfmem_auto sometimes True" in out
    assert "guard 1MB (976.6 KiB) is not above what the kernel holds already" in done.stderr
    assert "guard 100TB (90.9 TiB) is not below what this kernel may have" in done.stderr or (
        "guard 100TB" in done.stderr and "is not below what this kernel may have" in done.stderr), done.stderr
    assert "TRIPPED GuardTripped True" in out
    message = next(line for line in out.splitlines() if line.startswith("MESSAGE "))
    assert "past the guard of" in message and "(400MB) (it grew +" in message and "the cell was stopped here" in message
    assert "ALIVE kept True" in out and "UNDER True" in out and "OFF True" in out
    assert "IPython bug" not in out + done.stderr


# A notebook session in a real ipykernel, in a 1 GiB memory cgroup: the default guard below the
# cgroup's limit, a size above it refused, a stop, then cells that run on (a sleep, a small
# "predict", setting the guard again from above it), freeing and a guard set lower, a second stop,
# and the line %tfmem_auto prints after each cell.
SESSION_CELLS = (
    "%load_ext pytest_tfmem\nimport numpy as np, time\nkept = []",
    "%tfmem_guard",
    "%tfmem_guard 100GB",
    "for _ in range(200):\n    kept.append(np.ones(20 * 2**20, dtype=np.uint8))\n    time.sleep(0.01)",
    "%tfmem_guard 1000MiB",
    "time.sleep(0.2)",
    "prediction = np.ones((2, 4)) @ np.ones((4, 1))\nprint('predicted', prediction.ravel().tolist())",
    "del kept[10:]",
    "%tfmem_guard 600MB",
    "for _ in range(200):\n    kept.append(np.ones(20 * 2**20, dtype=np.uint8))\n    time.sleep(0.01)",
    "%tfmem_auto on",
    "temporary = np.ones(50 * 2**20, dtype=np.uint8)\ndel temporary",
    "%%tfmem 10MB\nbig = np.ones(30 * 2**20, dtype=np.uint8)",
    "print('alive', len(kept), big.nbytes >> 20)",
)
RUN_SESSION = r'''
import json, re, sys
import nbformat
from nbclient import NotebookClient

book = nbformat.v4.new_notebook()
book.cells = [nbformat.v4.new_code_cell(source) for source in json.loads(sys.argv[1])]
book.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
NotebookClient(book, timeout=300, kernel_name="python3", allow_errors=True).execute()
outputs = []
for cell in book.cells:
    text = ""
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            text += output["text"]
        elif output["output_type"] == "error":
            shown = re.sub(r"\x1b\[[0-9;]*m", "", "\n".join(output["traceback"]))  # IPython's colours
            text += f"ERROR {output['ename']}: {output['evalue']}\nTRACEBACK {shown}\n"
    outputs.append(text)
print(json.dumps(outputs))
'''


@pytest.mark.linux  # the kernel's size: RSS; its limit: a memory cgroup
def test_a_guarded_notebook_session_runs_on_after_each_stop_in_a_real_kernel_under_a_memory_limit(tmp_path) -> None:
    pytest.importorskip("nbclient")
    import json

    with memory_cgroup(2**30) as cgroup:
        enter = f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"'
        done = subprocess.run(["sh", "-c", enter, "sh", sys.executable, "-c", RUN_SESSION, json.dumps(SESSION_CELLS)],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert oom_kills(cgroup) == 0
    said = json.loads(done.stdout.splitlines()[-1])
    # the default guard: the cgroup's limit less a tenth of it
    assert said[1].startswith("tfmem guard: a cell that takes the kernel past 921.6 MiB is stopped there (1.0 GiB "
                              "(its memory cgroup's limit, cgroup v1 memory.limit_in_bytes"), said[1]
    assert "less a margin of 102.4 MiB" in said[1]
    assert "UsageError: guard 100GB (93.1 GiB) is not below what this kernel may have, 1.0 GiB" in said[2], said[2]
    assert said[3].startswith("ERROR GuardTripped: tfmem guard: this cell took the kernel to "), said[3]
    assert "past the guard of 921.6 MiB" in said[3] or "past the guard of 92" in said[3], said[3]
    # set again from above the guard: no stop inside the magic
    assert "ERROR" not in said[4] and "tfmem guard: a cell that takes the kernel past 1000.0 MiB" in said[4]
    # the kernel began the next cell above the old guard's level: told once, then the cells run
    assert "ERROR" not in "".join(said[5:9]), said[5:9]
    assert sum("above the guard of" in text for text in said[4:9]) == 1, said[4:9]
    assert said[6].startswith("predicted [4.0, 4.0]")
    assert said[8].startswith("tfmem guard: a cell that takes the kernel past 600MB (572.2 MiB)")
    # a kernel that stops within 0.05 MiB of the guard is told both figures to two decimals (572.21 past 572.20)
    assert said[9].startswith("ERROR GuardTripped:") and re.search(r"past the guard of 572\.20? MiB \(600MB\)", said[9]), said[9]
    # a 50 MiB array; in the cgroup the kernel's file pages are reclaimed meanwhile, so RSS reads it 0.2 MiB low at times
    assert re.match(r"tfmem: peak \+(49|50)\.\d MiB, kept ", said[11]) and " of 1.00 GiB" in said[11], said[11]
    assert "(its memory cgroup's limit, cgroup v1 memory.limit_in_bytes)" in said[11]
    # a budget's error is the cell's: its message, no frame of tfmem's
    assert said[12].startswith("ERROR BudgetExceeded: tfmem: peak 30.0 MiB > budget 10MB (9.5 MiB)"), said[12]
    assert "pytest_tfmem" not in said[12] and "raise over" not in said[12]
    # the guard's stop shows the cell's own line, no frame of tfmem's
    assert "kept.append(np.ones(20 * 2**20" in said[9] and "pytest_tfmem" not in said[9].split("TRACEBACK", 1)[1]
    assert said[13].startswith("alive ") and said[13].count("tfmem: peak") == 1 and " 30\n" in said[13]


KILLED = r'''
from IPython.testing.globalipapp import start_ipython

shell = start_ipython()
shell.run_line_magic("load_ext", "pytest_tfmem")
shell.run_cell("import numpy as np")
shell.run_cell("%tfmem_guard 300MB")
print("GUARDED", flush=True)
shell.run_cell("block = np.ones(2 * 2**30, dtype=np.uint8)  # one native call past the guard and the cgroup's limit")
print("SURVIVED", flush=True)
'''
NEXT_KERNEL = r'''
from IPython.testing.globalipapp import start_ipython

start_ipython().run_line_magic("load_ext", "pytest_tfmem")
'''


@pytest.mark.linux
def test_a_kernel_the_oom_killer_took_is_named_by_the_next_kernels_load_ext(tmp_path) -> None:
    """One native call past the guard and a real memory cgroup's limit: the OOM killer takes the
    kernel (the guard cannot stop a call that has not returned); the next kernel in the folder,
    outside the cgroup, says what the dead one was running, once."""
    with memory_cgroup(600 * 2**20) as cgroup:
        enter = f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"'
        died = subprocess.run(["sh", "-c", enter, "sh", sys.executable, "-c", KILLED], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, check=False)
        assert died.returncode == -9 or died.returncode == 137, died.stdout + died.stderr
        assert "GUARDED" in died.stdout and "SURVIVED" not in died.stdout and oom_kills(cgroup) >= 1
    said = [subprocess.run([sys.executable, "-c", NEXT_KERNEL], cwd=tmp_path, capture_output=True, text=True,
                           timeout=300, check=True).stdout for _ in range(2)]
    assert said[0].startswith("tfmem: the last kernel here (pid "), said[0]
    # the line that was running, and the cause it can see: a step larger than what was left below the limit
    assert "died while running a cell" in said[0] and "`block = np.ones(2 * 2**30, dtype=np.uint8)" in said[0]
    assert "killed for memory (the OOM killer): its guard was 286.1 MiB and it may have 600.0 MiB" in said[0], said[0]
    assert "so the step that killed it took more than the" in said[0]
    assert said[1] == ""  # said once


GUARDED_FIT = r'''
import psutil
from IPython.testing.globalipapp import start_ipython

shell = start_ipython()
shell.run_line_magic("load_ext", "pytest_tfmem")
shell.run_cell("%tfmem_auto on")
shell.run_cell("""
import numpy as np, keras
held = []
class Grow(keras.callbacks.Callback):  # what a fit that keeps each epoch's outputs does
    def on_epoch_end(self, epoch, logs=None):
        held.append(np.ones(30 * 2**20, dtype=np.uint8))
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
model.compile(optimizer="adam", loss="mse")
""")
guard = psutil.Process().memory_info().rss + 300 * 2**20
shell.run_cell(f"%tfmem_guard {guard}B")
over = shell.run_cell("model.fit(np.zeros((64, 4)), np.zeros((64, 1)), epochs=200, verbose=0, callbacks=[Grow()])")
print("FIT", type(over.error_in_exec).__name__, 5 <= len(shell.user_ns["held"]) < 200)
'''


@pytest.mark.slow  # Keras on TensorFlow in a fresh shell: about 15 s
@pytest.mark.linux
def test_the_guard_stops_a_keras_fit_that_grows_over_its_epochs(tmp_path) -> None:
    done = subprocess.run([sys.executable, "-c", GUARDED_FIT], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FIT GuardTripped True" in done.stdout, done.stdout + done.stderr
    # the cell that imported Keras says so after it (%tfmem_auto): its figures carry that start
    assert re.search(r"tfmem: peak \+\d+\.\d MiB, kept \+\d+\.\d MiB; the kernel .*; first import of (jax, )?keras, "
                     r"tensorflow in this cell: its start is in these figures", done.stdout), done.stdout
