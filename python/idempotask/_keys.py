"""Key templates and fingerprints: what a call's unit is made of, computed from its arguments.

Both follow the Rust attribute, so that a Python task and a Rust task with the same name, key
template and fingerprint list name the same units and store the same fingerprints:

- a key placeholder's value is written as Rust's ``Display`` writes the same JSON value: an
  ``int`` as its digits, a ``bool`` as ``true``/``false``, a ``float`` in plain decimal
  notation without a trailing ``.0`` (``1.0`` is ``1``, ``1e20`` is ``100000000000000000000``);
- the fingerprint is the SHA-256 of the canonical JSON of a list of the fingerprinted
  arguments, in the order the ``fingerprint`` option names them (Rust's tuple).
"""

from __future__ import annotations

import difflib
import inspect
import json
import string
from decimal import Decimal
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

__all__ = ["KeyTemplate", "encode_json", "placeholder_text"]


def encode_json(value: Any) -> str:
    """The compact JSON text of ``value``, as serde_json writes it.

    No whitespace and no ASCII escaping (serde_json writes ``é``, not ``\\u00e9``); a float that
    JSON cannot carry (NaN, an infinity) is refused with ``ValueError``.
    """
    return _ENCODER.encode(value)


# One encoder for every call: `json.dumps` with any option builds a new one each time.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _float_text(value: float) -> str:
    """``value`` as Rust's ``Display`` for ``f64`` writes it: the shortest digits that read back
    as the same float, in plain decimal notation, without a trailing ``.0``."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    text = format(Decimal(repr(value)), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def placeholder_text(value: Any, name: str) -> str:
    """A key placeholder's value as text: the same text a Rust task's key has for the same
    argument."""
    if value is None:
        raise TypeError(f"key placeholder `{{{name}}}` is None; a key is made of values")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        return _float_text(value)
    if isinstance(value, str):
        return value
    return str(value)


def _lookup(value: Any, path: Sequence[str]) -> Any:
    """``order.id`` in a placeholder: an item of a mapping (a JSON object from a queue), else
    an attribute (a dataclass, a model)."""
    for part in path:
        if isinstance(value, Mapping):
            value = value[part]
        else:
            value = getattr(value, part)
    return value


class KeyTemplate:
    """A key template checked against a function's parameters: ``"order-charge-{order_id}"``.

    Placeholders name a parameter, or a field of one (``{order.id}``); ``{{`` and ``}}`` are
    literal braces. Format specs and conversions (``{x:>4}``, ``{x!r}``) are refused: the Rust
    attribute has none, and a key must be written the same way by both.
    """

    def __init__(self, template: str, parameters: Sequence[str], qualname: str) -> None:
        if not isinstance(template, str):
            raise TypeError(f"{qualname}: the key must be a template string like \"order-{{order_id}}\"")
        self.template = template
        self.parts: List[Tuple[str, Optional[Tuple[str, Tuple[str, ...]]]]] = []
        errors: List[str] = []
        roots: List[str] = []
        try:
            parsed = list(string.Formatter().parse(template))
        except ValueError as err:
            raise ValueError(
                f"{qualname}: key template {template!r}: {err}; write `{{{{` or `}}}}` for a literal brace"
            ) from None
        for literal, field, spec, conversion in parsed:
            placeholder = None
            if field is not None:
                placeholder = self._placeholder(field, spec, conversion, parameters, errors)
                if placeholder is not None:
                    roots.append(placeholder[0])
            self.parts.append((literal, placeholder))
        if not errors and not roots:
            errors.append(
                "the key template names no parameter, so every call would share one key; add a placeholder like `{order_id}`"
            )
        if errors:
            raise ValueError(f"{qualname}: key template {template!r}: " + "; ".join(errors))
        self.roots: Tuple[str, ...] = tuple(dict.fromkeys(roots))

    @staticmethod
    def _placeholder(
        field: str,
        spec: Optional[str],
        conversion: Optional[str],
        parameters: Sequence[str],
        errors: List[str],
    ) -> Optional[Tuple[str, Tuple[str, ...]]]:
        if spec or conversion:
            errors.append(
                f"placeholder `{{{field}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}` has a format spec or conversion; keys take plain values, as in Rust"
            )
            return None
        field = field.strip()
        if not field:
            errors.append("empty placeholder `{}`; name a parameter, like `{order_id}`")
            return None
        root, *path = field.split(".")
        if not root.isidentifier() or not all(part.isidentifier() for part in path):
            errors.append(f"`{{{field}}}` is not a parameter or a field of one, like `{{order.id}}`")
            return None
        if root not in parameters:
            close = difflib.get_close_matches(root, list(parameters), n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            errors.append(f"`{root}` is not a parameter of this function{hint}")
            return None
        return root, tuple(path)

    def render(self, arguments: Mapping[str, Any]) -> str:
        """The key for one call's arguments (by parameter name)."""
        out = []
        for literal, placeholder in self.parts:
            out.append(literal)
            if placeholder is not None:
                root, path = placeholder
                value = arguments[root]
                if path:
                    value = _lookup(value, path)
                kind = type(value)
                # The common cases first; `placeholder_text` writes them the same way.
                if kind is str:
                    out.append(value)
                elif kind is int:
                    out.append(str(value))
                else:
                    out.append(placeholder_text(value, ".".join((root,) + path)))
        return "".join(out)


def key_parameters(function: Callable[..., Any]) -> Tuple[inspect.Signature, List[str], bool]:
    """The signature of ``function``, the parameters a key or fingerprint can name, and whether
    the first parameter is ``self`` (a bound Celery task, or a method), which is not one of
    them."""
    signature = inspect.signature(function)
    params = list(signature.parameters.values())
    bound = bool(params) and params[0].name == "self"
    if bound:
        params = params[1:]
    names = [
        p.name
        for p in params
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    return signature, names, bound


def fingerprint_names(
    fingerprint: Any, parameters: Sequence[str], key_roots: Sequence[str], qualname: str
) -> Optional[Tuple[str, ...]]:
    """The fingerprinted parameters, checked: ``True`` is every parameter that is not part of
    the key, in declaration order; a list names them (in its order), never one of the key's."""
    if fingerprint is None or fingerprint is False:
        return None
    if fingerprint is True:
        names = tuple(p for p in parameters if p not in key_roots)
        if not names:
            raise ValueError(f"{qualname}: fingerprint=True, but every parameter is part of the key")
        return names
    if isinstance(fingerprint, str) or not isinstance(fingerprint, (list, tuple)):
        raise TypeError(
            f"{qualname}: fingerprint must be True or a list of parameter names, like fingerprint=[\"amount_cents\"]"
        )
    errors = []
    for name in fingerprint:
        if name in key_roots:
            errors.append(
                f"`{name}` is part of the key; the fingerprint lists the other parameters, the ones that must match when the key is reused"
            )
        elif name not in parameters:
            close = difflib.get_close_matches(str(name), list(parameters), n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            errors.append(f"`{name}` is not a parameter of this function{hint}")
    if errors:
        raise ValueError(f"{qualname}: fingerprint: " + "; ".join(errors))
    if not fingerprint:
        raise ValueError(f"{qualname}: fingerprint=[] names no parameter")
    return tuple(fingerprint)


def fingerprint_json(names: Sequence[str], arguments: Dict[str, Any]) -> str:
    """The JSON text whose fingerprint a call stores: the named arguments as a list."""
    return encode_json([arguments[name] for name in names])
