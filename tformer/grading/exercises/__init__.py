"""Every chapter's exercises, one module per chapter (ch01.py ... ch15.py), each `register(Exercise(...))`-ing
its own. Nothing registers on import: `load()` (tformer.grading.load_exercises) imports them all, once."""
import importlib
import pkgutil


def load() -> None:
    """Import (and so register) every chapter's exercises; a second call does nothing."""
    for m in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{m.name}")
