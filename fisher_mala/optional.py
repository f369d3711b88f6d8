"""Optional dependencies, imported where they are used, with how to install them."""

__all__ = ["require_blackjax"]


def require_blackjax():
    """Import BlackJAX or explain how to install it."""
    try:
        import blackjax
    except ImportError as err:  # pragma: no cover - exercised without the extra
        raise ImportError(
            "Fisher NUTS and Fisher HMC use BlackJAX's kernels: "
            "`pip install 'fisher_mala[blackjax]'`."
        ) from err
    return blackjax
