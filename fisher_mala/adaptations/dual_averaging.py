"""Dual averaging of the leapfrog step (Hoffman and Gelman, 2014; Nesterov, 2009).

The adaptation of NUTS's and HMC's step in Stan and BlackJAX, used by the step-size
phase of Fisher NUTS / HMC. The triple is BlackJAX's own
(``blackjax.adaptation.step_size.dual_averaging_adaptation``), so the arithmetic is the
one BlackJAX users know; this module only gives it the library's :class:`Adaptation`
shape and a clear error when BlackJAX is missing. BlackJAX averages the iterate before
each update (``log eps_bar_t`` from ``log eps_{t-1}``, ``eps_0`` the initial step) where
Hoffman and Gelman's Algorithm 5 averages ``log eps_t``; the difference fades as the
iterates settle.
"""

from fisher_mala.adaptations.base import Adaptation
from fisher_mala.optional import require_blackjax

__all__ = ["dual_averaging"]


def dual_averaging(target_acceptance_rate=0.8) -> Adaptation:
    """Dual averaging towards ``target_acceptance_rate`` (Hoffman and Gelman, 2014, Eq. (6)).

    Returns
    -------
    Adaptation
        ``init(step_size) -> DualAveragingAdaptationState``;
        ``update(state, acceptance_rate) -> state``; ``final(state) -> step``, the
        averaged step ``exp(log_step_size_avg)``.
    """
    blackjax = require_blackjax()
    init, update, final = blackjax.adaptation.step_size.dual_averaging_adaptation(
        target_acceptance_rate
    )
    return Adaptation(init, update, final)
