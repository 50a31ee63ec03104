"""GEM pipelines: the Dagster code location and the data plumbing around gem_model."""

import warnings

# Partitioned asset checks and the partition mappings of assets/features.py are Dagster 1.13 beta /
# preview features we use on purpose: their warnings on every load of the code location (and on
# Dagster's own use of a beta parameter in its automation evaluator) tell a user nothing.
warnings.filterwarnings("ignore", message=r".* is currently in (beta|preview)", module=r"gem_pipelines\.")
warnings.filterwarnings("ignore", message=r"Parameter `include_sources` of function `AssetSelection.all`")
