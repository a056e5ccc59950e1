"""The web debugger: its HTTP API through Flask's test client, and its pages in headless Chromium.

The browser tests drive Debian's chromium through /usr/bin/chromedriver
(Selenium); they skip only when that browser is not installed. Screenshots
go to the test's temporary folder.
"""
import json
import os
import shutil
import threading

import numpy as np
import pytest

import stitchml as sm
from stitchml import debug

flask = pytest.importorskip("flask", reason="the web debugger needs Flask (pip install stitchml[debug])")


def _image_graph():
    """An NCHW image pipeline: a normalisation, a square root that makes NaN for negatives, a sigmoid, and a
    float32 cancellation (adding and taking away 1e4 keeps 3 decimals) for bisection to find."""
    g = sm.Graph("image")
    x = g.placeholder((1, 3, 8, 8), sm.float32, name="image")
    with g.scope("normalise"):
        m = g.reduction_mean(x, axes=[2, 3], keep_dims=True, name="mean")
        c = g.subtraction(x, m, name="centred")
    r = g.square_root(c, name="root")
    s = g.sigmoid(c * 2.0, name="gate")
    y = g.subtraction(g.addition(s, 1e4, name="shifted"), 1e4, name="out")
    return g, x, [r, y]


def _image():
    return np.linspace(-1, 1, 192, dtype=np.float32).reshape(1, 3, 8, 8)


