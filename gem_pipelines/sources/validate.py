"""Choose a dataset's model settings on the validation day E-1 only: train the foundation (or one
surface's single-surface model) on the teacher window of the lake already built and print the
click NE per surface on E-1 and the selection score (NE weighted by positives). E is not scored.

    GEM_DATA=douban GEM_HOME=.gem/douban python -m gem_pipelines.sources.validate \\
        '{"train": {"emb_lr": 0.05}}' [--surface music] [--preset small] [--seed 0]

The JSON holds overrides on top of the preset (and of the dataset's own models/<preset>.yaml).
A thin command line over gem_model.train.selection.score_variant; `bench/model_search.py --set
name='<json>'` runs the same scoring for several variants and records them in bench/MODEL_SEARCH.md.
"""

from __future__ import annotations

import argparse
import json

from gem_model.train.selection import score_variant


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="?", default="{}")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--surface", default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    surfaces = [a.surface] if a.surface else None
    print(json.dumps(score_variant(json.loads(a.overrides), preset=a.preset, seed=a.seed, surfaces=surfaces), indent=1))


if __name__ == "__main__":
    main()
