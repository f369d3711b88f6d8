"""Fixed-key runs of every built-in sampler, recorded before a restructuring.

``python tests/golden_cases.py`` writes ``tests/data/golden_draws/<machine>.npz``, one
recording per machine (:func:`machine`); ``tests/test_golden_draws.py`` reruns every case
and compares with this machine's. A restructuring that keeps the arithmetic keeps the
draws bit-identical (same jax/jaxlib and machine); a change of meaning is recorded anew
on every machine at hand (the others' recordings are then deleted), and the commit says
why.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

#: One recording per machine, named by :func:`machine`.
DIRECTORY = Path(__file__).parent / "data" / "golden_draws"

#: A correlated 3-d Gaussian, precision written out (no solve: the same arithmetic on
#: every backend version that keeps matmul).
_PRECISION = np.array([[2.0, 0.9, 0.3], [0.9, 1.5, -0.4], [0.3, -0.4, 0.8]])


def logdensity(x):
    p = jnp.asarray(_PRECISION, x.dtype)
    return -0.5 * x @ p @ x


def tree_logdensity(x):
    return logdensity(jnp.concatenate([x["a"], x["b"][None]]))


def _positions(dtype, tree=False):
    x = jnp.asarray(np.linspace(-1.0, 1.0, 2 * 3).reshape(2, 3), dtype)
    if tree:
        return {"a": x[:, :2], "b": x[:, 2]}
    return x


#: name -> (sampler, options, dtype, pytree position, num_warmup, num_samples)
CASES = {
    "mala": ("mala", {}, "float64", False, 300, 60),
    "fisher_mala": ("fisher_mala", {}, "float64", False, 400, 60),
    "fisher_mala_f32": ("fisher_mala", {}, "float32", False, 400, 60),
    "fisher_mala_tree": ("fisher_mala", {}, "float64", True, 400, 60),
    "fisher_mala_increment": ("fisher_mala", {"signal": "increment"}, "float64", False, 400, 60),
    "fisher_mala_score": ("fisher_mala", {"signal": "score"}, "float64", False, 400, 60),
    "fisher_mala_centered": ("fisher_mala", {"signal": "centered"}, "float64", False, 400, 60),
    "fisher_mala_appendix_b": (
        "fisher_mala",
        {"learning_rate": 0.01, "num_mala_steps": 100},
        "float64",
        False,
        400,
        60,
    ),
    "pooled_fisher_mala": ("fisher_mala", {"pooled": True}, "float64", False, 400, 60),
    "adamala": ("adamala", {}, "float64", False, 400, 60),
    "mmala": ("mmala", {}, "float64", False, 200, 40),
    "hmc": ("hmc", {}, "float64", False, 200, 40),
    "fisher_nuts": ("fisher_nuts", {}, "float64", False, 600, 40),
    "fisher_nuts_dense_no_rule": (
        "fisher_nuts",
        {"metric": "dense", "stopping_rule": False},
        "float64",
        False,
        600,
        40,
    ),
    "fisher_nuts_pooled": ("fisher_nuts", {"pooled": True}, "float64", False, 600, 40),
    # BlackJAX's U-turn criterion: the draws of fisher_nuts_pooled before the robust one
    "fisher_nuts_pooled_blackjax_uturn": (
        "fisher_nuts",
        {"pooled": True, "robust_uturn": False},
        "float64",
        False,
        600,
        40,
    ),
    "fisher_hmc": ("fisher_hmc", {}, "float64", False, 600, 40),
}


def run_case(name):
    """The draws, log densities and tuned step sizes of one case (numpy, host)."""
    import fisher_mala as fm

    sampler, options, dtype, tree, num_warmup, num_samples = CASES[name]
    with jax.enable_x64(dtype == "float64"):
        positions = _positions(dtype, tree)
        fn = tree_logdensity if tree else logdensity
        result = fm.sample(
            jax.random.key(20261127),
            sampler,
            fn,
            positions,
            num_warmup=num_warmup,
            num_samples=num_samples,
            diagnose=False,
            **options,
        )
        leaves = [
            np.asarray(x).reshape(*np.shape(x)[:2], -1) for x in jax.tree.leaves(result.samples)
        ]
        return {
            "draws": np.concatenate(leaves, axis=-1),
            "logdensity": np.asarray(result.sample_stats["logdensity"]),
            "step_size": np.asarray(result.parameters.step_size),
        }


def machine() -> str:
    """What XLA:CPU's code generation depends on: the architecture and the CPU's flags."""
    import hashlib
    import platform

    flags = ""
    try:
        with open("/proc/cpuinfo") as file:
            flags = next((line for line in file if line.startswith("flags")), "")
    except OSError:  # pragma: no cover - not Linux
        pass
    return f"{platform.machine()}-{hashlib.sha256(flags.encode()).hexdigest()[:12]}"


def path() -> Path:
    """This machine's recording."""
    return DIRECTORY / f"{machine()}.npz"


def record():
    arrays = {
        "jax_version": np.array(jax.__version__),
        "platform": np.array(sys.platform),
        "machine": np.array(machine()),
    }
    for name in CASES:
        for field, value in run_case(name).items():
            arrays[f"{name}/{field}"] = value
    DIRECTORY.mkdir(parents=True, exist_ok=True)
    np.savez(path(), **arrays)


if __name__ == "__main__":
    record()
