"""The race's shared set-up: its targets, protocol, cache folder and starting points.

``benchmarks.versus_blackjax`` runs and renders the race; ``benchmarks.metric_choice``,
``benchmarks.stopping_rule`` and ``benchmarks.worst_coordinates`` rerun parts of it from the
same starts and keys. They all take these from here, and this module imports none of them.
"""

from pathlib import Path

import jax

RESULTS = Path(__file__).resolve().parent / "results" / "race"
#: The race's protocol (the command-line defaults); a cell run with less is "shortened".
FULL_PROTOCOL = {"chains": 4, "samples": 5000, "fisher_warmup": 5000, "nuts_warmup": 1000}
TARGETS = (
    "gp",
    "inhomogeneous",
    "pima",
    "caravan",
    "mnist56",
    "heart",
    "german",
    "australian",
    "ripley",
)
#: Posteriors nobody here wrote (fisher_mala.targets.posteriordb), raced in float64.
POSTERIORDB = ("diamonds", "eight_schools_noncentered", "kilpisjarvi", "arK")


def race_start(target, chains, seed: int = 0):
    """The race's initial positions (``chains`` of them) and the key every sampler runs with
    (``seed`` 0 for the race; others for repeats with other starts and keys)."""
    key_init, key_run = jax.random.split(jax.random.key(seed))
    dtype = jax.numpy.float64 if jax.config.jax_enable_x64 else jax.numpy.float32
    return target.initial_positions(key_init, chains, dtype), key_run
