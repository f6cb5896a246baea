"""From configuration to validators: `module:Class`, `builtin:<name>` or a bare built-in name, with parameters.

Why a module of its own: it is the one place that knows both the validator interface (`div.validators.base`) and
the built-ins (`div.validators.builtin`, which implement that interface), so neither imports the other's user.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from .base import Chain, ValidatorSpecError
from .builtin import BUILTINS

BUILTIN_MODULE = "div.validators.builtin"


def _entry(spec: Any, index: int) -> dict[str, Any]:
    if isinstance(spec, str):
        return {"class": spec}
    if isinstance(spec, dict):
        if not isinstance(spec.get("class"), str) or not spec["class"].strip():
            raise ValidatorSpecError(
                f"validators[{index}] {spec!r}: needs `class: module:Class` (or builtin:<name>)"
            )
        return spec
    raise ValidatorSpecError(
        f"validators[{index}] {spec!r}: expected `module:Class` or a mapping with `class:`"
    )


def resolve_class(path: str) -> type:
    """`module:Class`, `builtin:<name>` or a bare built-in name → the class. Raises ValidatorSpecError."""
    path = path.strip()
    if ":" not in path:
        module_name, attr, builtin = BUILTIN_MODULE, path, True
    else:
        module_name, _, attr = path.partition(":")
        builtin = module_name == "builtin"
        if builtin:
            module_name = BUILTIN_MODULE
    if builtin:
        cls = BUILTINS.get(attr)
        if cls is None:
            raise ValidatorSpecError(
                f"validator {path!r}: no built-in validator {attr!r} (built-ins: "
                f"{', '.join(sorted(BUILTINS))}; others are module:Class)"
            )
        return cls
    if not module_name or not attr:
        raise ValidatorSpecError(
            f"validator {path!r}: expected module:Class, e.g. mypackage.checks:MyValidator"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValidatorSpecError(
            f"validator {path!r}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}"
        ) from None
    obj = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ValidatorSpecError(f"validator {path!r}: module {module_name!r} has no {attr!r}")
    if not inspect.isclass(obj) or not callable(getattr(obj, "validate", None)):
        raise ValidatorSpecError(
            f"validator {path!r}: {attr!r} is not a validator class (it needs a "
            f"`validate(record)` method; see div.validators.base.RecordValidator)"
        )
    return obj


def _check_params(cls: type, params: dict, name: str, i: int) -> None:
    """An unknown parameter names the closest one the validator takes (a typo must not pass silently)."""
    import difflib
    import inspect

    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return
    valid = [n for n, p in sig.parameters.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    for key in params:
        if key not in valid:
            match = difflib.get_close_matches(str(key), valid, n=1, cutoff=0.5)
            hint = f" (did you mean {match[0]!r}?)" if match else f" (it takes: {', '.join(valid) or 'none'})"
            raise ValidatorSpecError(f"validator {name!r} (validators[{i}]): unknown parameter {key!r}{hint}")


def build_chain(specs: list | None) -> Chain:
    """Instantiate the configured validators, in order.

    Each spec is `module:Class` (or `builtin:<name>`) or a mapping `{"class": ..., "name": ..., **params}`; the
    params become constructor keyword arguments. Raises ValidatorSpecError naming the bad entry.
    """
    out = []
    for i, spec in enumerate(specs or []):
        entry = _entry(spec, i)
        cls = resolve_class(entry["class"])
        params = {k: v for k, v in entry.items() if k not in ("class", "name")}
        _check_params(cls, params, entry["class"], i)
        try:
            inst = cls(**params)
        except (TypeError, ValueError) as exc:
            raise ValidatorSpecError(
                f"validator {entry['class']!r} (validators[{i}]): bad parameters {params!r}: {exc}"
            ) from None
        if entry.get("name"):
            try:
                inst.name = str(entry["name"])
            except AttributeError:
                raise ValidatorSpecError(f"validator {entry['class']!r}: cannot set its name") from None
        out.append(inst)
    return Chain(out)
