"""Run by a Python 3.9 interpreter that has paddle-serving-client==0.9.0 (tests/stages/test_serve_multi_io.py):
Paddle Serving's own HttpClient against `pipe serve` with several named float32 feeds and fetches, protobuf
mode then JSON mode; prints one JSON line {mode: {fetched alias: {"data", "shape"}}}.

    python3.9 tests/serving_client_feeds.py PACKAGE/serving_client_conf.prototxt 127.0.0.1:PORT feeds.json \
        logits,embedding
"""

import json
import sys

import numpy as np
from paddle_serving_client import HttpClient


def main():
    conf, endpoint, feeds_path, fetch = sys.argv[1:5]
    with open(feeds_path) as f:
        feeds = {name: np.asarray(v, dtype="float32") for name, v in json.load(f).items()}
    fetch = fetch.split(",")
    out = {}
    for mode in ("proto", "json"):
        client = HttpClient()
        client.load_client_config(conf)
        client.connect([endpoint])
        client.set_http_proto(mode == "proto")
        res = client.predict(feed=feeds, fetch=fetch, batch=True, log_id=7)
        if res is None:
            raise SystemExit(mode + ": the client got no answer (it prints 'http post error' on non-200)")
        if mode == "proto":
            if res.err_no != 0:
                raise SystemExit(f"proto: err_no {res.err_no}")
            out[mode] = {t.alias_name: {"data": list(t.float_data), "shape": list(t.shape)}
                         for t in res.outputs[0].tensor}
        else:
            if res["err_no"] != 0:
                raise SystemExit(f"json: err_no {res['err_no']}")
            out[mode] = {t["alias_name"]: {"data": t["float_data"], "shape": t["shape"]}
                         for t in res["outputs"][0]["tensor"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
