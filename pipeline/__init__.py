"""pipe: train, export, compress, package and serve a PaddlePaddle model in one chain of stages."""

__version__ = "0.1.0"
