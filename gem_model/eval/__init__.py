"""Metrics, intervals, the baselines engineers already use, model-quality tables."""
