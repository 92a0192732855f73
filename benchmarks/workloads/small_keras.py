"""Order workload: the small Keras tests most suites hold, on whichever backend KERAS_BACKEND names.

    KERAS_BACKEND=jax pytest benchmarks/workloads/small_keras.py --tfmem-budget=4GB -p randomly

Dense fit with Adam and with SGD, evaluate and predict, a Conv2D predict, an LSTM fit and an
Embedding fit, on every backend; a training loop written with the backend's own gradients
(TensorFlow's GradientTape, jax.grad, torch autograd); and on TensorFlow a tf.data pipeline.
``benchmarks/order_spread.py`` runs it in several orders.
"""

import keras
import numpy as np

BACKEND = keras.backend.backend()
X = np.random.default_rng(0).random((256, 16), dtype=np.float32)
Y = np.random.default_rng(1).random((256, 1), dtype=np.float32)


def dense_model():
    return keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(1)])


def test_dense_fit_adam():
    model = dense_model()
    model.compile(optimizer="adam", loss="mse")
    model.fit(X, Y, epochs=2, batch_size=32, verbose=0)


def test_dense_fit_sgd():
    model = dense_model()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(X, Y, epochs=2, batch_size=32, verbose=0)


def test_dense_evaluate():
    model = dense_model()
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    model.evaluate(X, Y, verbose=0)


def test_dense_predict():
    assert dense_model().predict(X, verbose=0).shape == (256, 1)


def test_conv2d_predict():
    model = keras.Sequential([
        keras.Input((28, 28, 1)), keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.MaxPooling2D(),
        keras.layers.Flatten(), keras.layers.Dense(10),
    ])
    assert model.predict(np.ones((64, 28, 28, 1), "float32"), verbose=0).shape == (64, 10)


def test_lstm_fit():
    model = keras.Sequential([keras.Input((10, 8)), keras.layers.LSTM(16), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((64, 10, 8), "float32"), np.ones((64, 1), "float32"), epochs=1, verbose=0)


def test_embedding_fit():
    model = keras.Sequential([
        keras.Input((12,), dtype="int32"), keras.layers.Embedding(100, 8), keras.layers.GlobalAveragePooling1D(),
        keras.layers.Dense(1),
    ])
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.ones((64, 12), "int32"), np.ones((64, 1), "float32"), epochs=1, verbose=0)


if BACKEND == "tensorflow":
    import tensorflow as tf

    def test_tf_data_pipeline():
        pipeline = tf.data.Dataset.from_tensor_slices((X, Y)).map(lambda x, y: (x * 2.0, y)).shuffle(64).batch(32)
        assert sum(float(tf.reduce_sum(x)) for x, _ in pipeline) > 0

    def test_gradient_loop():
        weights = tf.Variable(tf.zeros((16, 1)))
        optimizer = keras.optimizers.SGD(0.01)
        for _ in range(5):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((X @ weights - Y) ** 2)
            optimizer.apply_gradients([(tape.gradient(loss, weights), weights)])

elif BACKEND == "jax":
    import jax
    import jax.numpy as jnp

    def test_gradient_loop():
        def loss(weights):
            return jnp.mean((X @ weights - Y) ** 2)

        weights = jnp.zeros((16, 1))
        step = jax.jit(jax.grad(loss))
        for _ in range(5):
            weights = weights - 0.01 * step(weights)
        weights.block_until_ready()

elif BACKEND == "torch":
    import torch

    def test_gradient_loop():
        weights = torch.zeros((16, 1), requires_grad=True)
        optimizer = torch.optim.SGD([weights], lr=0.01)
        for _ in range(5):
            optimizer.zero_grad()
            ((torch.from_numpy(X) @ weights - torch.from_numpy(Y)) ** 2).mean().backward()
            optimizer.step()
