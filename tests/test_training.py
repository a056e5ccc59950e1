"""Whole training steps: the classifier's gradients against PyTorch, a GAN's two networks in one
graph against the same computation in PyTorch, a short digits run, determinism and the demo."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import stitchml as sm
from stitchml import data, nn, optim
from stitchml.demos import mnist


# -- the classifier's network, layer kinds the demo uses ---------------------------------------
def test_classifier_gradients_match_torch_for_any_batch_size():
    model = mnist.build((1, 8, 8), seed=3, dtype=sm.float64)
    g = model.graph
    grads = g.gradients(model.loss, model.parameters)
    rng = np.random.default_rng(0)
    for n in (5, 9):  # two batch sizes through the one placeholder of extent -1
        x = rng.random((n, 1, 8, 8))
        y = rng.integers(0, 10, n)
        out = g.run({model.images: x, model.labels: y}, [model.loss] + [grads[p] for p in model.parameters],
                    device="cpu")
        w = [torch.tensor(g.variable_value(p).numpy(), requires_grad=True) for p in model.parameters]
        h = F.max_pool2d(F.relu(F.conv2d(torch.tensor(x), w[0], w[1], padding=2)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, w[2], w[3], padding=2)), 2)
        logits = F.relu(h.reshape(n, -1) @ w[4] + w[5]) @ w[6] + w[7]
        loss = F.cross_entropy(logits, torch.tensor(y))
        loss.backward()
        assert out[model.loss].item() == pytest.approx(loss.item(), rel=1e-12)
        for p, t in zip(model.parameters, w):
            np.testing.assert_allclose(out[grads[p]].numpy(), t.grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=p.name)


# -- two networks in one graph -------------------------------------------------------------------
def _mlp_weights(rng, sizes):
    return [(rng.standard_normal((a, b)) * 0.8, rng.standard_normal(b) * 0.1) for a, b in zip(sizes, sizes[1:])]


def _mlp(ops, layers, x):
    for i, (w, b) in enumerate(layers):
        x = x @ w + b
        if i < len(layers) - 1:
            x = ops.tanh(x)
    return x


def _gan_losses(ops, softplus, mean, gen, disc, real, z, disc_for_gen=None):
    """Discriminator: real -> 1, fake -> 0 (logistic loss); generator: the non-saturating loss,
    through `disc_for_gen` (default: the same discriminator)."""
    fake = _mlp(ops, gen, z)
    d_real, d_fake = _mlp(ops, disc, real), _mlp(ops, disc, fake)
    d_fake_for_gen = d_fake if disc_for_gen is None else _mlp(ops, disc_for_gen, fake)
    return mean(softplus(-d_real)) + mean(softplus(d_fake)), mean(softplus(-d_fake_for_gen))


@pytest.mark.parametrize("order", ["simultaneous", "sequential"])
def test_gan_two_networks_one_graph_match_torch(order):
    """Both updates in one run. "simultaneous": both passes read the weights from the start of the
    run. "sequential": the generator's pass reads the discriminator after its update (read_variable
    under control dependencies), the usual PyTorch loop, still in one run."""
    rng = np.random.default_rng(7)
    gen0, disc0 = _mlp_weights(rng, [2, 6, 2]), _mlp_weights(rng, [2, 5, 1])
    steps = [(rng.standard_normal((16, 2)) * 0.5 + 2.0, rng.standard_normal((16, 2))) for _ in range(8)]

    g = sm.Graph("gan")
    real = g.placeholder((-1, 2), sm.float64, name="real")
    z = g.placeholder((-1, 2), sm.float64, name="z")
    gen = [(g.variable(w, name=f"gen{i}/w"), g.variable(b, name=f"gen{i}/b")) for i, (w, b) in enumerate(gen0)]
    disc = [(g.variable(w, name=f"disc{i}/w"), g.variable(b, name=f"disc{i}/b")) for i, (w, b) in enumerate(disc0)]
    gen_vars, disc_vars = [v for layer in gen for v in layer], [v for layer in disc for v in layer]
    d_loss, g_loss = _gan_losses(g, g.softplus, g.reduction_mean, gen, disc, real, z)

    before = len(g.operations)
    d_updates = optim.Adam(0.05, beta1=0.5).minimize(g, d_loss, disc_vars)
    d_ops = g.operations[before:]
    if order == "sequential":
        with g.control_dependencies(d_updates):
            updated = [(g.read_variable(w), g.read_variable(b)) for w, b in disc]
        _, g_loss = _gan_losses(g, g.softplus, g.reduction_mean, gen, disc, real, z, updated)
    before = len(g.operations)
    g_updates = optim.SGD(0.1, momentum=0.5).minimize(g, g_loss, gen_vars)
    g_ops = g.operations[before:]
    # The discriminator's gradients never read the generator's weights; the generator's pass
    # differentiates through the discriminator (its weights appear in the backward ops).
    reads = lambda ops: {t.id for op in ops for t in op.inputs}  # noqa: E731
    disc_reads = {v.id for v in disc_vars} | {t.id for layer in (updated if order == "sequential" else []) for t in layer}
    assert not reads(d_ops) & {v.id for v in gen_vars}
    assert reads(g_ops) & disc_reads
    assert {op.inputs[0].id for op in d_updates} >= {v.id for v in disc_vars}
    assert not {op.inputs[0].id for op in g_updates} & {v.id for v in disc_vars}

    t_gen = [(torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)) for w, b in gen0]
    t_disc = [(torch.tensor(w, requires_grad=True), torch.tensor(b, requires_grad=True)) for w, b in disc0]
    t_gen_vars, t_disc_vars = [p for layer in t_gen for p in layer], [p for layer in t_disc for p in layer]
    d_opt = torch.optim.Adam(t_disc_vars, lr=0.05, betas=(0.5, 0.999))
    g_opt = torch.optim.SGD(t_gen_vars, lr=0.1, momentum=0.5)

    for step, (real_np, z_np) in enumerate(steps, start=1):
        out = g.run({real: real_np, z: z_np}, [d_loss, g_loss], d_updates + g_updates, device="cpu")
        batch = (torch.tensor(real_np), torch.tensor(z_np))
        td, tg = _gan_losses(torch, F.softplus, torch.mean, t_gen, t_disc, *batch)
        for p, grad in zip(t_disc_vars, torch.autograd.grad(td, t_disc_vars, retain_graph=True)):
            p.grad = grad
        if order == "sequential":
            d_opt.step()
            _, tg = _gan_losses(torch, F.softplus, torch.mean, t_gen, t_disc, *batch)
        for p, grad in zip(t_gen_vars, torch.autograd.grad(tg, t_gen_vars)):
            p.grad = grad
        if order == "simultaneous":
            d_opt.step()
        g_opt.step()
        assert out[d_loss].item() == pytest.approx(td.item(), rel=1e-12)
        assert out[g_loss].item() == pytest.approx(tg.item(), rel=1e-12)
        for v, t in zip(gen_vars + disc_vars, t_gen_vars + t_disc_vars):
            np.testing.assert_allclose(g.variable_value(v).numpy(), t.detach().numpy(), rtol=1e-10, atol=1e-10,
                                       err_msg=f"{v.name} after step {step}")
    for v, (w, _) in zip(gen_vars[::2] + disc_vars[::2], gen0 + disc0):
        assert np.abs(g.variable_value(v).numpy() - w).max() > 1e-2, f"{v.name} must have trained"


# -- the digit classifier --------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def one_thread():
    """As the demo does for the 8x8 digits: with pytest -n 2 on two cores, more threads per
    worker only wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _train_digits(seed, epochs=None, train=None):
    d = data.load_digits(seed=0)
    if train is not None:
        d = d.subset(train, len(d.test_labels))
    defaults = mnist.DEFAULTS["digits"]
    model = mnist.build(d.image_shape, seed=seed, learning_rate=defaults["learning_rate"]["adam"])
    losses = mnist.train(model, d, epochs or defaults["epochs"], defaults["batch_size"], seed=seed, device="cpu",
                         progress=False)
    return model, d, losses


