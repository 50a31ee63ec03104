"""State on disk: paths, object store, Delta writes, atomic files, model registry, schemas."""
