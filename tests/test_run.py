"""``tfmem run`` on real scripts: exit codes and signals passed through, each process's high-water
mark, the agent's view (where the script was, TensorFlow's allocators), deaths explained (a real
OOM kill in a memory cgroup, ``--kill-at``, a signal from outside), budgets, the report, the plot,
the journal ``tfmem last`` reads, and bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cgroup_helpers import memory_cgroup, oom_kills

from pytest_tfmem import platforms
from pytest_tfmem.cli.main import main
from pytest_tfmem.run.summary import Place, advise, first_imports_text

MiB = 2**20
ROOT = Path(__file__).resolve().parent.parent

GROW = """
import sys
import time
import numpy as np

def load_shards(count):
    shards = []
    for _ in range(count):
        shards.append(np.ones(10 * 2**20, dtype=np.uint8))  # 10 MiB, touched
        time.sleep(0.01)
    return shards

shards = load_shards(int(sys.argv[1]))
print(f"loaded {len(shards)} shards", flush=True)
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
"""

FORKS = """
import os
import time
import numpy as np

pid = os.fork()
if pid == 0:  # the worker: 200 MiB of its own, for a second
    block = np.ones(200 * 2**20, dtype=np.uint8)
    time.sleep(1)
    os._exit(0)
os.waitpid(pid, 0)
"""

WAITS = """
import signal
import sys
import time

def interrupted(number, frame):
    print(f"the script got {signal.Signals(number).name}", flush=True)
    sys.exit(5)

signal.signal(signal.SIGINT, interrupted)
print("ready", flush=True)
time.sleep(60)
"""

KERAS = """
import time

import numpy as np
import tensorflow as tf
import keras

