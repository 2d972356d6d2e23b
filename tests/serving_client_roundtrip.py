"""Run by a Python 3.9 interpreter that has paddle-serving-client==0.9.0 (tests/stages/test_serve.py):
Paddle Serving's own HttpClient against `pipe serve`, protobuf mode then JSON mode; prints one JSON line.
DTYPE (default float32) is the feed's numpy dtype: int64 for a text package's token ids
(tests/stages/test_serve_text.py).

    python3.9 tests/serving_client_roundtrip.py PACKAGE/serving_client_conf.prototxt 127.0.0.1:PORT x.json [DTYPE]
"""

import json
import sys

import numpy as np
from paddle_serving_client import HttpClient


def main():
    conf, endpoint, x_path = sys.argv[1:4]
    dtype = sys.argv[4] if len(sys.argv) > 4 else "float32"
    with open(x_path) as f:
        x = np.asarray(json.load(f), dtype=dtype)
    out = {}
    for mode in ("proto", "json"):
        client = HttpClient()
        client.load_client_config(conf)
        client.connect([endpoint])
        client.set_http_proto(mode == "proto")
        res = client.predict(feed={"x": x}, fetch=["logits"], batch=True, log_id=7)
        if res is None:
            raise SystemExit(mode + ": the client got no answer (it prints 'http post error' on non-200)")
        if mode == "proto":
            t = res.outputs[0].tensor[0]
            out[mode] = {"type": type(res).__name__, "data": list(t.float_data), "shape": list(t.shape),
                         "name": t.name, "alias": t.alias_name, "elem_type": t.elem_type, "log_id": res.log_id,
                         "err_no": res.err_no, "engine": res.outputs[0].engine_name}
        else:
            t = res["outputs"][0]["tensor"][0]
            out[mode] = {"type": type(res).__name__, "data": t["float_data"], "shape": t["shape"],
                         "name": t["name"], "alias": t["alias_name"], "elem_type": t["elem_type"],
                         "log_id": res["log_id"], "err_no": res["err_no"], "engine": res["outputs"][0]["engine_name"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
