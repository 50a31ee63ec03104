"""The data layer: simulator, raw-format parsers, validation and Delta lake IO (no Dagster)."""
