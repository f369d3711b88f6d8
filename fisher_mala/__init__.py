"""fisher_mala: Fisher adaptive MALA (Titsias, NeurIPS 2023) in JAX.

Importing the package changes no global JAX setting (e.g. ``jax_enable_x64``).
"""

from fisher_mala import (
    adamala,
    adaptation,
    baseline_warmups,
    checks,
    diagnostics,
    hmc,
    mmala,
    pooled,
    preconditioner,
    proposals,
    sharding,
    sqrt_precond,
    step_size,
    targets,
    whitened_hmc,
    whitened_warmup,
)
from fisher_mala.adaptation import (
    WarmupParameters,
    find_reasonable_step_size,
    fisher_mala_warmup,
    mala_warmup,
)
from fisher_mala.base import AdaptationAlgorithm, SamplingAlgorithm
from fisher_mala.checkpoint import load_state, save_state
from fisher_mala.checks import SamplingWarning
from fisher_mala.diagnostics import diagnose, ess, paper_summary, summary, to_arviz
from fisher_mala.fisher import FisherMALAInfo, FisherMALAState, fisher_mala
from fisher_mala.mala import MALAInfo, MALAState, mala
from fisher_mala.preconditioner import FisherPreconditionerState, fisher_preconditioner
from fisher_mala.sampling import SamplingResult, register_sampler, sample, samplers
from fisher_mala.whitened_hmc import (
    DiagonalSqrt,
    FisherHMCInfo,
    FisherHMCState,
    fisher_hmc,
    fisher_nuts,
    whiten,
)
from fisher_mala.whitened_warmup import FisherParameters, fisher_adaptation

__version__ = "0.1.0"


def __getattr__(name):
    """``fm.FisherMALAKernel``, ``fm.sample_numpyro``, ``fm.sample_pymc``: imported on first
    use (NumPyro, PyMC)."""
    if name in (
        "FisherMALAKernel",
        "FisherMALAKernelState",
        "FisherNUTSKernel",
        "FisherNUTSKernelState",
        "sample_numpyro",
    ):
        from fisher_mala import numpyro_kernel

        return getattr(numpyro_kernel, name)
    if name == "sample_pymc":
        from fisher_mala import pymc_model

        return pymc_model.sample_pymc
    raise AttributeError(f"module 'fisher_mala' has no attribute {name!r}")


__all__ = [
    "AdaptationAlgorithm",
    "DiagonalSqrt",
    "FisherHMCInfo",
    "FisherHMCState",
    "FisherParameters",
    "FisherPreconditionerState",
    "fisher_adaptation",
    "fisher_hmc",
    "fisher_nuts",
    "fisher_preconditioner",
    "preconditioner",
    "whiten",
    "whitened_hmc",
    "whitened_warmup",
    "SamplingResult",
    "load_state",
    "save_state",
    "adamala",
    "baseline_warmups",
    "hmc",
    "mmala",
    "pooled",
    "WarmupParameters",
    "adaptation",
    "diagnostics",
    "ess",
    "find_reasonable_step_size",
    "fisher_mala_warmup",
    "mala_warmup",
    "register_sampler",
    "sample",
    "samplers",
    "summary",
    "paper_summary",
    "diagnose",
    "SamplingWarning",
    "FisherMALAKernel",
    "FisherMALAKernelState",
    "FisherNUTSKernel",
    "FisherNUTSKernelState",
    "sample_numpyro",
    "sample_pymc",
    "checks",
    "to_arviz",
    "targets",
    "FisherMALAInfo",
    "FisherMALAState",
    "MALAInfo",
    "MALAState",
    "SamplingAlgorithm",
    "fisher_mala",
    "mala",
    "proposals",
    "sharding",
    "sqrt_precond",
    "step_size",
]
