"""``fm.sample`` on a PyMC model: named, constrained draws with the model's dimensions.

PyMC (``pip install 'fisher_mala[pymc]'``) compiles the model's joint log density on the
unconstrained value variables to a JAX function (``pymc.sampling.jax.get_jaxified_logp``,
the function PyMC hands to NumPyro and BlackJAX); ``fm.sample`` runs on a dict of those
value variables, so every sampler and option applies; the draws are then mapped back by
the model's own graph to every free and deterministic variable on its support, and
``fm.to_arviz`` gives them the model's names, dimensions and coordinates.
"""

import dataclasses
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["sample_pymc", "pymc_logdensity"]


def _require_pymc():
    """Import PyMC's JAX bridge without letting it change JAX's global settings.

    PyTensor's JAX backend sets ``jax_enable_x64`` globally when it is first imported (to
    match its ``floatX``); the flag is restored then, and :func:`sample_pymc` runs in a
    local ``jax.enable_x64`` context instead.
    """
    bridge = "pytensor.link.jax.dispatch.basic"
    first_import = bridge not in sys.modules
    x64 = jax.config.jax_enable_x64
    try:
        import pymc
        import pymc.sampling.jax  # the JAX bridge
        import pytensor.link.jax.dispatch  # noqa: F401  (sets the flag on first import)
    except ImportError as err:  # pragma: no cover - exercised without the extra
        raise ImportError("fm.sample_pymc needs PyMC: pip install 'fisher_mala[pymc]'.") from err
    finally:
        if first_import and bridge in sys.modules:
            jax.config.update("jax_enable_x64", x64)
    return pymc


def _model_x64() -> bool:
    """Whether the model computes in float64 (PyTensor's ``floatX``, float64 by default)."""
    import pytensor

    return pytensor.config.floatX == "float64"


def pymc_logdensity(model) -> tuple[Callable, list[str]]:
    """The model's log density on ``{value variable name: array}`` and those names.

    The value variables are the unconstrained ones (``tau_log__`` for a positive
    ``tau``); the log density includes the Jacobians of the transforms. Evaluate it under
    ``jax.enable_x64(True)`` for a float64 model (PyMC's default).
    """
    _require_pymc()
    from pymc.sampling.jax import get_jaxified_logp

    names = [v.name for v in model.value_vars]
    logp = get_jaxified_logp(model)  # the log density itself (PyMC names it so)

    def logdensity(position):
        return logp([position[n] for n in names])

    return logdensity, names


def _initial_positions(model, names, num_chains: int, seed: int) -> dict:
    """PyMC's initial point, jittered by U(-1, 1) on the unconstrained scale per chain."""
    from pymc.initial_point import make_initial_point_fn

    fn = make_initial_point_fn(model=model, jitter_rvs=set(model.free_RVs), return_transformed=True)
    seeds = np.random.default_rng(seed).integers(2**30, size=num_chains)
    points = [fn(int(s)) for s in seeds]
    return {n: jnp.stack([jnp.asarray(p[n]) for p in points]) for n in names}


def _constrainer(model, names):
    """``{value name: array} -> {variable name: array}``: every free and deterministic
    variable on its support, by the model's own graph."""
    from pymc.sampling.jax import get_jaxified_graph
    from pymc.util import get_default_varnames

    outputs = get_default_varnames(model.unobserved_value_vars, include_transformed=False)
    fn = get_jaxified_graph(inputs=model.value_vars, outputs=outputs)
    out_names = [v.name for v in outputs]

    def constrain(position):
        return dict(zip(out_names, fn(*[position[n] for n in names]), strict=True))

    return constrain, out_names


