"""The paper's targets (Section 5) and four posteriordb posteriors, in one registry.

>>> import fisher_mala as fm
>>> target = fm.targets.get("gp")          # or fm.targets.gp_gaussian()
>>> target.dim, target.paper_dim
(100, 100)
"""

from fisher_mala.targets.base import Target, get, names, register
from fisher_mala.targets.funnel import neal_funnel
from fisher_mala.targets.gaussians import (
    correlated_2d,
    gaussian,
    gp_gaussian,
    inhomogeneous_gaussian,
)
from fisher_mala.targets.logistic import (
    DATASETS,
    load_dataset,
    logistic_logdensity,
    logistic_logdensity_with_data,
    logistic_regression,
    synthetic_logistic_regression,
)
from fisher_mala.targets.posteriordb import POSTERIORS, posteriordb_target

__all__ = [
    "Target",
    "get",
    "names",
    "register",
    "gaussian",
    "correlated_2d",
    "gp_gaussian",
    "neal_funnel",
    "inhomogeneous_gaussian",
    "DATASETS",
    "load_dataset",
    "logistic_logdensity",
    "logistic_regression",
    "logistic_logdensity_with_data",
    "synthetic_logistic_regression",
    "POSTERIORS",
    "posteriordb_target",
]
