"""The GAN's parts and the demos of the talk's panels: batch normalization with running statistics and
dropout with a training flag against torch.nn in float64, the transposed convolution layer, the GAN
demo at a tiny size, its PNG grids and classifier score, and the GeLU panel at tiny sizes.

The op database (tests/opdb/composites.py) checks both ops' values, errors and gradients (against
torch.autograd and float64 finite differences) in the inference and fed-flag modes too."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import stitchml as sm
from stitchml import data, nn
from stitchml.demos import gan, gelu, mnist

F64 = sm.float64


@pytest.fixture(autouse=True)
def one_thread():
    """As the demos do for the 8x8 digits: with pytest -n 2 on two cores, more threads per worker only
    wait on each other (tens of times slower on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- batch normalization -------------------------------------------------------------------------------
@pytest.mark.parametrize("fed", [False, True], ids=["python-flag", "fed-flag"])
def test_batch_norm_running_statistics_follow_torch(fed):
    """Four training steps then two inference steps, against torch.nn.BatchNorm2d in float64: outputs,
    running mean and running variance (unbiased, momentum 0.3) agree to 1e-12."""
    rng = np.random.default_rng(0)
    g = sm.Graph()
    x = g.placeholder((-1, 3, 4, 5), F64, name="x")
    layer = nn.BatchNorm(g, 3, momentum=0.3, dtype=F64, name="bn")
    g.set_variable_value(layer.gamma, rng.uniform(0.5, 2.0, 3))
    g.set_variable_value(layer.beta, rng.standard_normal(3))
    flag = g.placeholder((), sm.bool, name="training") if fed else None
    train_y = layer(x, flag if fed else True)
    infer_y = train_y if fed else layer(x, False)
    assert len(layer.updates) == 2

    ref = torch.nn.BatchNorm2d(3, momentum=0.3).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(g.variable_value(layer.gamma).numpy()))
        ref.bias.copy_(torch.from_numpy(g.variable_value(layer.beta).numpy()))
    for step in range(6):
        training = step < 4
        batch = rng.standard_normal((2 + step, 3, 4, 5)) * 3.0 + 1.5
        feeds = {x: batch, **({flag: np.array(training)} if fed else {})}
        y = train_y if training else infer_y
        got = g.run(feeds, [y], layer.updates if training or fed else [])[y].numpy()
        ref.train(training)
        want = ref(torch.from_numpy(batch)).detach().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12, err_msg=f"step {step} output")
        np.testing.assert_allclose(g.variable_value(layer.running_mean).numpy(), ref.running_mean.numpy(),
                                   rtol=1e-12, atol=1e-14, err_msg=f"step {step} running mean")
        np.testing.assert_allclose(g.variable_value(layer.running_variance).numpy(), ref.running_var.numpy(),
                                   rtol=1e-12, err_msg=f"step {step} running variance")


def test_batch_norm_layer_on_features_and_compiled():
    """BatchNorm1d's layout (batch, features) and the compiled executable keep eager's results and updates."""
    rng = np.random.default_rng(1)
    g = sm.Graph()
    x = g.placeholder((8, 6), sm.float32, name="x")
    layer = nn.BatchNorm(g, 6, name="bn")
    y = layer(x)
    batch = (rng.standard_normal((8, 6)) * 2 + 1).astype(np.float32)
    exe = g.compile({x: sm.TensorType((8, 6), sm.float32)}, [y], layer.updates, device="cpu")
    got = exe.run({x: batch})[y].numpy()
    ref = torch.nn.BatchNorm1d(6)
    want = ref(torch.from_numpy(batch)).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g.variable_value(layer.running_variance).numpy(), ref.running_var.numpy(), rtol=1e-5)


def test_batch_norm_errors_name_the_problem():
    g = sm.Graph()
    x = g.placeholder((4, 3), sm.float32, name="x")
    with pytest.raises(sm.ShapeError, match=r"batch_normalization: inference \(training not True\) needs"):
        g.batch_normalization(x, training=False)
    with pytest.raises(sm.ShapeError, match="training must be a bool or a scalar bool tensor, got a tensor float32"):
        g.batch_normalization(x, training=g.placeholder((), sm.float32))


