"""Serve a package for a moment and call it as a client would: the last step of `make demo`.

    python examples/serve_demo.py runs/demo/package

Starts `pipe serve PACKAGE --port 0` (127.0.0.1), waits for /readyz, sends the package's own reference
inputs (reference.safetensors) to /v1/predict and the first of them to /v2/models/NAME/infer as binary
tensors with Triton's client, prints the engine it runs, the agreement with the fp32 outputs stored in the
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
import yaml


def main(package: Path) -> int:
    from pipeline import reference

    spec = yaml.safe_load((package / "serving.yaml").read_text(encoding="utf-8"))
    x, y = reference.load(package / reference.FILE)
    proc = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "serve", str(package), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        url = _url(proc)
        with httpx.Client(base_url=url, timeout=30) as c:
            while c.get("/readyz").status_code != 200:
                time.sleep(0.1)
            engine = c.get("/v1/model").json()["engine"]
            logits = np.concatenate([np.asarray(c.post("/v1/predict", json={"inputs": x[i:i + 32].tolist()}).json()
                                                ["logits"], np.float32) for i in range(0, len(x), 32)])
        agree = float((logits.argmax(1) == y.argmax(1)).mean())
        print(f"serve demo: {url} runs {engine['engine']} {engine['version']} {engine['precision']}: /v1/predict on "
              f"the package's {len(x)} reference inputs, top-1 agreement with fp32 {agree:.4f}")
        ok = agree >= spec["reference"]["min_agreement"]
        try:
            v2 = _v2(url, spec, x[:1])
        except ImportError:
            print("serve demo: /v2 not called: tritonclient is not installed (pip install 'tritonclient[http]')")
        else:
            print(f"serve demo: /v2/models/{spec['name']}/infer (tritonclient, binary tensors): max|diff| from /v1 "
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


def _v2(url: str, spec: dict, x: np.ndarray) -> np.ndarray:
    import tritonclient.http as httpclient

    (first,) = spec["inputs"]  # the digits example: one input; serving.yaml lists every tensor
    logits = next(o for o in spec["outputs"] if o.get("role") == "logits")
    datatype = {"float32": "FP32", "int64": "INT64"}[first["dtype"]]
    inp = httpclient.InferInput(first["name"], list(x.shape), datatype)
    inp.set_data_from_numpy(x)
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    try:
        return client.infer(spec["name"], [inp]).as_numpy(logits["name"])
    finally:
        client.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/serve_demo.py PACKAGE_DIR")
    sys.exit(main(Path(sys.argv[1])))
