"""The GEM model: config, building blocks and the model itself."""

from gem_model.models.config import GEMConfig
from gem_model.models.gem import GEM, InterFormerBlock, build_model

__all__ = ["GEM", "GEMConfig", "InterFormerBlock", "build_model"]
