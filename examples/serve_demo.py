"""Serve a package for a moment and call it as a client would: the last step of `make demo`.

    python examples/serve_demo.py runs/demo/package

Starts `pipe serve PACKAGE --port 0` (127.0.0.1), waits for /readyz, sends the package's own reference
inputs (reference.safetensors: every input, by name) to /v1/predict and the first of them to
/v2/models/NAME/infer as binary tensors with Triton's client, prints the engine it runs, the agreement with the fp32 outputs stored in the
package and the /v2 logits' difference from /v1's, then stops the server with SIGTERM (it drains, exit 0).
Exits 1 if any of it fails.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np


def main(package: Path) -> int:
    from pipeline import reference
    from pipeline.serving import spec as spec_mod

    spec = spec_mod.load_package(package)
    x, y = reference.load_set(package / reference.FILE, spec.io, spec.text.max_len if spec.text else None)
    logits_name = spec.io.logits().name
    n = len(y[logits_name])
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", str(package), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = _url(proc)
        with httpx.Client(base_url=url, timeout=30) as c:
            while c.get("/readyz").status_code != 200:
                time.sleep(0.1)
            engine = c.get("/v1/model").json()["engine"]
            logits = np.concatenate([np.asarray(c.post("/v1/predict", json={"inputs": {
                k: v[i:i + 32].tolist() for k, v in x.items()}}).json()["logits"], np.float32) for i in range(0, n, 32)])
        agree = float((logits.argmax(1) == y[logits_name].argmax(1)).mean())
        print(f"serve demo: {url} runs {engine['engine']} {engine['version']} {engine['precision']}: /v1/predict on "
              f"the package's {n} reference inputs ({', '.join(x)}), top-1 agreement with fp32 {agree:.4f}")
        ok = agree >= spec.doc["reference"]["min_agreement"]
        try:
            v2 = _v2(url, spec, {k: v[:1] for k, v in x.items()})
        except ImportError:
            print("serve demo: /v2 not called: tritonclient is not installed (pip install 'tritonclient[http]')")
        else:
            print(f"serve demo: /v2/models/{spec.name}/infer (tritonclient, binary tensors): max|diff| from /v1 "
                  f"{float(np.abs(v2 - logits[:1]).max()):.3g}")
            ok = ok and np.allclose(v2, logits[:1], atol=1e-5)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    print(f"serve demo: server stopped (exit {code})")
    return 0 if ok and code == 0 else 1


def _url(proc: subprocess.Popen) -> str:
    for line in proc.stdout:
        print(line, end="")
        if "listening on http://" in line:
            return line.rsplit(" ", 1)[-1].strip()
    raise SystemExit(f"serve demo: pipe serve exited ({proc.wait()}) before listening")


def _v2(url: str, spec, x: dict[str, np.ndarray]) -> np.ndarray:
    """The logits of one /v2 infer call from tritonclient with every input as a binary tensor, by the model's
    names (`x` holds them by the program's)."""
    import tritonclient.http as httpclient

    inputs = []
    for t in spec.io.inputs:
        inp = httpclient.InferInput(t.public, list(x[t.name].shape), {"float32": "FP32", "int64": "INT64"}[t.dtype])
        inp.set_data_from_numpy(x[t.name])
        inputs.append(inp)
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    try:
        return client.infer(spec.name, inputs).as_numpy(spec.io.logits().public)
    finally:
        client.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/serve_demo.py PACKAGE_DIR")
    sys.exit(main(Path(sys.argv[1])))
