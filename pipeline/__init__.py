"""pipe: train, export, compress, package and serve a PaddlePaddle model in one chain of stages."""

import subprocess as _subprocess

__version__ = "0.1.0"

# pipe's processes load Paddle Inference, onnxruntime and OpenVINO (each with its own thread pools) and then
# start children (git, the compress/paddle2onnx children, predictor processes). fork+exec instead of vfork
# (CPython's documented escape hatch; a child start costs ~1 ms more) was adopted while chasing SIGSEGVs of
# a long test process right after subprocess.run; they went on with it. The cause found was Paddle's
# DataLoader SIGCHLD handler left installed after an in-process training (see stages/train.py,
# _paddle_sigchld_undone); this stays as the conservative choice beside several native thread pools.
_subprocess._USE_VFORK = False