# -- dropout ----------------------------------------------------------------------------------------------------
def test_dropout_fed_flag_statistics_and_gradient():
    """Fed True: about `rate` of the elements are zero, the rest scaled, and the gradient is the same mask;
    fed False: the identity with gradient one, in the same graph."""
    g = sm.Graph()
    x = g.placeholder((100, 100), F64, name="x")
    flag = g.placeholder((), sm.bool, name="training")
    y = g.dropout(x, 0.4, seed=3, training=flag)
    dx = g.gradients(g.reduction_sum(y), [x])[x]
    xv = np.random.default_rng(4).uniform(0.5, 1.5, (100, 100))
    on = g.run({x: xv, flag: np.array(True)}, [y, dx])
    out, grad = on[y].numpy(), on[dx].numpy()
    assert abs((out == 0).mean() - 0.4) < 0.03
    np.testing.assert_allclose(out[out != 0], xv[out != 0] / 0.6, rtol=1e-15)
    np.testing.assert_array_equal(grad, np.where(out != 0, 1 / 0.6, 0.0))
    off = g.run({x: xv, flag: np.array(False)}, [y, dx])
    np.testing.assert_array_equal(off[y].numpy(), xv)
    np.testing.assert_array_equal(off[dx].numpy(), np.ones_like(xv))
    assert g.dropout(x, 0.4, training=False).op.op == "identity"


# -- transposed convolution layer ----------------------------------------------------------------------------------
def test_conv_transpose_layer_matches_torch():
    g = sm.Graph()
    layer = nn.ConvTranspose2d(g, 4, 3, 4, sm.Convolution2DDescriptor(stride=2, padding=1),
                               rng=np.random.default_rng(0), dtype=F64, name="up")
    x = g.placeholder((-1, 4, 5, 5), F64, name="x")
    y = layer(x)
    ref = torch.nn.ConvTranspose2d(4, 3, 4, 2, 1).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(g.variable_value(layer.weights).numpy()))
        ref.bias.copy_(torch.from_numpy(g.variable_value(layer.bias).numpy()))
    xv = np.random.default_rng(1).standard_normal((2, 4, 5, 5))
    got = g.run({x: xv}, [y])[y].numpy()
    assert got.shape == (2, 3, 10, 10)
    np.testing.assert_allclose(got, ref(torch.from_numpy(xv)).detach().numpy(), rtol=1e-12, atol=1e-12)
    bound = 1 / np.sqrt(3 * 4 * 4)  # torch's fan-in of ConvTranspose2d: out channels x kernel
    assert np.abs(g.variable_value(layer.weights).numpy()).max() <= bound


# -- the GAN demo --------------------------------------------------------------------------------------------------
def _nearest_distance(samples: np.ndarray, images: np.ndarray) -> float:
    """Mean Euclidean distance of each sample to its nearest image."""
    a, b = samples.reshape(len(samples), -1), images.reshape(len(images), -1)
    d2 = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T
    return float(np.sqrt(np.maximum(d2.min(1), 0)).mean())


def test_tiny_gan_trains_in_one_run_per_step():
    """A small GAN on the 8x8 digits for 160 steps: the losses stay finite, each run updates both networks
    and the running statistics, and the samples move from the untrained generator's toward the digits:
    nearer to their nearest training image than before and than uniform noise, and not all alike."""
    dataset = data.load_digits(seed=0)
    model = gan.build((1, 8, 8), width=8, latent=8, seed=0, learning_rate=2e-3)
    # Adam writes each weight and its two moments; each optimizer its step count; two layers two statistics each.
    assert len(model.updates) == 3 * (len(model.generator_variables) + len(model.discriminator_variables)) + 2 + 4
    noise = np.random.default_rng(5).standard_normal((200, 8)).astype(np.float32)
    before = gan.generate(model, noise, device="cpu")
    weights = {v.name: model.graph.variable_value(v).numpy() for v in
               model.generator_variables + model.discriminator_variables + model.running_statistics}
    losses = np.asarray(gan.train(model, dataset.train_images[:640], 8, 32, seed=0, device="cpu", progress=False))
    assert losses.shape == (160, 2) and np.isfinite(losses).all()
    for v in model.generator_variables + model.discriminator_variables + model.running_statistics:
        assert not np.array_equal(model.graph.variable_value(v).numpy(), weights[v.name]), f"{v.name} never changed"
    after = gan.generate(model, noise, device="cpu")
    assert after.shape == (200, 1, 8, 8) and np.isfinite(after).all()
    real = dataset.train_images
    uniform = np.random.default_rng(6).uniform(0, 1, after.shape)
    trained, untrained, noisy = (_nearest_distance(s, real) for s in (after, before, uniform))
    # Measured with seeds 0-3: trained 0.60-0.72 of the untrained distance and 0.48-0.66 of noise's; the
    # untrained generator is 0.77-0.97 of noise's (held-out real digits are 1.07 from a training digit, noise 3.54).
    assert trained < 0.8 * untrained and trained < 0.75 * noisy, (trained, untrained, noisy)
    assert after.std(axis=0).mean() > 0.05, "every sample looks the same"


