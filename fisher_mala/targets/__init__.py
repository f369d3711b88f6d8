"""The paper's targets (Section 5), in one registry.

>>> import fisher_mala as fm
>>> target = fm.targets.get("gp")          # or fm.targets.gp_gaussian()
>>> target.dim, target.paper_dim
(100, 100)
"""

from fisher_mala.targets.base import Target, get, names, register
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
    logistic_regression,
)

__all__ = [
    "Target",
    "get",
    "names",
    "register",
    "gaussian",
    "correlated_2d",
    "gp_gaussian",
    "inhomogeneous_gaussian",
    "DATASETS",
    "load_dataset",
    "logistic_logdensity",
    "logistic_regression",
]