tf.constant(1.0)  # TensorFlow's runtime starts here
time.sleep(0.5)  # a few of the agent's readings (every 0.1 s) see the runtime started before the data
data = np.ones((900, 2**20 // 4), dtype=np.float32)  # 900 MiB of data held in NumPy
model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(256), keras.layers.Dense(1)])
model.compile("adam", "mse")
model.fit(data[:512, :1024], data[:512, :1], epochs=1, batch_size=256, verbose=0)  # 1 MiB batches
print("trained", flush=True)
"""


def tfmem_run(folder: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120,
              prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "TF_ENABLE_ONEDNN_OPTS": "1", **(env or {})}
    command = [*prefix, sys.executable, "-m", "pytest_tfmem.cli.main", "run", *args]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, env=environment, timeout=timeout)


def line_number(source: str, text: str) -> int:
    return next(number for number, line in enumerate(source.splitlines(), 1) if text in line)


def test_a_script_exits_3_with_its_peak_report_plot_and_journal(tmp_path: Path):
    (tmp_path / "grow.py").write_text(GROW)
    done = tfmem_run(tmp_path, "--report", "run.json", "--plot", "run.png", "grow.py", "20", "3")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "loaded 20 shards\n"  # the script's own output, untouched
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["format"] == "pytest-tfmem-run" and report["version"] == 1
    assert report["command"] == ["grow.py", "20", "3"] and report["kind"] == "script"
    assert report["returncode"] == report["exit_code"] == 3 and report["death"] is None
    marks = report["high_water_marks"]
    assert list(marks) == [str(report["script_pid"])]  # one process: its own peak is the tree's
    assert report["peak"] == marks[str(report["script_pid"])]
    assert 200 * MiB <= report["peak"] <= 200 * MiB + 80 * MiB  # 200 MiB of shards + the interpreter and NumPy
    assert report["sampled_peak"] <= report["peak"]
    assert report["place_at_peak"]["stack"][-1][0] == "load_shards"
    assert report["device_peaks"] == report["tf_peaks"] == {} and report["host_share"] is None
    assert report["advice"] == []
    assert report["timeline"] and report["timeline"][-1][0] <= report["duration_s"] + 0.1
    assert (tmp_path / "run.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = done.stderr.splitlines()
    assert summary[0].startswith("tfmem run: grow.py 20 3: exit code 3 after ")
    assert summary[1].startswith(f"  peak {report['peak'] / MiB:.1f} MiB ({platforms.current().marks_named}: main process")
    assert ", reached in load_shards (grow.py:" in summary[1]  # at np.ones or time.sleep: both in the loop
    # the script's own figure beside the process's: what its first imports kept (numpy's) is theirs
    own, imports = report["own_peak"], dict(report["first_imports"])
    assert "numpy" in imports and 0 < report["peak"] - own - sum(imports.values()) < 40 * MiB  # the interpreter
    assert 200 * MiB <= own <= 200 * MiB + 4 * MiB  # its shards
    assert summary[2] == (f"  the script's own: {own / MiB:.1f} MiB above the interpreter's start, its first imports "
                          f"apart ({first_imports_text(tuple(map(tuple, report['first_imports'])))}), as pytest-tfmem "
                          "gives a test's")
    last = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "last"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert last.returncode == 0, last.stdout
    assert "results of tfmem run grow.py 20 3 started" in last.stdout
    assert "failed   grow.py 20 3  peak " in last.stdout


def test_kill_at_stops_the_script_where_it_was_and_tfmem_last_tells_it(tmp_path: Path):
    (tmp_path / "grow.py").write_text(GROW)
    done = tfmem_run(tmp_path, "--kill-at", "150MiB", "grow.py", "100")
    assert done.returncode == 137, done.stderr  # the shell's code for SIGKILL
    assert "loaded" not in done.stdout
    killed = [line for line in done.stderr.splitlines() if line.startswith("  killed by --kill-at at ")]
    assert len(killed) == 1 and killed[0].endswith(", limit 150.0 MiB"), done.stderr
    assert " in load_shards (grow.py:" in killed[0]
    assert "SIGKILL, sent by tfmem run's watchdog (--kill-at)" in done.stderr
    last = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "last"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert last.returncode == 1  # the script did not finish
    assert "killed   grow.py 100  peak " in last.stdout and "killed by --kill-at at " in last.stdout
    assert "in load_shards (grow.py:" in last.stdout and "exit status 137" in last.stdout


def test_tfmem_last_tells_where_the_script_was_when_tfmem_run_itself_was_killed(tmp_path: Path):
    (tmp_path / "grow.py").write_text(GROW.replace("time.sleep(0.01)", "time.sleep(0.2)"))
    command = [sys.executable, "-m", "pytest_tfmem.cli.main", "run", "grow.py", "100"]
    process = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.DEVNULL, start_new_session=True)
    time.sleep(4)
    os.killpg(process.pid, signal.SIGKILL)  # tfmem run and the script at once: no summary, no finish line
    process.wait()
    last = subprocess.run([sys.executable, "-m", "pytest_tfmem.cli.main", "last"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert last.returncode == 1
    assert "it did NOT finish: the tfmem run process is gone (killed, or crashed)" in last.stdout
    assert "running when the journal ends:" in last.stdout and "grow.py 100: started " in last.stdout
    # the loop sleeps most of the time, but the last reading may fall on its allocation
    lines = {line_number(GROW, text) for text in ("time.sleep", "np.ones")}
    assert any(f"in load_shards (grow.py:{line})" in last.stdout for line in lines), last.stdout
    assert "finished: 0 run" in last.stdout


@pytest.mark.linux  # a memory cgroup's OOM-kill count
def test_a_real_oom_kill_in_a_memory_cgroup_is_named_with_the_limit(tmp_path: Path):
    (tmp_path / "grow.py").write_text(GROW)
    limit = 400 * MiB
    with memory_cgroup(limit) as cgroup:
        swap = cgroup / "memory.memsw.limit_in_bytes"
        if swap.exists():  # no swap either: the OOM killer acts
            swap.write_text(str(limit))
        enter = ("sh", "-c", f'echo $$ > {cgroup / "cgroup.procs"} && exec "$@"', "sh")
        done = tfmem_run(tmp_path, "--report", "run.json", "grow.py", "200", prefix=enter)
        kills = oom_kills(cgroup)  # 1, or more where the kernel took another process of the cgroup too
        assert kills >= 1
    assert done.returncode == 137, done.stderr
    death = json.loads((tmp_path / "run.json").read_text())["death"]
    assert death["signal"] == "SIGKILL" and death["sender"] == "the kernel's OOM killer"
    assert death["limit"] == limit and "memory.limit_in_bytes" in death["limit_source"]
    assert death["place"]["stack"][-1][0] == "load_shards"
    # RSS also counts file-backed pages (the interpreter's and NumPy's libraries: about 13 MiB a
    # process) that the kernel charged to the cgroup that first read them, not to this one: the
    # last reading may pass the limit by those (403 MiB of 400 once).
    assert 250 * MiB < death["last_rss"] <= limit + 48 * MiB
    assert f"  killed by the OOM killer (this cgroup's oom_kill count rose by {kills}) at " in done.stderr
    assert "in load_shards (grow.py:" in done.stderr and ", limit 400.0 MiB" in done.stderr


def test_a_forked_worker_counts_in_the_tree(tmp_path: Path):
    (tmp_path / "forks.py").write_text(FORKS)
    done = tfmem_run(tmp_path, "--report", "run.json", "forks.py")
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "run.json").read_text())
    marks = {int(pid): mark for pid, mark in report["high_water_marks"].items()}
    worker = [mark for pid, mark in marks.items() if pid != report["script_pid"]]
    # The worker's own high-water mark, less what it shared with the script at the fork: the worker
    # told that size itself (the agent's fork_sizes page), so its 200 MiB read to the page.
    assert len(worker) == 1 and 200 * MiB <= worker[0] <= 205 * MiB
    assert report["peak"] == sum(marks.values()) >= 200 * MiB + marks[report["script_pid"]]
    assert "+ 1 other process(es) " in done.stderr


def test_a_command_that_is_not_python_gets_the_outside_view(tmp_path: Path):
    hog = 'x=$(head -c 60000000 /dev/zero | tr "\\0" a); echo "${#x} bytes held"; exit 4'
    done = tfmem_run(tmp_path, "--report", "run.json", "--", "sh", "-c", hog)
    assert done.returncode == 4, done.stderr
    assert done.stdout == "60000000 bytes held\n"
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["kind"] == "command" and report["command"][0] == "sh"
    assert report["high_water_marks"][str(report["script_pid"])] >= 60_000_000  # the shell's own string
    assert report["place_at_peak"] is None and report["device_peaks"] == {}


def test_a_module_runs_as_python_m_would(tmp_path: Path):
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "__init__.py").write_text("")
    (tmp_path / "jobs" / "nightly.py").write_text("import sys\nprint(__name__, sys.argv[1:])\nsys.exit(7)\n")
    done = tfmem_run(tmp_path, "-m", "jobs.nightly", "--epochs", "3")
    assert done.returncode == 7, done.stderr
    assert done.stdout == "__main__ ['--epochs', '3']\n"
    assert done.stderr.startswith("tfmem run: -m jobs.nightly --epochs 3: exit code 7 after ")


def test_ctrl_c_reaches_the_script_and_sigterm_is_passed_on(tmp_path: Path):
    (tmp_path / "waits.py").write_text(WAITS)
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "pytest_tfmem.cli.main", "run", "waits.py"]
    for sent, code, said in ((signal.SIGINT, 5, "the script got SIGINT"), (signal.SIGTERM, 128 + 15, None)):
        process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=environment, start_new_session=True)
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        if sent == signal.SIGINT:
            os.killpg(process.pid, signal.SIGINT)  # what the terminal does on Ctrl-C: the whole foreground group
        else:
            os.kill(process.pid, signal.SIGTERM)  # to tfmem run alone, as a supervisor would
        out, err = process.communicate(timeout=60)
        assert process.returncode == code, err
        if said:
            assert out == f"{said}\n"
        else:
            assert "stopped by SIGTERM from outside" in err and "sent by tfmem run, which passed on" in err


SLOW_NVML = """
import os
import time