def test_gan_step_compiled_matches_eager():
    """The whole step (79 kernels: both passes, both Adams, the running statistics, dropout) compiled
    (under CI's Triton interpreter, the generated kernels) against the op-by-op run: the same losses
    in two steps (the second reads the first's updates), the same masks, weights and statistics."""
    rng = np.random.default_rng(0)
    real = rng.uniform(-1, 1, (8, 1, 8, 8)).astype(np.float32)
    z = rng.standard_normal((8, 4)).astype(np.float32)
    eager, compiled = (gan.build((1, 8, 8), width=4, latent=4, seed=0) for _ in range(2))
    exe = compiled.graph.compile({compiled.real: sm.TensorType((8, 1, 8, 8), sm.float32),
                                  compiled.noise: sm.TensorType((8, 4), sm.float32)},
                                 [compiled.d_loss, compiled.g_loss], compiled.updates, device="cpu")
    for step in range(2):
        want = eager.graph.run({eager.real: real, eager.noise: z}, [eager.d_loss, eager.g_loss], eager.updates,
                               device="cpu")
        got = exe.run({compiled.real: real, compiled.noise: z})
        for a, b in ((eager.d_loss, compiled.d_loss), (eager.g_loss, compiled.g_loss)):
            np.testing.assert_allclose(got[b].item(), want[a].item(), rtol=1e-5, err_msg=f"step {step} {a.name}")
    pairs = zip(eager.generator_variables + eager.discriminator_variables + eager.running_statistics,
                compiled.generator_variables + compiled.discriminator_variables + compiled.running_statistics)
    for a, b in pairs:
        # Adam's first steps move every weight by about the learning rate (2e-4) whatever the gradient's size.
        np.testing.assert_allclose(compiled.graph.variable_value(b).numpy(), eager.graph.variable_value(a).numpy(),
                                   atol=1e-4, rtol=1e-4, err_msg=a.name)


def test_png_grid_reads_back(tmp_path):
    from matplotlib import image

    images = np.random.default_rng(0).uniform(0, 1, (10, 1, 3, 4)).astype(np.float32)
    picture = gan.grid(images, columns=4)
    assert picture.shape == (3 * 4 + 1, 4 * 5 + 1)
    np.testing.assert_array_equal(picture[1:4, 6:10], np.round(images[1, 0] * 255))
    for scale in (1, 3):
        gan.write_png(str(tmp_path / f"grid{scale}.png"), picture, scale)
        back = np.round(image.imread(str(tmp_path / f"grid{scale}.png")) * 255).astype(np.uint8)  # pillow decodes
        np.testing.assert_array_equal(back, np.kron(picture, np.ones((scale, scale), np.uint8)))


def test_quality_scores_with_the_classifier():
    """A classifier whose last layer always says class 3 with confidence ~1: every image is confident and
    the histogram fills one class; with all-zero weights (uniform 0.1) none is."""
    model = mnist.build((1, 8, 8), seed=0)
    g = model.graph
    bias = np.zeros(10, np.float32)
    bias[3] = 50.0
    g.set_variable_value(model.parameters[-1], bias)
    g.set_variable_value(model.parameters[-2], np.zeros((128, 10), np.float32))
    images = np.random.default_rng(0).uniform(0, 1, (30, 1, 8, 8)).astype(np.float32)
    fraction, histogram = gan.quality(model, images, device="cpu", batch_size=16)
    assert fraction == 1.0 and histogram.tolist() == [0, 0, 0, 30, 0, 0, 0, 0, 0, 0]
    g.set_variable_value(model.parameters[-1], np.zeros(10, np.float32))
    fraction, histogram = gan.quality(model, images, device="cpu")
    assert fraction == 0.0 and histogram.sum() == 30