def _command_buffer():
    """A completed command buffer: a compute dispatch, a barrier, a network dispatch."""
    from stitchml.package import Package

    g = sm.Graph()
    x = g.placeholder((-1, 4), sm.float32, name="x")
    fn = Package.from_graph(g, {"x": x}, {"y": g.tanh(x) * 2.0}).function()
    dev = sm.device("cpu")
    desc = sm.MLPipelineDescriptor(fn)
    desc.set_input_dimensions("x", (2, 4))
    pipe = sm.Compiler(dev).new_ml_pipeline(desc)
    xin, yout = dev.new_tensor((2, 4), sm.float32), dev.new_tensor((2, 4), sm.float32)
    cb = dev.new_command_queue("main").command_buffer("frame")
    with cb.compute_encoder("prepare") as ce:
        ce.dispatch(lambda: xin.torch().fill_(0.5), name="fill_input")
    cb.barrier("dispatch", "machine_learning")
    enc = cb.ml_encoder("net")
    enc.set_pipeline(pipe)
    enc.set_argument_table({"x": xin, "y": yout})
    enc.dispatch_network(dev.new_heap(pipe.intermediates_heap_size))
    enc.end()
    cb.commit()
    cb.wait()
    return cb


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A capture, a saved graph, a capture made by `stitchml debug bisect`, a pipeline trace, a damaged capture."""
    d = tmp_path_factory.mktemp("debugger")
    g, x, targets = _image_graph()
    interpret = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"  # the kernels are generated (and their source kept) on the CPU too
    try:
        debug.capture(g, {x: _image()}, targets).save(d / "run.capture")
    finally:
        if interpret is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = interpret
    g.save(d / "graph.json")
    np.save(d / "image.npy", _image())
    from stitchml.debug.cli import main

    status = main(["bisect", str(d / "graph.json"), "--feed", f"image={d / 'image.npy'}", "--tolerance", "1e-5",
                   "-o", str(d / "bisect.capture")])
    assert status == 1  # a divergence was found
    sm.write_trace(d / "trace.json", [_command_buffer()])
    raw = (d / "run.capture").read_bytes()
    (d / "broken.capture").write_bytes(raw[:len(raw) // 2])
    return d


def test_api_network_tensor_histogram_and_timeline(files):
    app = debug.create_app([files / "run.capture", files / "graph.json"])
    client = app.test_client()
    listed = client.get("/api/files").get_json()
    assert [f["kind"] for f in listed] == ["capture", "graph"]
    net = client.get("/api/network").get_json()
    ops = {o["name"]: o for o in net["ops"]}
    assert ops["centred"]["scope"] == "normalise" and ops["centred"]["location"].startswith(__file__)
    assert ops["mean"]["kernel"] == ops["centred"]["kernel"] is not None
    kernel = next(k for k in net["kernels"] if k["name"] == ops["mean"]["kernel"])
    assert {"mean", "centred"} <= set(kernel["ops"])

    t = client.get("/api/tensor", query_string={"name": "root", "size": 10, "page": 1}).get_json()
    c = _image() - _image().mean(axis=(2, 3), keepdims=True)
    with np.errstate(invalid="ignore"):
        expect = np.sqrt(c.astype(np.float64))
    assert t["shape"] == [1, 3, 8, 8] and t["pages"] == 20
    assert t["nan"] == int(np.isnan(expect).sum()) and t["first_nan"] == np.argwhere(np.isnan(expect))[0].tolist()
    got = np.array([np.nan if v is None else v for v in t["values"]])
    np.testing.assert_allclose(got, expect.reshape(-1)[10:20], rtol=1e-6)

    p = client.get("/api/tensor/plane", query_string={"name": "gate", "layout": "NCHW", "n": 0, "c": 2}).get_json()
    np.testing.assert_allclose(np.array(p["values"]), 1 / (1 + np.exp(-2 * c[0, 2].astype(np.float64))), rtol=1e-6)
    p = client.get("/api/tensor/plane", query_string={"name": "gate", "layout": "NHWC", "c": 5}).get_json()
    assert (p["rows"], p["cols"]) == (3, 8)  # NHWC reads (1, 3, 8, 8) as 3 rows of 8 columns, 8 channels

    p = client.get("/api/tensor/plane", query_string={"name": "gate", "rgb": 1}).get_json()
    np.testing.assert_allclose(np.array(p["values"]), 1 / (1 + np.exp(-2 * c[0].astype(np.float64))), rtol=1e-6)
    r = client.get("/api/tensor/plane", query_string={"name": "mean", "rgb": 1, "layout": "NHWC"})
    assert r.status_code == 400 and "3 channels on the NHWC channel axis" in r.get_json()["error"]

    h = client.get("/api/tensor/histogram", query_string={"name": "gate", "bins": 8}).get_json()
    counts, _ = np.histogram(1 / (1 + np.exp(-2 * c.astype(np.float64))), bins=8)
    assert sum(h["counts"]) == 192 and abs(np.array(h["counts"]) - counts).sum() <= 2

    assert "@triton.jit" in kernel["source"] and "kernel0" in kernel["source"]

    tl = client.get("/api/timeline").get_json()["traceEvents"]
    slices = [e for e in tl if e["ph"] == "X"]
    assert slices and all(e["dur"] >= 0 for e in slices)
    assert {e["name"] for e in slices} >= {ops["mean"]["kernel"]}
    exported = client.get("/api/timeline/export")
    assert "attachment" in exported.headers["Content-Disposition"]
    assert json.loads(exported.data)["traceEvents"] == tl

    g = client.get("/api/network", query_string={"file": str(files / "graph.json")}).get_json()
    assert {o["name"] for o in g["ops"]} == set(ops) and any(o["kernel"] for o in g["ops"])
    assert client.get("/api/tensor", query_string={"file": str(files / "graph.json"), "name": "root"}).status_code == 404


def test_timeline_of_a_capture_joins_kernels_to_their_readers(tmp_path):
    g = sm.Graph("two")
    x = g.placeholder((4, 8), sm.float32, name="x")
    h = g.tanh(x - g.reduction_mean(x, axes=[1], keep_dims=True), name="h")
    y = g.matrix_multiplication(h, g.constant(np.ones((8, 2), np.float32)), name="y")
    cap = debug.capture(g, {x: np.ones((4, 8), np.float32)}, [y])
    cap.save(tmp_path / "two.capture")
    events = debug.create_app([tmp_path / "two.capture"]).test_client().get("/api/timeline").get_json()["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert [e["name"] for e in slices] == [step for step, _, _ in cap.profile]
    assert all(b["ts"] == pytest.approx(a["ts"] + a["dur"]) for a, b in zip(slices, slices[1:]))
    starts = {e["id"]: e["ts"] for e in events if e["ph"] == "s"}
    ends = {e["id"]: e["ts"] for e in events if e["ph"] == "f"}
    producer, reader = cap.kernel_of("h"), cap.kernel_of("y")
    assert producer != reader and len(starts) == len(ends) == 1
    by_name = {e["name"]: e for e in slices}
    (flow,) = starts
    assert starts[flow] == pytest.approx(by_name[producer]["ts"] + by_name[producer]["dur"])
    assert ends[flow] == pytest.approx(by_name[reader]["ts"])


def test_serve_binds_to_localhost_unless_told(files, monkeypatch):
    calls = []
    monkeypatch.setattr(flask.Flask, "run", lambda self, **kw: calls.append(kw))
    debug.serve([files / "run.capture"], port=8123)
    debug.serve([files / "run.capture"], port=8124, host="0.0.0.0")
    assert [(c["host"], c["port"]) for c in calls] == [("127.0.0.1", 8123), ("0.0.0.0", 8124)]
    from stitchml.cli import main

    calls.clear()
    assert main(["debug", str(files / "run.capture"), "--port", "8125"]) == 0
    assert (calls[0]["host"], calls[0]["port"]) == ("127.0.0.1", 8125)


def test_api_shows_packages_with_their_kernels_when_shapes_are_known(tmp_path):
    from stitchml.package import Package

    g, x, targets = _image_graph()
    Package.from_graph(g, {"image": x}, {"root": targets[0], "out": targets[1]}).save(tmp_path / "static.smpkg")
    g2 = sm.Graph()
    v = g2.placeholder((-1, 4), sm.float32, name="v")
    Package.from_graph(g2, {"v": v}, {"w": g2.tanh(v) * 2.0}).save(tmp_path / "dynamic.smpkg")
    client = debug.create_app([tmp_path / "static.smpkg", tmp_path / "dynamic.smpkg"]).test_client()
    assert [f["kind"] for f in client.get("/api/files").get_json()] == ["package", "package"]
    net = client.get("/api/network").get_json()
    kernels = {o["name"]: o["kernel"] for o in net["ops"]}
    assert kernels["mean"] is not None and kernels["mean"] == kernels["centred"] and net["note"] is None
    net = client.get("/api/network", query_string={"file": str(tmp_path / "dynamic.smpkg")}).get_json()
    assert "unknown extents" in net["note"] and not any(o["kernel"] for o in net["ops"])
    assert {o["op"] for o in net["ops"]} >= {"placeholder", "tanh", "multiplication"}


def test_api_shows_which_model_value_each_tensor_of_an_imported_package_holds(tmp_path):
    from onnx import TensorProto, helper

    nodes = [helper.make_node("Relu", ["x"], ["r"], name="act"), helper.make_node("Neg", ["r"], ["y"], name="flip")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    pkg = sm.package.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    pkg.save(tmp_path / "model.smpkg")
    net = debug.create_app([tmp_path / "model.smpkg"]).test_client().get("/api/network").get_json()
    kinds = {o["outputs"][0]: o["op"] for o in net["ops"]}
    assert {kinds[t]: [(o["value"], o["op"]) for o in v] for t, v in net["origins"].items()} == {
        "relu": [("r", "Relu")], "negative": [("y", "Neg")]}


def test_api_serves_a_pipeline_trace_as_written(files):
    client = debug.create_app([files / "trace.json"]).test_client()
    assert client.get("/api/files").get_json()[0]["kind"] == "trace"
    events = client.get("/api/timeline").get_json()["traceEvents"]
    assert events == json.loads((files / "trace.json").read_text())["traceEvents"]
    kinds = {e["name"]: e["ph"] for e in events if e["ph"] in ("X", "i")}
    assert kinds["fill_input"] == "X" and kinds["barrier dispatch -> machine_learning"] == "i"
    assert client.get("/api/network").get_json()["ops"] == []


def test_api_refuses_other_paths_and_reports_broken_captures(files):
    client = debug.create_app([files / "run.capture", files / "broken.capture"]).test_client()
    for path in ("/etc/passwd", str(files / "graph.json"), str(files / "sub" / ".." / "graph.json")):
        r = client.get("/api/network", query_string={"file": path})
        assert r.status_code == 403 and "not one of the files" in r.get_json()["error"]
    assert client.get("/static/../capture.py").status_code == 404
    r = client.get("/api/network", query_string={"file": str(files / "broken.capture")})
    assert r.status_code == 422 and "CaptureError" in r.get_json()["error"]
    broken = client.get("/api/files").get_json()[1]
    assert broken["kind"] == "error" and "capture file" in broken["error"]
    assert client.get("/api/tensor", query_string={"name": "root", "size": "x"}).status_code == 400


def test_bisect_capture_holds_the_result_and_the_reference(files):
    cap = debug.load_capture(files / "bisect.capture")
    assert cap.bisect["op"]["name"] == "out" and cap.bisect["op"]["op"] == "subtraction"
    assert cap.bisect["op"]["kernel"] == cap.kernel_of("out")
    c = _image() - _image().mean(axis=(2, 3), keepdims=True)
    want = 1 / (1 + np.exp(-2 * c.astype(np.float64)))
    np.testing.assert_allclose(cap.reference_tensor("out"), want, rtol=1e-6)
    error = np.abs(cap.tensor("out") - want)
    assert 1e-5 < error.max() <= 2.0 ** -11 and cap.bisect["max_abs_error"] == pytest.approx(error.max(), rel=1e-3)


def test_cli_refuses_missing_files_and_bad_feeds(files, capsys):
    from stitchml.cli import main

    assert main(["debug", str(files / "nothing.capture")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["debug", "bisect", str(files / "graph.json"), "--feed", "image"]) == 2
    assert "expected NAME=FILE.npy" in capsys.readouterr().err


# -- in a real browser ------------------------------------------------------------------------
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or not os.path.exists(CHROMEDRIVER):
        pytest.skip("Debian's chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium drives the browser (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(files):
    from werkzeug.serving import make_server

    srv = make_server("127.0.0.1", 0, debug.create_app([files / "bisect.capture", files / "run.capture",
                                                          files / "broken.capture", files / "trace.json"]),
                      threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}"
    srv.shutdown()


def _wait(driver, condition, timeout=30):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # a page that re-renders between finding an element and reading it is still settling: ask again
    return WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(condition)


def _open(driver, url):
    driver.get(url)
    _wait(driver, lambda d: d.execute_script("return document.body.dataset.ready") == "1")


def test_network_view_expands_a_kernel_and_shows_an_op(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    from selenium.webdriver.support.ui import Select

    _open(browser, server)
    Select(browser.find_element(By.ID, "file")).select_by_index(1)  # run.capture, whose kernels were generated
    _wait(browser, lambda d: (d.find_element(By.ID, "graph").get_attribute("data-file") or "").endswith("run.capture"))
    kernels = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "g.kernel.collapsed"))
    assert kernels, "fused kernels start collapsed"
    name = kernels[0].get_attribute("data-kernel")
    assert not browser.find_elements(By.CSS_SELECTOR, 'g.op[data-op="centred"]')
    kernels[0].click()
    op = _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'g.op[data-op="centred"]'))[0]
    assert browser.find_elements(By.CSS_SELECTOR, f'g.kernel[data-kernel="{name}"] rect')
    assert "@triton.jit" in browser.find_element(By.ID, "kernel-source").text  # the kernel's generated source
    op.click()
    assert _wait(browser, lambda d: d.find_element(By.ID, "op-name")).text == "centred"
    assert browser.find_element(By.ID, "op-location").text.startswith(__file__)
    browser.save_screenshot(str(tmp_path / "network.png"))
    browser.find_element(By.CSS_SELECTOR, f'g.kernel[data-kernel="{name}"] text.title').click()  # collapses it
    _wait(browser, lambda d: not d.find_elements(By.CSS_SELECTOR, 'g.op[data-op="centred"]'))


def test_tensor_view_renders_an_image_and_counts_nans(browser, server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _open(browser, server + "/?view=tensor")
    Select(browser.find_element(By.ID, "tensor-name")).select_by_visible_text("root")
    _wait(browser, lambda d: "NaN" in d.find_element(By.ID, "nan-count").text
          and d.find_element(By.ID, "stats").text.startswith("root"))
    c = _image() - _image().mean(axis=(2, 3), keepdims=True)
    assert f"NaN {int((c < 0).sum())}" in browser.find_element(By.ID, "nan-count").text
    image = browser.find_element(By.ID, "image")
    assert image.get_attribute("data-rendered") == "8x8"
    pixels = browser.execute_script(
        "const c = document.getElementById('image'); return Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data);")
    rgb = np.array(pixels).reshape(-1, 4)[:, :3]
    assert len({tuple(p) for p in rgb}) > 8  # a heatmap, not a blank canvas
    assert (rgb == [255, 0, 255]).all(axis=1).any()  # NaN drawn magenta
    browser.save_screenshot(str(tmp_path / "tensor.png"))
    Select(browser.find_element(By.ID, "tensor-name")).select_by_visible_text("image")
    Select(browser.find_element(By.ID, "colour")).select_by_value("rgb")
    _wait(browser, lambda d: d.find_element(By.ID, "stats").text.startswith("image")
          and d.find_element(By.ID, "image").get_attribute("data-rendered") == "rgb 8x8")
    corner = browser.execute_script(
        "const c = document.getElementById('image'); return Array.from(c.getContext('2d').getImageData(0, 0, 1, 1).data);")
    image = _image()[0].astype(np.float64)  # channels 0..2 are red, green, blue, scaled together
    want = np.round(255 * (image[:, 0, 0] - image.min()) / (image.max() - image.min()))
    assert np.abs(np.array(corner[:3]) - want).max() <= 1


def test_bisect_page_shows_the_planted_op_and_its_difference_map(browser, server, tmp_path):
    from selenium.webdriver.common.by import By

    _open(browser, server + "/?view=bisect")
    assert _wait(browser, lambda d: d.find_element(By.ID, "bisect-op")).text == "out"
    probes, _, rest = browser.find_element(By.ID, "bisect-probes").text.partition(" ")
    compared = int(rest.split()[1])
    assert compared >= 5 and int(probes) <= 1 + int(np.ceil(np.log2(compared)))
    browser.save_screenshot(str(tmp_path / "bisect.png"))
    browser.find_element(By.ID, "bisect-diff").click()
    _wait(browser, lambda d: d.find_element(By.ID, "image").get_attribute("data-rendered") == "8x8"
          and "reference" in d.find_element(By.ID, "scale-text").text)
    assert browser.find_element(By.ID, "diff").is_selected()


def test_timeline_view_and_a_broken_capture(browser, server, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _open(browser, server + "/?view=timeline")
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#tl rect.slice"))
    assert "events" in browser.find_element(By.ID, "tl-info").text
    browser.save_screenshot(str(tmp_path / "timeline.png"))
    Select(browser.find_element(By.ID, "file")).select_by_index(3)  # the pipeline trace
    browser.find_element(By.CSS_SELECTOR, 'nav button[data-view="timeline"]').click()
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#tl line.instant"))
    labels = [t.text for t in browser.find_elements(By.CSS_SELECTOR, "#tl text")]
    slices = [t.get_attribute("textContent") for t in browser.find_elements(By.CSS_SELECTOR, "#tl rect.slice title")]
    assert "main" in labels and [t.split(" (")[0] for t in slices] == ["fill_input", "main"]
    browser.save_screenshot(str(tmp_path / "pipeline.png"))
    Select(browser.find_element(By.ID, "file")).select_by_index(2)
    error = _wait(browser, lambda d: d.find_element(By.ID, "error") if d.find_element(By.ID, "error").text else None)
    assert "Cannot open" in error.text and "capture file" in error.text


@pytest.fixture(scope="module")
def neural_ao(tmp_path_factory):
    """The neural-AO walk-through's capture (seeded weights, no training) and bisection, served."""
    import torch
    from werkzeug.serving import make_server

    from stitchml.demos import neural_ao as ao

    torch.manual_seed(0)
    net = ao.UNet().eval()
    broken = ao.import_network(ao.broken_copy(net), 24, 32)
    g, s, out = ao.gbuffer_graph(24, 32, ao.SCENE.shape[0])
    gbuffer = g.run({s: ao.SCENE}, [out], device="cpu")[out].numpy()
    result = ao.bisect_typo(net, broken, gbuffer)
    folder = tmp_path_factory.mktemp("neural_ao")
    debug.capture_bisection(broken.graph, {broken.inputs[0].name: gbuffer}, result).save(folder / "neural_ao.capture")
    broken.package.save(folder / "broken.smpkg")
    srv = make_server("127.0.0.1", 0, debug.create_app([folder / "neural_ao.capture", folder / "broken.smpkg"]),
                      threaded=True)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_port}", result, broken
    srv.shutdown()