open(os.environ["NVML_OPENING"], "w").close()
time.sleep(3)  # an import as slow as pynvml's on a busy machine
raise ImportError("no NVML here")
"""


def test_ctrl_c_while_tfmem_run_still_opens_its_gpu_view_is_the_scripts(tmp_path: Path):
    (tmp_path / "waits.py").write_text(WAITS)
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "pynvml.py").write_text(SLOW_NVML)
    opening = tmp_path / "opening"
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "NVML_OPENING": str(opening),
                   "PYTHONPATH": os.pathsep.join([str(fakes), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-m", "pytest_tfmem.cli.main", "run", "waits.py"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment,
                               start_new_session=True)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    deadline = time.monotonic() + 30
    while not opening.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert opening.exists()
    os.killpg(process.pid, signal.SIGINT)  # while tfmem run sleeps in the stand-in pynvml's import
    out, err = process.communicate(timeout=60)
    assert process.returncode == 5, err
    assert out == "the script got SIGINT\n" and "KeyboardInterrupt" not in err, err


def test_budget_passed_exits_1_with_a_verdict(tmp_path: Path):
    (tmp_path / "grow.py").write_text(GROW)
    done = tfmem_run(tmp_path, "--budget", "100MB", "grow.py", "15")
    assert done.returncode == 1, done.stderr
    assert "  over budget: peak " in done.stderr and " > --budget=100MB (95.4 MiB)" in done.stderr


FILE_NVML = """
import json
import os
from fake_nvml import FakeGpu, FakeNvml