def test_load_weights_checks_the_file(tmp_path):
    digits, other = mnist.build((1, 8, 8), seed=0), mnist.build((1, 8, 8), seed=1)
    mnist.save_weights(digits, str(tmp_path / "w.safetensors"), {"dataset": "digits"})
    assert mnist.load_weights(other, str(tmp_path / "w.safetensors")) == {"dataset": "digits"}
    for a, b in zip(digits.parameters, other.parameters):
        np.testing.assert_array_equal(digits.graph.variable_value(a).numpy(), other.graph.variable_value(b).numpy())
    with pytest.raises(sm.DataError, match=r"'dense1/weights' expected float32\[1568, 128\], found float32\[128, 128\]"):
        mnist.load_weights(mnist.build((1, 28, 28)), str(tmp_path / "w.safetensors"))
    with pytest.raises(sm.DataError, match="no such file"):
        mnist.load_weights(other, str(tmp_path / "missing.safetensors"))


def test_gan_demo_command(tmp_path, capsys):
    """One epoch at a tiny width with a given classifier: grids written, the score and histogram printed."""
    classifier = tmp_path / "c.safetensors"
    mnist.save_weights(mnist.build((1, 8, 8), seed=0), str(classifier))
    out = tmp_path / "grids"
    code = gan.main(["--epochs", "1", "--batch-size", "256", "--width", "4", "--samples", "40", "--classifier",
                     str(classifier), "--out", str(out), "--quiet"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert (out / "epoch-001.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "trained 1 epochs (5 steps)" in text and "of 40 samples" in text
    counts = [int(part.split(":")[1]) for part in text.split("samples per class: ")[1].split()]
    assert len(counts) == 10 and sum(counts) == 40


@pytest.mark.parametrize("args, phrase", [
    (["--epochs", "0"], "argument --epochs: expected an integer above 0, got 0"),
    (["--batch-size", "5000"], "--batch-size 5000: the training set has only 1437 images"),
    (["--out", "no/such/folder/grids"], "--out 'no/such/folder/grids': the folder"),
])
def test_gan_demo_rejects_bad_options(args, phrase, capsys):
    with pytest.raises(SystemExit) as exit_:
        gan.main(args)
    assert exit_.value.code == 2 and phrase in capsys.readouterr().err


def test_gan_demo_rejects_a_classifier_of_another_size(tmp_path, capsys):
    classifier = tmp_path / "mnist.safetensors"
    mnist.save_weights(mnist.build((1, 28, 28), seed=0), str(classifier))
    with pytest.raises(SystemExit) as exit_:
        gan.main(["--classifier", str(classifier), "--out", str(tmp_path / "g")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "expected float32[128, 128], found float32[1568, 128]" in err, err


# -- the GeLU panel ------------------------------------------------------------------------------------------------
def test_gelu_panel_at_tiny_sizes(tmp_path, capsys):
    from matplotlib import image

    code = gelu.main(["--device", "cpu", "--rows", "4", "--cols", "8", "--sizes", "4K,8K", "--reps", "2",
                      "--no-torch-compile", "--plot", str(tmp_path / "gelu.png"), "--json", str(tmp_path / "t.json"),
                      "--threads", "1"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert "1 kernel(s) for 10 operations" in text and "@triton.jit" in text and "tl.erf(" in text
    rows = json.loads((tmp_path / "t.json").read_text())
    assert [r["elements"] for r in rows] == [4096, 8192]
    assert all(set(r["ms"]) == {"stitchml", "torch eager", "torch gelu"} and r["max_error"] < 1e-5 for r in rows)
    assert all(r["kernels"] == 1 for r in rows)
    assert image.imread(str(tmp_path / "gelu.png")).shape[:2] == (504, 1320)


@pytest.mark.parametrize("args, phrase", [
    (["--sizes", "4K,0"], "argument --sizes: expected element counts above 0 such as 4K,1M,256M, got '0'"),
    (["--plot", "no/such/dir/p.png"], "--plot 'no/such/dir/p.png': the folder"),
    (["--plot", "p.png", "--no-timings"], "--plot draws the timings: leave out --no-timings"),
])
def test_gelu_panel_rejects_bad_options(args, phrase, capsys):
    with pytest.raises(SystemExit) as exit_:
        gelu.main(args)
    assert exit_.value.code == 2 and phrase in capsys.readouterr().err