def test_the_neural_ao_capture_opens_on_the_typo(browser, neural_ao, tmp_path):
    from selenium.webdriver.common.by import By

    url, result, _ = neural_ao
    _open(browser, url + "/?view=bisect")
    assert _wait(browser, lambda d: d.find_element(By.ID, "bisect-op")).text == result.op.name
    body = browser.find_element(By.ID, "bisect-body").text
    assert "(power)" in body and result.op.location in body and "enc1.act" in body
    browser.save_screenshot(str(tmp_path / "neural_ao_bisect.png"))
    browser.find_element(By.ID, "bisect-locate").click()
    assert _wait(browser, lambda d: d.find_element(By.ID, "op-name").text == result.op.name or None)
    assert browser.find_element(By.ID, "op-location").text == result.op.location


def test_an_op_of_the_imported_package_shows_the_model_value_it_holds(browser, neural_ao):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    url, result, fn = neural_ao
    pow_ = fn.origins["enc1.act#4"]  # the first activation's fifth ATen op: the typo's power
    assert (pow_.op, pow_.tensor, pow_.location) == ("aten.pow.Tensor_Tensor", result.tensor, result.op.location)
    _open(browser, url)
    Select(browser.find_element(By.ID, "file")).select_by_index(1)  # the broken network's package
    _wait(browser, lambda d: (d.find_element(By.ID, "graph").get_attribute("data-file") or "").endswith("broken.smpkg"))
    kernel = browser.execute_script(f"return state.net.ops.find((o) => o.name === {result.op.name!r}).kernel")
    browser.find_element(By.CSS_SELECTOR, f'g.kernel[data-kernel="{kernel}"]').click()  # expands it
    _wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f'g.op[data-op="{result.op.name}"]'))[0].click()
    origin = _wait(browser, lambda d: d.find_elements(By.ID, "op-origin"))[0].text
    assert origin == f"{pow_.value} (aten.pow.Tensor_Tensor, {result.op.location})"
