"""Backend tests: the same ops on every device, checked against numpy and the PYTHON reference."""
