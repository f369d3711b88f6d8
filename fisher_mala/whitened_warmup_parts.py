"""The Fisher NUTS / HMC warm-up in parts, for a checkpointed ``fm.sample`` (layer 4).

:class:`~fisher_mala.whitened_warmup.FisherHMCWarmup` runs its stages (the Fisher phase,
the host's looks at ``R``, the step-size phase) as few compiled calls as its looks allow
(:meth:`~fisher_mala.whitened_warmup.FisherHMCWarmup.staged_run`). With a checkpoint the
same warm-up runs in parts of at most ``checkpoint_every`` iterations, saved after each
(:meth:`WarmupInParts.segmented_run`): the Fisher phase in the segments of its schedule
(:func:`fisher_mala.schedule.segments`) cut where the host looks, the step-size phase in
parts of its own (:func:`fisher_mala.leapfrog_tuning.tuning_advance`). The keys of every
iteration come from its index, so the parts give the chain of ``staged_run``, bit for bit
(``tests/reliability/test_checkpoint.py``).
"""

import jax
import numpy as np

from fisher_mala import leapfrog_tuning
from fisher_mala.schedule import WarmupInfo

__all__ = ["WarmupInParts"]


class WarmupInParts:
    """The parts of :class:`~fisher_mala.whitened_warmup.FisherHMCWarmup` (a mixin: it
    reads the warm-up's ``fisher``, ``tuning``, ``split``, ``choose``, ``learned``, ...).
    Each part has the signature ``(rng_key, argument, num_steps, progress, offset,
    *extra)``, ``offset`` its first iteration (traced, so parts of one length compile
    once)."""

    def fisher_start(self, rng_key, positions, num_steps, progress=None, offset=None):
        """The Fisher phase's start: ``(state, Start)`` (what :meth:`fisher_stage` does
        first)."""
        key_fisher, _ = jax.random.split(rng_key)
        return self.fisher.start(key_fisher, positions, self.split(num_steps)[0])

    def fisher_advance(self, rng_key, argument, num_steps, progress, offset, segment):
        """One segment of the Fisher phase's schedule from ``argument = (positions,
        state)``: ``(state, rates, trace or None)``."""
        positions, state = argument
        key_fisher, _ = jax.random.split(rng_key)
        num_fisher = self.split(num_steps)[0]
        return self.fisher.advance(
            key_fisher, positions, state, num_fisher, segment, offset, progress
        )

    def fisher_finish(self, rng_key, argument, num_steps, progress=None, offset=None):
        """``(state, parameters)`` of the Fisher phase at ``argument = (positions,
        state)``, as :meth:`fisher_stage` returns them."""
        positions, state = argument
        return self.fisher.finish(positions, state, self.split(num_steps)[0])

    def tuning_start(
        self, rng_key, fisher_state, num_steps, progress, offset, metric, plateau=False,
        widen_iteration=None, widen_at=None,
    ):  # fmt: skip
        """The step-size phase's carry after the Fisher phase's final ``fisher_state``
        (``widen_iteration``, ``widen_at``: where ``R`` is widened, see
        :func:`~fisher_mala.leapfrog_tuning.tuning_start`)."""
        tuning = self.tuning_for(plateau)
        return leapfrog_tuning.tuning_start(tuning, fisher_state, metric, widen_iteration, widen_at)

    def tuning_advance(self, rng_key, carry, num_steps, progress, offset, num, plateau=False):
        """``num`` iterations of the step-size phase from warm-up iteration ``offset``."""
        _, key_tune = jax.random.split(rng_key)
        tuning = self.tuning_for(plateau)
        return leapfrog_tuning.tuning_advance(tuning, key_tune, carry, num, offset, progress)

    def tuning_whole(
        self, rng_key, fisher_out, num_steps, progress, offset, metric, settled, plateau=False
    ):
        """:meth:`tuning_stage` in the argument order of the other parts."""
        return self.tuning_stage(rng_key, fisher_out, num_steps, progress, metric, settled, plateau)

    def tuning_finish(
        self, rng_key, argument, num_steps, progress=None, offset=None, plateau=False
    ):
        """What :meth:`tuning_stage` returns, from ``argument = (Fisher info, carry, the
        step-size phase's info)``."""
        finfo, carry, info = argument
        num_tune = info[0].shape[-1]  # the step-size iterations run
        tuning = self.tuning_for(plateau)
        return leapfrog_tuning.tuning_finish(tuning, finfo, carry, info, num_tune)

    def segmented_run(self, call, positions, num_steps: int, every, saved=None, save=None,
                      on_host=None):  # fmt: skip
        """:meth:`staged_run` in parts of at most ``every`` iterations (``None``: as few as
        the looks allow), ``save(tree, meta)`` after each; resumed from ``saved = (tree,
        meta)`` when given. ``call(method, argument, offset, *extra)`` runs one part on
        every chain (``positions`` with a leading chain axis).

        The Fisher phase runs in the segments of its schedule
        (:meth:`fisher_mala.warmups.Warmup.segments`: whole blocks of its adaptive phase),
        cut where :meth:`staged_run` looks at ``R`` (:meth:`first_fisher_iterations`, then
        each block while the stopping rule may stop it); the step-size phase in parts of
        ``every`` iterations. The keys of every iteration come from its index, so the
        chain is that of :meth:`staged_run`, bit for bit. Two step-size phases run in one
        part: the keep-learning one (``score_prior_weight``) and the pooled one (its parts
        agree with it only to rounding, about one float32 ulp after a dozen NUTS
        transitions, since XLA compiles the chains' batched products differently).
        """
        on_host = on_host or (lambda fn, *args: fn(*args))
        num_chains = jax.tree.leaves(positions)[0].shape[0]
        dim = sum(int(np.prod(np.shape(x)[1:])) for x in jax.tree.leaves(positions))
        signals = num_chains if self.pooled else 1
        num_fisher, _ = self.split(num_steps)
        first = self.first_fisher_iterations(num_fisher, dim, signals)
        looks = self.staged and self._rule_can_stop_at(dim, signals)
        points = {first, num_fisher}
        if looks:  # the blocks where the stopping rule looks
            points.update(range(first + self.fisher.block, num_fisher, self.fisher.block))
        parts = _cut(self.fisher.segments(num_fisher, positions, every or num_fisher), points)
        tree, meta = saved if saved is not None else ({}, {"stage": "fisher", "done": 0})
        if saved is None:
            tree["state"], tree["start"] = call("fisher_start", positions, 0)
            tree.update(rates=None, trace=None, previous=None)
            meta.update(metric=None, stopped=False, learned=False if looks else None)
        while meta["stage"] == "fisher" and meta["done"] < len(parts):
            index = meta["done"]
            segment = parts[index]
            argument = (positions, tree["state"])
            tree["state"], more, snaps = call(
                "fisher_advance", argument, segment.begin, segment._replace(begin=0)
            )
            tree["rates"] = _join([tree["rates"], more], lambda part: -1)
            snaps = None if snaps is None else jax.tree.map(np.asarray, snaps)
            tree["trace"] = _join([tree["trace"], snaps], lambda p: p.iteration.ndim - 1)
            end = segment.begin + segment.num_steps
            last_at_end = index + 1 == len(parts) or parts[index + 1].num_steps > 0
            if end in points and last_at_end and self.staged:
                view = call("fisher_finish", (positions, tree["state"]), 0)[0]
                if not looks and meta["metric"] is None:  # the metric's first look
                    meta["metric"] = on_host(self.choose, view)
                    meta["stopped"] = meta["metric"] == "diagonal" and self.metric == "auto"
                elif looks and tree["previous"] is not None:  # the stopping rule
                    verdict = on_host(self.look, tree["previous"], view)
                    meta["stopped"] = bool(verdict)
                    meta["learned"] = verdict == "settled"
                    meta["plateau"] = verdict == "plateau"
                if looks:
                    tree["previous"] = view
            meta["done"] = index + 1
            if meta["stopped"] or meta["done"] == len(parts):
                tree, meta = self._to_tuning(call, on_host, positions, parts, num_steps, tree, meta)
            if save is not None:
                save(tree, meta)
            if meta["stage"] != "fisher":
                break
        return self._tune_in_parts(call, num_steps, every, tree, meta, save)

    def _to_tuning(self, call, on_host, positions, parts, num_steps, tree, meta):
        """The Fisher phase's outcome and the step-size phase's start, after its last part."""
        start = tree["start"]
        evals = start.num_grad_evals + sum(
            p.num_steps * p.grads_per_step for p in parts[: meta["done"]]
        )
        info = WarmupInfo(*tree["rates"], start.step_size, evals, tree["trace"])
        fisher_state, params = call("fisher_finish", (positions, tree["state"]), 0)
        metric = meta["metric"]
        if not (meta["stopped"] and metric == "diagonal" and self.metric == "auto"):
            metric = on_host(self.choose, fisher_state, meta.get("learned"))
        (fisher_state, params), info = on_host(self.regroup, ((fisher_state, params), info))
        plateau = bool(meta.get("plateau"))  # the rule ended the phase on a plateau
        # the stopping rule looked (learned is then a bool) and the phase ran its length
        unsettled = meta.get("learned") is False and not plateau
        (fisher_state, params), info = on_host(
            self.share_after, ((fisher_state, params), info),
            plateau or self.shares_unsettled(unsettled),
        )  # fmt: skip
        settled = bool(on_host(self.settled, fisher_state))
        if self.score_prior_weight is not None or self.pooled:  # in one part (docstring)
            argument = ((fisher_state, params), info)
            out = call("tuning_whole", argument, 0, metric, settled, plateau)
            return {"out": out}, {"stage": "done", "plateau": plateau}
        # where the one-call step-size phase widens R (the iteration's keys and sums are
        # those of `tune_step_size`, whichever part it falls in)
        num_fisher = info.acceptance_rate.shape[-1]
        num_tune = self.tuning_steps(num_steps, num_fisher, settled)
        widen_at = self.widen_at(num_tune, fisher_state, plateau)
        widen_iteration = None if widen_at is None else num_fisher + widen_at
        carry = call("tuning_start", fisher_state, 0, metric, plateau, widen_iteration, widen_at)
        tree = {"finfo": info, "carry": carry, "info": None}
        meta = {"stage": "tuning", "done": 0, "metric": metric, "settled": settled}
        return tree, {**meta, "plateau": plateau, "unsettled": unsettled}

    def _tune_in_parts(self, call, num_steps, every, tree, meta, save):
        """The step-size phase from ``tree`` (:meth:`_to_tuning`) in parts of ``every``."""
        plateau = meta.get("plateau", False)
        self.chose_after(plateau)
        if meta["stage"] == "done":
            return self.after_tuning(call, tree["out"], plateau, None, 0)
        finfo = tree["finfo"]
        num_fisher = finfo.acceptance_rate.shape[-1]
        num_tune = self.tuning_steps(num_steps, num_fisher, meta["settled"])
        while meta["done"] < num_tune:
            num = min(every or num_tune, num_tune - meta["done"])
            tree["carry"], more = call(
                "tuning_advance", tree["carry"], num_fisher + meta["done"], num,
                meta.get("plateau", False),
            )  # fmt: skip
            tree["info"] = _join([tree["info"], more], lambda part: -1)
            meta["done"] += num
            if save is not None:
                save(tree, meta)
        info = tree["info"]
        if info is None:  # no step-size iterations: empty infos of the right shape
            empty = np.zeros((*np.shape(finfo.acceptance_rate)[:-1], 0))
            info = (empty, empty.astype(bool), empty.astype(bool), empty.astype(np.int32))
        out = call("tuning_finish", (finfo, tree["carry"], info), 0, plateau)
        unsettled = meta.get("unsettled", False)
        return self.after_tuning(call, out, plateau, None, 0, unsettled=unsettled)


def _cut(parts, points) -> tuple:
    """``parts`` (:class:`~fisher_mala.schedule.Segment`) cut at the iterations ``points``
    (counted from the start of the warm-up) that fall strictly inside one, and after the
    hand-over of a phase that starts at one (a part of no iterations, so that the look
    there sees the state the phase starts from, as ``run`` stopped there does)."""
    out = []
    for part in parts:
        begin, end = part.begin, part.begin + part.num_steps
        inner = sorted(p for p in points if begin < p < end)
        enter = part.enter
        if enter and begin in points and part.num_steps > 0:
            out.append(part._replace(num_steps=0))
            enter = False
        for cut in [*inner, end]:
            out.append(part._replace(num_steps=cut - begin, begin=begin, enter=enter))
            begin, enter = cut, False
    return tuple(out)


def _join(parts, axis_of):
    """Per-part outputs (numpy) joined on their iteration axis, ``axis_of(part)``."""
    parts = [jax.tree.map(np.asarray, p) for p in parts if p is not None]
    if not parts:
        return None
    axis = axis_of(parts[0])
    return jax.tree.map(lambda *xs: np.concatenate(xs, axis=axis), *parts)
