"""pipe: train, export, compress, package and serve a PaddlePaddle model in one chain of stages."""

import subprocess as _subprocess

__version__ = "0.1.0"

# pipe's processes load Paddle Inference, onnxruntime and OpenVINO (each with its own thread pools) and then
# start children (git, the compress/paddle2onnx children, predictor processes). After OpenVINO joined them,
# a long test process died three times out of three with SIGSEGV in the parent right after a
# subprocess.run (two cores: in artifacts.versions()'s `git rev-parse`, then in the next Python frame).
# CPython's documented escape hatch: fork+exec instead of vfork (a child start costs ~1 ms more).
_subprocess._USE_VFORK = False