class FileNvml(FakeNvml):
    '''The fake driver's per-process memory is what the script wrote to held.json ({pid: bytes}).'''

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        try:
            with open(os.path.join(os.environ["FAKE_GPU_DIR"], "held.json")) as held:
                handle.processes = {int(pid): amount for pid, amount in json.load(held).items()}
        except (OSError, ValueError):
            pass
        return super().nvmlDeviceGetComputeRunningProcesses(handle)

_fake = FileNvml([FakeGpu("Fake H100", 80 * 2**30)])

def __getattr__(name):
    return getattr(_fake, name)
"""

HOLDS_GPU = """
import json, os, time
with open("held.json", "w") as held:
    json.dump({os.getpid(): 3 * 2**30}, held)
time.sleep(0.5)
"""


def test_gpu_budget_on_what_nvml_sees_of_the_script(tmp_path: Path):
    fakes = tmp_path / "fakes"
    fakes.mkdir()
    (fakes / "fake_nvml.py").write_text((Path(__file__).parent / "fake_nvml.py").read_text())
    (fakes / "pynvml.py").write_text(FILE_NVML)
    (tmp_path / "holds.py").write_text(HOLDS_GPU)
    env = {"PYTHONPATH": os.pathsep.join([str(fakes), os.environ.get("PYTHONPATH", "")]),
           "FAKE_GPU_DIR": str(tmp_path)}
    done = tfmem_run(tmp_path, "--gpu-budget", "2GiB", "--report", "run.json", "holds.py", env=env)
    assert done.returncode == 1, done.stderr
    assert "  GPU (NVML, sampled): nvml:0 3.0 GiB" in done.stderr
    assert "  over GPU budget on nvml:0: 3.0 GiB > --gpu-budget=2.0 GiB" in done.stderr
    assert json.loads((tmp_path / "run.json").read_text())["gpu_peaks"] == {"nvml:0": 3 * 2**30}


FAKE_JAX_GPU = """
import os, sys, time, types

print(os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"), os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH"))


class Gpu:  # jax.Device as the agent reads it: a level and a lifetime peak
    platform, id = "gpu", 0
    in_use = peak = 0

    def hold(self, size):
        self.in_use += size
        self.peak = max(self.peak, self.in_use)

    def memory_stats(self):
        return {"bytes_in_use": self.in_use, "peak_bytes_in_use": self.peak}


