"""The acceptance snippets of the graph model and gradient issues, run as written."""
import numpy as np

import stitchml as sm


def test_graph_model_acceptance():
    g = sm.Graph()
    x = g.placeholder((-1, 8), sm.float32, name="x")
    y = 0.5 * x * (1.0 + g.erf(x * g.reciprocal(g.square_root(g.constant(2.0, sm.float32)))))
    for n in (3, 5):
        a = np.random.randn(n, 8).astype(np.float32)
        out = g.run(feeds={x: sm.TensorData(a)}, targets=[y], device="cpu")[y].numpy()
        assert out.shape == (n, 8)
    w = g.variable(np.ones(8, np.float32), name="w")
    step = g.assign_variable(w, w * 2.0)
    g.run(target_ops=[step], device="cpu")
    g.run(target_ops=[step], device="cpu")
    r = g.read_variable(w)
    assert np.allclose(g.run(targets=[r], device="cpu")[r].numpy(), 4.0)
    try:
        g.matrix_multiplication(g.placeholder((2, 3), sm.float32), g.placeholder((4, 5), sm.float32))
        raise AssertionError("no ShapeError")
    except sm.ShapeError as e:
        assert "matrix_multiplication" in str(e)


def test_gradients_acceptance():
    g = sm.Graph()
    x = g.placeholder((-1, 3), sm.float64, name="x")
    w = g.variable(np.array([[0.5], [-1.0], [2.0]]), name="w")
    loss = g.reduction_sum(g.tanh(g.matrix_multiplication(x, w)) ** 2, axes=None)
    grads = g.gradients(loss, [w])
    a = np.random.randn(4, 3)
    gw = g.run(feeds={x: sm.TensorData(a)}, targets=[grads[w]], device="cpu")[grads[w]].numpy()
    t = np.tanh(a @ np.array([[0.5], [-1.0], [2.0]]))
    assert np.allclose(gw, a.T @ (2 * t * (1 - t ** 2)))
