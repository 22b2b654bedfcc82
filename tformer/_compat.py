"""Deprecated names that keep working for one release (issue 15: one naming scheme across configs).

`renamed_fields(old="new", ...)` decorates a config dataclass so that `Config(old=...)`, `cfg.old` and
`cfg.old = ...` still work, with a FutureWarning naming the new field (`dataclasses.replace` needs the
new names). (Translation run folders store a `TranslatePreset`, whose fields already had the
paper's names, so saved runs need no alias.)
"""
from __future__ import annotations

import functools
import warnings


def _warn(owner: str, old: str, new: str, stacklevel: int = 3) -> None:
    warnings.warn(f"{owner}.{old} is deprecated (issue 15: one naming scheme); use {new}", FutureWarning,
                  stacklevel=stacklevel)


def renamed_kwargs(owner: str, kwargs: dict, renames: dict[str, str], stacklevel: int = 4) -> dict:
    """Move deprecated keyword arguments to their new names (warning once per call)."""
    for old, new in renames.items():
        if old in kwargs:
            if new in kwargs:
                raise TypeError(f"{owner}: got both {old}= (deprecated) and {new}=; pass only {new}=")
            _warn(owner, old, new, stacklevel)
            kwargs[new] = kwargs.pop(old)
    return kwargs


def renamed_fields(**renames: str):
    """Class decorator for a dataclass: old field names become deprecated aliases of the new ones."""
    def wrap(cls):
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **renamed_kwargs(cls.__name__, kwargs, renames))
        cls.__init__ = __init__
        for old, new in renames.items():
            def get(self, _old=old, _new=new):
                _warn(type(self).__name__, _old, _new)
                return getattr(self, _new)

            def put(self, value, _old=old, _new=new):
                _warn(type(self).__name__, _old, _new)
                setattr(self, _new, value)
            setattr(cls, old, property(get, put, doc=f"Deprecated alias of `{new}`."))
        return cls
    return wrap