gpu = Gpu()
backend = types.SimpleNamespace(local_devices=lambda: [gpu])
jax = types.ModuleType("jax")
jax.devices = lambda: [gpu]
bridge = types.ModuleType("jax._src.xla_bridge")
bridge._backends = {"cuda": backend}  # JAX's runtime has started
sys.modules.update({"jax": jax, "jax._src.xla_bridge": bridge})
gpu.hold(3 * 2**30)
time.sleep(0.5)
gpu.hold(-2 * 2**30)
time.sleep(0.5)
"""


def test_a_jax_gpu_is_read_judged_and_drawn_through_its_device_view(tmp_path: Path):
    """The agent reads any framework's device views: a JAX GPU's ``memory_stats()`` (a fake: this
    machine has no GPU) is shown, held to ``--gpu-budget`` and kept in the report's timeline. With
    a GPU budget the frameworks' pools are off, where the user did not choose."""
    (tmp_path / "jax_gpu.py").write_text(FAKE_JAX_GPU)
    done = tfmem_run(tmp_path, "--gpu-budget", "2GiB", "--report", "run.json", "--plot", "run.png", "jax_gpu.py",
                     env={"TF_FORCE_GPU_ALLOW_GROWTH": "false"})
    assert done.returncode == 1, done.stderr
    assert done.stdout == "false false\n"  # preallocation off; the user's TensorFlow setting kept
    assert "  XLA_PYTHON_CLIENT_PREALLOCATE=false set for the program (--gpu-budget given)" in done.stderr
    assert "  device peaks: JAX gpu:0 device 3.0 GiB; host share (NumPy, Python, libraries) " in done.stderr
    assert "  over GPU budget on jax:gpu:0: 3.0 GiB > --gpu-budget=2.0 GiB" in done.stderr
    assert "JAX started" not in done.stderr  # its view says so
    report = json.loads((tmp_path / "run.json").read_text())
    assert report["runtimes"] == ["JAX"] and report["device_peaks"] == {"jax:gpu:0": 3 * 2**30}
    assert report["gpu_environment"] == ["XLA_PYTHON_CLIENT_PREALLOCATE=false"]
    assert report["tf_peaks"] == {} and report["tf_timeline"] == []
    levels = [levels["jax:gpu:0"] for _, levels in report["device_timeline"]]
    assert 3 * 2**30 in levels and levels[-1] == 2**30
    assert report["host_share"] < 200 * MiB  # GPU memory is not in RSS
    assert (tmp_path / "run.png").read_bytes().startswith(b"\x89PNG")