def _pointwise_log_likelihood(model, names, unconstrained) -> dict | None:
    """``{observed variable: (chains, draws, *shape)}``: each observation's log-likelihood
    at every draw (PyMC's elementwise ``logp`` of the observed variables), one chain at a
    time; ``None`` for a model without observed variables."""
    from pymc.sampling.jax import get_jaxified_graph

    observed = list(model.observed_RVs)
    if not observed:
        return None
    fn = get_jaxified_graph(inputs=model.value_vars, outputs=model.logp(vars=observed, sum=False))
    per_draw = jax.jit(jax.vmap(lambda position: fn(*[position[n] for n in names])))
    num_chains = jax.tree.leaves(unconstrained)[0].shape[0]
    chains = [per_draw({n: x[c] for n, x in unconstrained.items()}) for c in range(num_chains)]
    return {
        v.name: np.stack([np.asarray(chain[i]) for chain in chains]) for i, v in enumerate(observed)
    }


def sample_pymc(
    rng_key,
    model,
    sampler="fisher_mala",
    num_chains: int = 4,
    num_warmup: int = 20_000,
    num_samples: int = 20_000,
    **options,
):
    """:func:`fm.sample` on a PyMC model; the draws come back named and constrained.

    Parameters
    ----------
    rng_key
        A JAX PRNG key (it also seeds the initial points' jitter).
    model
        A ``pymc.Model``.
    sampler, num_warmup, num_samples, **options
        As in :func:`fm.sample` (any named sampler or algorithm).
    num_chains
        Chains, each started at PyMC's initial point jittered by ``U(-1, 1)`` on the
        unconstrained scale (PyMC's ``jitter+adapt_diag`` start).

    Returns
    -------
    SamplingResult
        ``samples`` is ``{variable: (chains, draws, *shape)}`` for every free and
        deterministic variable, constrained, computed in the model's precision (float64
        unless PyTensor's ``floatX`` says otherwise, in a local ``jax.enable_x64``);
        ``coords`` and ``dims`` are the model's, so :func:`fm.to_arviz` labels each
        dimension; ``log_likelihood`` holds every observed variable's pointwise
        log-likelihood at every draw (``az.loo``, ``az.compare``). The checks (and their
        warnings) run on the model's variables, by their names; rank-normalized R-hat and
        ESS do not change under the per-coordinate transforms between the two spaces.
    """
    _require_pymc()
    with jax.enable_x64(_model_x64()):
        return _sample_pymc(rng_key, model, sampler, num_chains, num_warmup, num_samples, **options)


def _sample_pymc(rng_key, model, sampler, num_chains, num_warmup, num_samples, **options):
    from fisher_mala import checks
    from fisher_mala.sampling import sample

    logdensity, names = pymc_logdensity(model)
    key_init, key_run = jax.random.split(rng_key)
    seed = int(jax.random.randint(key_init, (), 0, 2**30))
    positions = _initial_positions(model, names, num_chains, seed)
    diagnose = options.pop("diagnose", True)
    result = sample(
        key_run,
        sampler,
        logdensity,
        positions,
        num_warmup=num_warmup,
        num_samples=num_samples,
        diagnose=False,  # checked below on the model's variables, by their names
        **options,
    )
    constrain, out_names = _constrainer(model, names)
    constrained = jax.jit(jax.vmap(jax.vmap(constrain)))(result.samples)
    pointwise = _pointwise_log_likelihood(model, names, result.samples)
    dims = {
        n: list(model.named_vars_to_dims[n]) for n in out_names if n in model.named_vars_to_dims
    }
    coords = {k: list(v) for k, v in model.coords.items() if v is not None}
    result = dataclasses.replace(
        result,
        samples={n: np.asarray(v) for n, v in constrained.items()},
        coords=coords,
        dims=dims,
        log_likelihood=pointwise,
    )
    if diagnose:
        # The rank-based R-hat and ESS are invariant under the per-coordinate monotone
        # transforms (log, logit) between the sampled and the model's variables, so the
        # checks are run on the latter and the warnings name them as the model does
        # (``sd_b``, not ``sd_b_log__``). Where the failing proposals were is then given
        # in the chains' (constrained) positions.
        named = dataclasses.replace(result, nonfinite_proposals=None)
        result.diagnosis = checks.diagnose(named)
        checks.warn(result.diagnosis, stacklevel=4)  # the caller of fm.sample_pymc
    return result
