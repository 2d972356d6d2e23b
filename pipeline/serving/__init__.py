"""What `pipe package` and `pipe serve` share, and the parts of the server that are not the app itself.

    spec       the package contract (file allowlist, dtypes, serving.yaml schema), loading and checking a
               package, the server settings; text packages: the vocabulary and its encoding
    validate   request bodies: size, content type, JSON depth, tensors, images, text -> model input
    wire       Paddle Serving's HttpClient wire format (protobuf messages built here, and JSON)
    v2         the Open Inference Protocol (KServe v2) over HTTP, binary tensor data extension included
    predictor  Paddle Inference predictors in child processes (`python -m pipeline.serving.predictor`)
    batcher    the bounded queue and dynamic batching threads in front of the predictor processes
    lingering  uvicorn's httptools protocol with nginx's lingering close after an early answer (413)
    openapi    the OpenAPI fragments for bodies read by hand, and the offline /docs page

Nothing here imports paddle at module level (the predictor child imports it inside its main).
"""