def test_a_keras_script_shows_tensorflow_allocator_peaks_and_the_host_share(tmp_path: Path):
    (tmp_path / "train.py").write_text(KERAS)
    done = tfmem_run(tmp_path, "--report", "run.json", "train.py", timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "trained\n"
    report = json.loads((tmp_path / "run.json").read_text())
    assert set(report["device_peaks"]) == {"tf:CPU:0"} and 0 < report["device_peaks"]["tf:CPU:0"] < 100 * MiB
    assert report["tf_peaks"] == {"CPU:0": report["device_peaks"]["tf:CPU:0"]}  # version 1's field, kept
    assert {tuple(levels) for _, levels in report["device_timeline"]} == {("tf:CPU:0",)}
    assert report["host_share"] >= 900 * MiB  # the NumPy data, outside TensorFlow's allocator
    assert report["peak"] >= report["host_share"] + report["device_peaks"]["tf:CPU:0"]
    assert "  device peaks: TF CPU:0 allocator " in done.stderr
    assert len(report["advice"]) == 1 and "stream it in batches with tf.data" in report["advice"][0]
    assert "docs/scenarios.md" in report["advice"][0]


def test_advice_on_the_batch_size_only_when_tensorflow_dominates_in_fit():
    in_fit = Place((("main", "train.py", 30),), "fit", 0.0)
    loading = Place((("load", "train.py", 10),), "array", 0.0)
    GiB = 2**30
    (batch,) = advise(3 * GiB, 0, {"tf:GPU:0": 2 * GiB}, in_fit, ["TensorFlow"])
    assert batch.startswith("The TF GPU:0 allocator holds most of the peak (2.0 GiB) during fit: a smaller batch")
    assert "find_max_batch_size" in batch
    (jax_gpu,) = advise(3 * GiB, 0, {"jax:gpu:0": 2 * GiB}, in_fit, ["JAX"])
    assert jax_gpu.startswith("The JAX gpu:0 device holds most of the peak (2.0 GiB) during fit")
    assert advise(3 * GiB, 0, {"tf:GPU:0": 2 * GiB}, loading, ["TensorFlow"]) == []  # not reached in fit
    assert advise(3 * GiB, 0, {"tf:GPU:0": GiB}, in_fit, ["TensorFlow"]) == []  # TensorFlow does not dominate
    assert advise(3 * GiB, 2 * GiB, {}, None, []) == []  # no framework started: no advice
    (jax,) = advise(3 * GiB, 2 * GiB, {}, None, ["JAX"])  # JAX keeps no allocator view on CPU
    assert jax.startswith("2.0 GiB of the peak is data (NumPy arrays, Python objects) taken after JAX started; "
                          "stream it in batches with a keras.utils.PyDataset or tf.data")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["missing.py"], "tfmem: error: no such script: 'missing.py'"),
        (["-m", "no_such_module_here"], "tfmem: error: no module named 'no_such_module_here'"),
        (["--", "no-such-program-here"], "tfmem: error: no such command: 'no-such-program-here'"),
        (["--budget", "lots", "grow.py"], "argument --budget: invalid --budget size 'lots': expected a non-negative"),
        (["--frobnicate", "grow.py"], "tfmem: error: unrecognized arguments: --frobnicate"),
        ([], "tfmem: error: nothing to run: give script.py, -m module or -- COMMAND"),
    ],
)
def test_bad_input_is_a_usage_error_naming_it(args: list[str], said: str, tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "grow.py").write_text(GROW)
    try:
        code = main(["run", *args])
    except SystemExit as exit:  # argparse's own usage errors
        code = exit.code
    assert code == 2
    assert said in capsys.readouterr().err


