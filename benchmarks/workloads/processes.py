"""Tests whose memory lives in the processes they start (docs/measurement.md, "Processes a test starts").

    pytest benchmarks/workloads/processes.py --tfmem-budget=200MB -rA -p no:cacheprovider

Each worker or script holds 150 MiB: a training script run by ``subprocess``, a fork ``Pool``, a
spawn and a forkserver ``Process``, a ``ProcessPoolExecutor``, a Keras ``PyDataset`` with two
workers, a shell script that runs Python, a child the test kills, a pool left running.
"""

import concurrent.futures
import multiprocessing
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

MIB = 2**20
SCRIPT = "import sys\nblock = bytearray(int(sys.argv[1]) * 2**20)\nfor i in range(0, len(block), 4096): block[i] = 1\n"
POOLS = []


def hold(mib, seconds=0.3):
    block = bytearray(mib * MIB)
    for i in range(0, len(block), 4096):
        block[i] = 1
    time.sleep(seconds)
    return len(block)


def test_training_script():
    subprocess.run([sys.executable, "-c", SCRIPT, "150"], check=True)


def test_fork_pool():
    with multiprocessing.get_context("fork").Pool(2) as pool:
        pool.map(hold, [150, 150])


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_process(method):
    process = multiprocessing.get_context(method).Process(target=hold, args=(150,))
    process.start()
    process.join()


def test_process_pool_executor():
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        list(pool.map(hold, [150, 150]))


def test_keras_pydataset_workers():
    keras = pytest.importorskip("keras")

    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__(workers=2, use_multiprocessing=True)

        def __len__(self):
            return 4

        def __getitem__(self, index):
            scratch = np.ones(150 * MIB // 8)  # a batch made with 150 MiB of scratch space
            return np.full((8, 4), scratch[0], "float32"), np.zeros((8, 1), "float32")

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    model.fit(Batches(), epochs=1, verbose=0)


def test_shell_script():
    subprocess.run(["sh", "-c", f'"{sys.executable}" -c "$0" 150', SCRIPT], check=True)


def test_child_killed():
    child = subprocess.Popen([sys.executable, "-c", SCRIPT + "import time; time.sleep(30)\n", "40"])
    time.sleep(1)
    child.send_signal(signal.SIGKILL)
    child.wait()


def test_pool_left_running():
    POOLS.append(multiprocessing.get_context("fork").Pool(1))
    POOLS[-1].apply(hold, (30, 0))