def test_digits_training_reaches_the_stated_accuracy():
    """The demo's default run on the 8x8 digits: at least 97% of the held-out fifth."""
    model, d, losses = _train_digits(seed=0)
    accuracy = mnist.evaluate(model, d.test_images, d.test_labels, device="cpu")
    assert accuracy >= 0.97, accuracy
    assert np.mean(losses[-20:]) < 0.25 * np.mean(losses[:5])


def test_training_is_deterministic_with_a_seed():
    runs = [_train_digits(seed, epochs=1, train=320) for seed in (1, 1, 2)]
    (a, _, la), (b, _, lb), (c, _, _) = runs
    assert la == lb
    for pa, pb, pc in zip(a.parameters, b.parameters, c.parameters):
        va, vb = a.graph.variable_value(pa).numpy(), b.graph.variable_value(pb).numpy()
        assert va.tobytes() == vb.tobytes(), f"{pa.name} differs between two runs with the same seed"
    assert any(not np.array_equal(a.graph.variable_value(pa).numpy(), c.graph.variable_value(pc).numpy())
               for pa, pc in zip(a.parameters, c.parameters))


def test_demo_command_trains_and_writes_weights(tmp_path, capsys):
    from safetensors.numpy import load_file

    out = tmp_path / "w.safetensors"
    assert mnist.main(["--epochs", "1", "--seed", "4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "digits: 1437 training and 360 test images" in printed and "test accuracy" in printed
    weights = load_file(str(out))
    assert sorted(weights) == sorted(["conv1/weights", "conv1/bias", "conv2/weights", "conv2/bias",
                                      "dense1/weights", "dense1/bias", "dense2/weights", "dense2/bias"])
    assert weights["conv1/weights"].shape == (16, 1, 5, 5) and weights["dense2/weights"].dtype == np.float32
    fresh = mnist.build((1, 8, 8), seed=4)
    assert not np.array_equal(fresh.graph.variable_value(fresh.parameters[0]).numpy(), weights["conv1/weights"])


def test_demo_reports_a_bad_data_folder(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        mnist.main(["--data", str(tmp_path)])
    assert exit_.value.code == 2
    assert "expected the MNIST file train-images-idx3-ubyte.gz" in capsys.readouterr().err


# -- layers -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout, groups", [("NCHW", 1), ("NHWC", 2)])
def test_conv2d_layer_matches_torch(layout, groups):
    g = sm.Graph()
    descriptor = sm.Convolution2DDescriptor(stride=2, padding=1, groups=groups, data_layout=layout)
    layer = nn.Conv2d(g, 4, 6, 3, descriptor, rng=np.random.default_rng(1), dtype=sm.float64)
    w, b = (g.variable_value(p).numpy() for p in layer.parameters)
    assert w.shape == (6, 4 // groups, 3, 3) and np.abs(w).max() <= 1 / np.sqrt(4 // groups * 9)
    x_nchw = np.random.default_rng(2).standard_normal((2, 4, 7, 7))
    x_np = x_nchw if layout == "NCHW" else x_nchw.transpose(0, 2, 3, 1).copy()
    x = g.placeholder(x_np.shape, sm.float64)
    y = layer(x)
    out = g.run({x: x_np}, [y], device="cpu")[y].numpy()
    ref = F.conv2d(torch.tensor(x_nchw), torch.tensor(w), torch.tensor(b), stride=2, padding=1, groups=groups).numpy()
    np.testing.assert_allclose(out if layout == "NCHW" else out.transpose(0, 3, 1, 2), ref, rtol=1e-12, atol=1e-13)


def test_layers_draw_the_same_weights_from_the_same_seed():
    values = []
    for seed in (5, 5, 6):
        g = sm.Graph()
        layer = nn.Dense(g, 8, 3, rng=np.random.default_rng(seed))
        values.append([g.variable_value(p).numpy() for p in layer.parameters])
    assert all(np.array_equal(a, b) for a, b in zip(values[0], values[1]))
    assert not np.array_equal(values[0][0], values[2][0])
    assert np.abs(values[0][0]).max() <= 1 / np.sqrt(8) and values[0][1].shape == (3,)
    with pytest.raises(sm.ShapeError, match="Conv2d: expected a descriptor with weights_layout 'OIHW', got 'HWIO'"):
        nn.Conv2d(sm.Graph(), 1, 2, 3, sm.Convolution2DDescriptor(weights_layout="HWIO"), rng=np.random.default_rng(0))
