"""The web debugger: a Flask application over the files it was opened on.

    $ stitchml debug run.capture trace.json --port 8765     # http://127.0.0.1:8765

Views (static/index.html, static/app.js): the network, laid out by dagre
(vendored in static/, nothing is fetched at run time) with each stitched
kernel a region that expands to its ops; tensors as numbers, images,
heatmaps and histograms, with NaN/Inf counts and difference maps against a
reference; the timeline of a run or of command buffers; a bisection's result.

Only the opened files are served: a request naming any other path is
refused (403). The server binds to 127.0.0.1 unless told otherwise.
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np
from flask import Flask, abort, jsonify, request, send_from_directory

from .documents import Document, open_document, plane, tensor_stats

STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
MAX_PAGE = 4096
MAX_BINS = 256


def create_app(paths: Sequence[str | os.PathLike]) -> Flask:
    """A Flask app showing `paths` (captures, saved graphs, packages, traces); the first is shown first."""
    if not paths:
        raise ValueError("create_app: expected at least one file to show")
    docs: dict[str, Document] = {}
    for p in paths:
        doc = open_document(os.fspath(p))
        docs[doc.path] = doc
    order = list(docs)
    app = Flask("stitchml.debug", static_folder=None)

    def document() -> Document:
        """The document a request names (?file=, default the first); any other path is refused."""
        asked = request.args.get("file")
        if asked is None:
            return docs[order[0]]
        real = os.path.realpath(asked)
        if real not in docs:
            abort(403, description=f"{asked} is not one of the files this debugger was opened on")
        return docs[real]

    def captured(doc: Document, name: str) -> np.ndarray:
        if doc.capture is None:
            abort(404, description=f"{doc.path} is a {doc.kind}, which holds no tensors (open a capture)")
        if name not in doc.capture.tensors:
            abort(404, description=f"the capture holds no tensor named {name!r}")
        return doc.capture.tensor(name)

    def integer(key: str, default: int, lo: int = 0, hi: int = 1 << 62) -> int:
        try:
            return min(max(int(request.args.get(key, default)), lo), hi)
        except ValueError:
            abort(400, description=f"{key}: expected an integer, got {request.args.get(key)!r}")

    @app.errorhandler(403)
    @app.errorhandler(404)
    @app.errorhandler(400)
    @app.errorhandler(422)
    def _error(e):
        return jsonify({"error": e.description}), e.code

    @app.get("/")
    def index():
        return send_from_directory(STATIC, "index.html")

    @app.get("/static/<path:name>")
    def static_file(name: str):
        return send_from_directory(STATIC, name)

    @app.get("/api/files")
    def files():
        return jsonify([docs[p].summary() for p in order])

    @app.get("/api/network")
    def network():
        doc = document()
        if doc.error:
            abort(422, description=doc.error)
        return jsonify(doc.network())

    @app.get("/api/tensor")
    def tensor():
        doc = document()
        a = captured(doc, request.args.get("name", ""))
        size = integer("size", 256, 1, MAX_PAGE)
        page = integer("page", 0)
        flat = a.reshape(-1)
        values = flat[page * size:(page + 1) * size].astype(np.float64)
        out = tensor_stats(a)
        out.update({"name": request.args["name"], "page": page, "pages": max(1, -(-flat.size // size)),
                    "values": [None if not np.isfinite(v) else float(v) for v in values],
                    "raw": [repr(float(v)) for v in values],
                    "reference": request.args["name"] in doc.capture.reference})
        return jsonify(out)

    @app.get("/api/tensor/plane")
    def tensor_plane():
        doc = document()
        name = request.args.get("name", "")
        a = captured(doc, name)
        layout = request.args.get("layout", "NCHW")
        if layout not in ("NCHW", "NHWC"):
            abort(400, description=f"layout: expected NCHW or NHWC, got {layout!r}")
        n, c = integer("n", 0), integer("c", 0)
        rgb = request.args.get("rgb") == "1"
        if rgb and (a.ndim < 3 or a.shape[-1 if layout == "NHWC" else -3] < 3):
            abort(400, description=f"an RGB image needs 3 channels on the {layout} channel axis; {name} is "
                                   f"{list(a.shape)}")
        channels = (0, 1, 2) if rgb else (c,)
        planes = [plane(a, layout, n, k).astype(np.float64) for k in channels]
        if request.args.get("diff") == "1":
            ref = doc.capture.reference_tensor(name)
            if ref is None:
                abort(404, description=f"the capture holds no reference value for {name!r}")
            planes = [p - plane(ref, layout, n, k).astype(np.float64) for p, k in zip(planes, channels)]
        img = np.stack(planes)
        finite = img[np.isfinite(img)]
        values = [[[None if not np.isfinite(v) else float(v) for v in row] for row in p] for p in img]
        return jsonify({"rows": int(img.shape[1]), "cols": int(img.shape[2]),
                        "min": float(finite.min()) if finite.size else 0.0,
                        "max": float(finite.max()) if finite.size else 0.0,
                        "values": values if rgb else values[0], "rgb": rgb})

    @app.get("/api/tensor/histogram")
    def histogram():
        doc = document()
        a = captured(doc, request.args.get("name", "")).astype(np.float64).reshape(-1)
        bins = integer("bins", 40, 1, MAX_BINS)
        finite = a[np.isfinite(a)]
        counts, edges = np.histogram(finite, bins=bins) if finite.size else (np.zeros(bins), np.zeros(bins + 1))
        return jsonify({"counts": [int(c) for c in counts], "edges": [float(e) for e in edges]})

    @app.get("/api/timeline")
    def timeline():
        return jsonify({"traceEvents": document().timeline(), "displayTimeUnit": "ms"})

    @app.get("/api/timeline/export")
    def timeline_export():
        doc = document()
        response = jsonify({"traceEvents": doc.timeline(), "displayTimeUnit": "ms"})
        stem = os.path.splitext(os.path.basename(doc.path))[0]
        response.headers["Content-Disposition"] = f'attachment; filename="{stem}.trace.json"'
        return response

    return app


def serve(paths: Sequence[str | os.PathLike], port: int = 8765, host: str = "127.0.0.1") -> None:
    """Serve the debugger until interrupted (binds to localhost unless `host` says otherwise)."""
    app = create_app(paths)
    print(f"StitchML debugger on http://{host}:{port}/ (Ctrl-C stops it)")
    app.run(host=host, port=port, debug=False, use_reloader=False, threaded=True)
