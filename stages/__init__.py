"""One module per stage; each exposes one public `run(...)`. Paddle is imported inside `run`."""
