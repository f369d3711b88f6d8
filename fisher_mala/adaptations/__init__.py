"""Adaptations: ``(init, update, final)`` triples over small NamedTuple states.

Each learns one tuning parameter from what a kernel reports, and knows nothing of the
kernel (the shape of optax's transformations and of BlackJAX's adaptation pieces). A
warm-up composes a kernel with some of them (:mod:`fisher_mala.adaptive`); the page
"Write your own sampler" of the documentation builds a sampler this way.

=======================================  ======================  ======================
adaptation                               learns                  from
=======================================  ======================  ======================
:func:`fisher_preconditioner`            ``R``, ``A = R R^T``    whitened signals
                                         (Prop. 4, App. B, C)    ``phi = R^T s``
:func:`haario_covariance`                ``U`` of Eq. (17)       the chain's states
:func:`robbins_monro`                    ``sigma^2``             acceptance rates
                                         (Algorithm 1)
:func:`dual_averaging`                   the leapfrog step       acceptance rates
:func:`step_size_search`                 an initial step         mean acceptances
:func:`stopping_rule`                    whether ``R`` settled   ``R`` at block ends
:func:`secant_scale`                     per-coordinate          MALA's moves and
                                         variances (a start      gradient changes
                                         for ``R``)
=======================================  ======================  ======================
"""

from fisher_mala.adaptations.base import Adaptation
from fisher_mala.adaptations.dual_averaging import dual_averaging
from fisher_mala.adaptations.fisher import (
    FisherPreconditionerState,
    fisher_preconditioner,
    whitened_signal,
)
from fisher_mala.adaptations.haario import HaarioCovariance, haario_covariance
from fisher_mala.adaptations.secant_scale import SecantSums, secant_scale
from fisher_mala.adaptations.step_size import RobbinsMonroState, robbins_monro
from fisher_mala.adaptations.step_size_search import (
    StepSizeSearchState,
    find_reasonable_step_size,
    step_size_search,
)
from fisher_mala.adaptations.stopping_rule import StoppingRuleState, stopping_rule

__all__ = [
    "Adaptation",
    "FisherPreconditionerState",
    "HaarioCovariance",
    "RobbinsMonroState",
    "SecantSums",
    "StepSizeSearchState",
    "StoppingRuleState",
    "dual_averaging",
    "find_reasonable_step_size",
    "fisher_preconditioner",
    "haario_covariance",
    "robbins_monro",
    "secant_scale",
    "step_size_search",
    "stopping_rule",
    "whitened_signal",
]
