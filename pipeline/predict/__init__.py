"""`pipe predict`'s parts: the items of the inputs (`inputs`), the append-only output with resume (`output`), the
workers that run a package or an OCR system over them (`run`), and `--draw`'s pictures (`draw`). The recipe that
composes them is `stages/predict.py`."""
