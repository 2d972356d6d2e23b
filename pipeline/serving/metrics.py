"""`pipe serve`'s Prometheus metrics: per request (endpoint, status, latency), per batch, the gauges, the
garbage collector's pauses; in a server of several HTTP processes every process's, summed
(`pipeline/serving/workers.py`: the board, and prometheus-client's multiprocess mode)."""

from __future__ import annotations

from typing import Any


def request_metrics(r: Any) -> tuple[Any, Any]:
    """The HTTP server's request count by endpoint and status code, and its latency by endpoint, in registry `r`
    (what `Observe` records)."""
    from prometheus_client import Counter, Histogram

    return (Counter("pipe_requests", "HTTP requests by endpoint and status code", ["endpoint", "code"], registry=r),
            Histogram("pipe_request_duration_seconds", "Request latency, first byte in to response", ["endpoint"],
                      registry=r, buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)))


class Metrics:
    """prometheus-client metrics in a registry of our own (not the process-global one). In an HTTP process of
    several (`state.board`) the counters and histograms are prometheus-client's multiprocess values and the
    gauges come from the board (`BoardCollector`): `exposition` sums every process's."""

    def __init__(self, state: "Any"):
        from prometheus_client import CollectorRegistry, Gauge, Histogram

        self.state = state
        r = self.registry = CollectorRegistry()
        self.requests, self.latency = request_metrics(r)
        sizes = tuple(float(2 ** i) for i in range(13))
        self.batch = Histogram("pipe_batch_size", "Samples per predictor run", registry=r, buckets=sizes)
        self.batch_requests = Histogram("pipe_batch_requests", "Requests merged into one predictor run",
                                        registry=r, buckets=sizes)
        self.infer = Histogram("pipe_inference_duration_seconds", "Predictor run time per batch", registry=r,
                               buckets=(.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))
        if state.board is not None:
            return
        Gauge("pipe_queue_depth", "Requests waiting for a predictor", registry=r).set_function(
            lambda: state.batcher.q.qsize())
        Gauge("pipe_inflight_requests", "Inference requests being handled", registry=r).set_function(
            lambda: state.inflight)
        Gauge("pipe_ready", "1 once warmed up and not draining", registry=r).set_function(
            lambda: float(state.is_ready()))
        if state.reference is not None and state.reference.get("top1_agreement") is not None:  # at start-up
            Gauge("pipe_reference_top1_agreement", "Top-1 agreement with the package's fp32 reference outputs, "
                  "measured here at start-up", registry=r).set(state.reference["top1_agreement"])
            Gauge("pipe_reference_max_abs_diff", "max|diff| against the package's fp32 reference outputs, measured "
                  "here at start-up", registry=r).set(state.reference["max_abs_diff"])
        if state.reference is not None and state.reference.get("agreement") is not None:  # a task's digest
            Gauge("pipe_reference_agreement", "Share of the reference samples answered as fp32 answered them "
                  "(the task's reference_agreement, e.g. ocr_rec's decoded texts), measured here at start-up",
                  registry=r).set(state.reference["agreement"])

        r.register(GcCollector(state))

    def exposition(self) -> bytes:
        """/metrics' body: this process's registry, or in a server of several every process's sum."""
        from prometheus_client import CollectorRegistry, generate_latest

        if self.state.board is None:
            return generate_latest(self.registry)
        from prometheus_client.multiprocess import MultiProcessCollector

        r = CollectorRegistry()
        MultiProcessCollector(r)  # PROMETHEUS_MULTIPROC_DIR, set by the supervisor
        r.register(BoardCollector(self.state))
        return generate_latest(r)

    def observe_batch(self, samples: int, requests: int, seconds: float) -> None:
        self.batch.observe(samples)
        self.batch_requests.observe(requests)
        self.infer.observe(seconds)


class GcCollector:
    """The cyclic collector's pauses (`pipeline/serving/gcpause.py`) of this process ("server") and of each
    predictor process (as of its last batch), by generation."""

    def __init__(self, state: "Any"):
        self.state = state

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        count = CounterMetricFamily("pipe_gc_collections", "Garbage collections by process and generation",
                                    labels=["process", "generation"])
        seconds = CounterMetricFamily("pipe_gc_pause_seconds", "Seconds spent in garbage collection by process "
                                      "and generation", labels=["process", "generation"])
        pauses = [("server", self.state.pauses.snapshot())]
        pauses += [(f"predictor-{i}", p.gc) for i, p in enumerate(self.state.batcher.preds) if p.gc]
        for process, gens in pauses:
            for g, (c, s) in enumerate(gens):
                count.add_metric([process, str(g)], c)
                seconds.add_metric([process, str(g)], s)
        yield count
        yield seconds


class BoardCollector:
    """The gauges and garbage-collector counters of a server of several HTTP processes, from the board
    (`pipeline/serving/workers.py`): queue and in-flight summed, ready only when every process is, the reference
    check as worker 0 measured it, the collector's pauses of every process (labelled as in a server of one, and
    by `worker`), and the requests each HTTP process handled."""

    def __init__(self, state: "Any"):
        self.state = state

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st, board = self.state, self.state.board
        yield GaugeMetricFamily("pipe_queue_depth", "Requests waiting for a predictor", value=board.total("queue"))
        yield GaugeMetricFamily("pipe_inflight_requests", "Inference requests being handled",
                                value=board.total("inflight"))
        yield GaugeMetricFamily("pipe_ready", "1 once warmed up and not draining", value=float(st.is_ready()))
        ref = st.reference or {}
        for key, name, doc in (("top1_agreement", "pipe_reference_top1_agreement", "Top-1 agreement with the "
                                "package's fp32 reference outputs, measured here at start-up"),
                               ("max_abs_diff", "pipe_reference_max_abs_diff", "max|diff| against the package's "
                                "fp32 reference outputs, measured here at start-up"),
                               ("agreement", "pipe_reference_agreement", "Share of the reference samples answered "
                                "as fp32 answered them, measured here at start-up")):
            if ref.get(key) is not None:
                yield GaugeMetricFamily(name, doc, value=ref[key])
        count = CounterMetricFamily("pipe_gc_collections", "Garbage collections by process and generation",
                                    labels=["process", "generation", "worker"])
        seconds = CounterMetricFamily("pipe_gc_pause_seconds", "Seconds spent in garbage collection by process "
                                      "and generation", labels=["process", "generation", "worker"])
        for w, process, gens in board.gc():
            for g, (c, sec) in enumerate(gens):
                count.add_metric([process, str(g), str(w)], c)
                seconds.add_metric([process, str(g), str(w)], sec)
        yield count
        yield seconds
        handled = CounterMetricFamily("pipe_worker_inference_requests", "Inference requests handled by each HTTP "
                                      "process", labels=["worker"])
        for w, n in enumerate(board.handled()):
            handled.add_metric([str(w)], n)
        yield handled
