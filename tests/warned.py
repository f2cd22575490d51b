"""The warnings one call raises, caught on this process (not on thread worlds: the filters are the process's)."""

from __future__ import annotations

import warnings
from typing import Any, Callable


def warned(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[str]:
    """``fn(*args, **kwargs)``'s warnings' messages, every one of them (none filtered out or shown once)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn(*args, **kwargs)
    return [str(w.message) for w in caught]
