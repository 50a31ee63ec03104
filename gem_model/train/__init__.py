"""Training: the loop, optimiser, precision, distribution and sharding, selection, calibration, tracking."""
