"""Batches from Delta, the batch type, vocabularies, normalisation, synthetic data."""
