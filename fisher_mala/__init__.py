"""fisher_mala: Fisher adaptive MALA (Titsias, NeurIPS 2023) in JAX.

The top level holds what a user calls, in groups (as ``blackjax/__init__.py``); the
building blocks stay in their modules (``fisher_mala.adaptations``, ``fisher_mala.schedule``,
``fisher_mala.warmups``, ``fisher_mala.registry``, ...). Importing the package changes no
global JAX setting (e.g. ``jax_enable_x64``).
"""

import importlib
import warnings

from fisher_mala import adaptations, targets
from fisher_mala.adaptations import fisher_preconditioner
from fisher_mala.base import SamplingAlgorithm
from fisher_mala.checkpoint import load_state, save_state
from fisher_mala.checks import SamplingWarning
from fisher_mala.diagnostics import diagnose, ess, paper_summary, summary, to_arviz
from fisher_mala.fisher import fisher_mala
from fisher_mala.mala import mala
from fisher_mala.registry import Sampler, register_sampler, samplers
from fisher_mala.sampling import SamplingResult, sample
from fisher_mala.warmups import fisher_mala_warmup, mala_warmup
from fisher_mala.whitened_hmc import DiagonalSqrt, fisher_hmc, fisher_nuts, whiten
from fisher_mala.whitened_warmup import fisher_adaptation

__version__ = "0.1.0"

#: Models, imported on first use (they need NumPyro or PyMC).
_MODELS = {
    "FisherMALAKernel": "fisher_mala.numpyro_kernel",
    "FisherNUTSKernel": "fisher_mala.numpyro_kernel",
    "sample_numpyro": "fisher_mala.numpyro_kernel",
    "sample_pymc": "fisher_mala.pymc_model",
}

#: Names that were at the top level before it was cut to what a user calls: still
#: reachable, with a DeprecationWarning naming their home, for one release.
_MOVED = {
    "AdaptationAlgorithm": "fisher_mala.base",
    "FisherHMCInfo": "fisher_mala.whitened_hmc",
    "FisherHMCState": "fisher_mala.whitened_hmc",
    "FisherMALAInfo": "fisher_mala.fisher",
    "FisherMALAState": "fisher_mala.fisher",
    "FisherParameters": "fisher_mala.whitened_warmup",
    "FisherPreconditionerState": "fisher_mala.adaptations",
    "MALAInfo": "fisher_mala.mala",
    "MALAState": "fisher_mala.mala",
    "WarmupParameters": "fisher_mala.schedule",
    "find_reasonable_step_size": "fisher_mala.adaptations",
    "FisherMALAKernelState": "fisher_mala.numpyro_kernel",
    "FisherNUTSKernelState": "fisher_mala.numpyro_kernel",
}


def __getattr__(name):
    """The models on first use, and the moved names with a DeprecationWarning."""
    if name in _MODELS:
        return getattr(importlib.import_module(_MODELS[name]), name)
    if name in _MOVED:
        home = _MOVED[name]
        warnings.warn(
            f"`fisher_mala.{name}` moved to `{home}.{name}`; the top-level name goes in the "
            "next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    raise AttributeError(f"module 'fisher_mala' has no attribute {name!r}")


__all__ = [
    # samplers
    "fisher_mala",
    "mala",
    "fisher_nuts",
    "fisher_hmc",
    "whiten",
    "DiagonalSqrt",
    # adaptation and warm-ups
    "adaptations",
    "fisher_preconditioner",
    "fisher_mala_warmup",
    "mala_warmup",
    "fisher_adaptation",
    # running chains
    "sample",
    "Sampler",
    "register_sampler",
    "samplers",
    "SamplingResult",
    # diagnostics and export
    "diagnose",
    "summary",
    "paper_summary",
    "ess",
    "to_arviz",
    "SamplingWarning",
    # models
    "FisherMALAKernel",
    "FisherNUTSKernel",
    "sample_numpyro",
    "sample_pymc",
    # checkpoints, targets and types
    "save_state",
    "load_state",
    "targets",
    "SamplingAlgorithm",
]
