"""What a model is before a stage runs it: pipe's own model builders (`models.py`, `ernie.py`), someone else's
program read as data (`paddle_program.py`) and run as a trainable layer (`program_layer.py`), and the weights
`pipe train --init` starts from (`weights.py`)."""