def test_help_says_which_form_is_which(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert "usage: tfmem run [OPTIONS] (script.py | -m module | -- COMMAND) [ARGS]" in text
    assert "tfmem run [OPTIONS] -- COMMAND [ARGS]   any program" in text


def test_the_agent_loads_no_pytest_into_the_script(tmp_path: Path):
    (tmp_path / "modules.py").write_text(
        "import sys\nprint(sorted(name for name in sys.modules if name.split('.')[0] in ('pytest', '_pytest', 'pytest_tfmem')))\n"
    )
    done = tfmem_run(tmp_path, "modules.py")
    assert done.returncode == 0 and done.stdout == "[]\n", done.stderr


def test_the_tfmem_command_starts_without_pytest():
    """``tfmem run``'s start is part of every run's cost: neither the command nor the run imports pytest."""
    code = (
        "import sys, pytest_tfmem.cli.main as cli, pytest_tfmem.run.command\n"
        "print('pytest' in sys.modules, '_pytest' in sys.modules)\n"
        "from pytest_tfmem.gates.merge import PREFER_RULES\n"
        "merge = next(c for c in cli.COMMANDS if c.name == 'merge')\n"
        "prefer = next(a for a in merge.arguments if a.names[0] == '--prefer')\n"
        "print(tuple(prefer.options['choices']) == PREFER_RULES)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False", "True"], done.stdout + done.stderr


def test_agent_lines_cut_short_or_garbled_leave_the_summary_with_what_is_whole(tmp_path: Path):
    """The exit line has no RSS (a script that exits right after TensorFlow starts has no other
    line with TF: the summary once raised KeyError 'rss' there); a line may be cut or garbled."""
    from pytest_tfmem.run.summary import AgentView

    lines = [
        {"event": "agent", "pid": 42, "time": 1.0},
        {"event": "reading", "rss": 10, "stack": [], "views": {"tf:CPU:0": "garbled"}, "time": 2.0},
        {"event": "reading", "rss": 11, "stack": []},  # no time
        {"event": "exit", "time": 3.0, "high_water_mark": 300 * MiB, "views": {"tf:CPU:0": [0, 200 * MiB]}},
    ]
    path = tmp_path / "agent.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"event": "reading", "rss": 1')
    agent = AgentView.read(path)
    assert [reading.get("rss") for reading in agent.readings] == [None]  # the exit line alone
    assert agent.rss_when_started() is None and agent.device_peaks() == {"tf:CPU:0": 200 * MiB}
    assert agent.high_water_mark == 300 * MiB and agent.exited



def test_the_level_when_the_runtime_started_takes_no_data_loaded_before_a_late_reading(tmp_path: Path):
    """On a loaded machine the first reading that sees JAX started may come after the script
    loaded its data: the level at the start is the last reading before it, or the start plus
    what the imports kept by then, whichever is larger; never that late reading's RSS."""
    from pytest_tfmem.run.summary import AgentView

    def level(lines: list[dict[str, object]]) -> int | None:
        path = tmp_path / "agent.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines))
        return AgentView.read(path).rss_when_started()

    start = {"event": "agent", "pid": 42, "time": 1.0, "rss": 30 * MiB}
    imported = {"event": "import", "time": 2.0, "module": "jax", "host_bytes": 100 * MiB}
    late = {"event": "reading", "time": 3.0, "rss": 560 * MiB, "stack": [], "views": {}, "runtimes": ["JAX"]}
    after_import = {"event": "reading", "time": 2.5, "rss": 140 * MiB, "stack": [], "views": {}, "runtimes": []}
    assert level([start, imported, after_import, late]) == 140 * MiB
    mid_import = {**after_import, "time": 1.5, "rss": 60 * MiB}  # the import ends after it: what it kept counts
    assert level([start, mid_import, imported, late]) == 130 * MiB
    assert level([start, imported]) is None  # no runtime seen


LIBRARY = """
import sys


def fit():
    return sys._getframe()


def error_handler(call):
    return call()
"""


def test_the_place_names_the_library_function_called_past_its_wrappers(tmp_path: Path, monkeypatch):
    from pytest_tfmem.run.agent import where

    (tmp_path / "place_library.py").write_text(LIBRARY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import place_library as library

    place = where(library.error_handler(library.fit), (str(tmp_path),))
    assert place["calling"] == "fit"
    assert place["stack"][-1][0] == "test_the_place_names_the_library_function_called_past_its_wrappers"
    assert where(library.error_handler(sys._getframe), (str(tmp_path),))["calling"] is None  # a wrapper alone


STRESS = """
import os, signal, sys
import {module} as framework
held = [framework.ones((50 * 2**20 // 4,), "float32") for _ in range(4)]  # 200 MiB of arrays
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.longest
@pytest.mark.slow
def test_tfmem_run_never_loses_the_scripts_exit_code(tmp_path: Path):
    """Many runs of a script that holds 200 MiB and exits at once: its exit code, a death, a budget
    passed; each ends with its summary and its code, never a traceback. The races repeated are the
    agent's and the watchdog's (a line cut short at an exit or a kill), the same whatever holds the
    memory: NumPy's script repeats them in a second a run; TensorFlow's (its allocators' figures in
    the exit line, no reading after its start) runs each case once, at 5 s a run."""
    (tmp_path / "tensors.py").write_text(STRESS.format(module="tensorflow"))
    (tmp_path / "arrays.py").write_text(STRESS.format(module="numpy"))
    cases = [((), "3", 3), (("--budget", "100MB"), "0", 1), ((), "kill", 137)]
    for script, repeat in (("tensors.py", 1), ("arrays.py", 4)):
        for options, argument, code in cases * repeat:
            done = tfmem_run(tmp_path, *options, script, argument)
            assert done.returncode == code, done.stderr
            assert "Traceback" not in done.stderr and f"tfmem run: {script}" in done.stderr
