"""What the decorator knows of structured values: dataclasses and pydantic v2 models, their
fields, and annotations resolved from the text ``from __future__ import annotations`` leaves.

Shared by the fingerprint paths (``_keys``) and the result serializers (``_results``); pydantic
is never imported here: a model's class is recognised by what pydantic v2 gives it, so the
package works without pydantic installed.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import typing
from typing import Any, Dict, Mapping, Optional, Tuple

__all__ = [
    "UNRESOLVED",
    "field_types",
    "is_dataclass_type",
    "is_pydantic_type",
    "json_form",
    "resolve",
    "unwrap_optional",
    "is_union",
]

# An annotation that could not be evaluated (a name only a type checker sees).
UNRESOLVED = object()


def is_dataclass_type(kind: Any) -> bool:
    """Whether ``kind`` is a dataclass (the class, not an instance)."""
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def is_pydantic_type(kind: Any) -> bool:
    """Whether ``kind`` is a pydantic v2 model class (``BaseModel`` or a subclass)."""
    return (
        isinstance(kind, type)
        and hasattr(kind, "model_validate")
        and hasattr(kind, "model_dump")
        and isinstance(getattr(kind, "model_fields", None), Mapping)
    )


def is_pydantic_v1_type(kind: Any) -> bool:
    """Whether ``kind`` is a pydantic v1 model (``pydantic.v1.BaseModel``), which has none of
    v2's methods."""
    return isinstance(kind, type) and hasattr(kind, "__fields__") and hasattr(kind, "parse_obj")


def resolve(annotation: Any, namespace: Mapping[str, Any]) -> Any:
    """``annotation`` evaluated when it is text (``from __future__ import annotations``), in
    the module ``namespace`` of the function that carries it; ``UNRESOLVED`` when it names
    something that module does not define (a class local to a function, a name imported only
    for type checkers)."""
    if isinstance(annotation, typing.ForwardRef):
        annotation = annotation.__forward_arg__
    if not isinstance(annotation, str):
        return annotation
    try:
        return eval(annotation, dict(namespace))  # noqa: S307 - an annotation, as typing evaluates it
    except Exception:
        return UNRESOLVED


def unwrap_optional(kind: Any) -> Any:
    """``X`` of ``Optional[X]`` and of ``Annotated[X, ...]``; ``kind`` itself otherwise."""
    while True:
        origin = typing.get_origin(kind)
        args = typing.get_args(kind)
        if origin is typing.Annotated:
            kind = args[0]
            continue
        if is_union(origin):
            others = [arg for arg in args if arg is not type(None)]
            if len(others) == 1:
                kind = others[0]
                continue
        return kind


def is_union(origin: Any) -> bool:
    # `X | None` is a `types.UnionType` (3.10 and later), not a `typing.Union`.
    return origin is typing.Union or origin is getattr(types, "UnionType", typing.Union)


def field_types(kind: Any) -> Optional[Dict[str, Any]]:
    """The fields of a dataclass or pydantic model class, by name, each with its annotation
    (``UNRESOLVED`` where it cannot be evaluated); ``None`` for any other type."""
    if is_pydantic_type(kind):
        return {name: field.annotation for name, field in kind.model_fields.items()}
    if not is_dataclass_type(kind):
        return None
    try:
        hints = typing.get_type_hints(kind)
    except Exception:
        # A field names a class the module does not define: each field on its own.
        module = sys.modules.get(kind.__module__)
        namespace = dict(vars(module)) if module is not None else {}
        hints = {field.name: resolve(field.type, namespace) for field in dataclasses.fields(kind)}
    return {field.name: hints.get(field.name, UNRESOLVED) for field in dataclasses.fields(kind)}


def json_form(value: Any) -> Any:
    """The JSON value of a dataclass instance (an object of its fields, each as it is: the
    encoder calls this again for a nested one) or of a pydantic model
    (``model_dump(mode="json")``); a ``TypeError`` for anything else, as ``json`` raises."""
    kind = type(value)
    if dataclasses.is_dataclass(kind):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if is_pydantic_type(kind):
        return value.model_dump(mode="json")
    raise TypeError(f"Object of type {kind.__name__} is not JSON serializable")


def dotted(root: str, path: Tuple[str, ...]) -> str:
    """``order.amount`` of the root ``order`` and the path ``("amount",)``."""
    return ".".join((root,) + path)
