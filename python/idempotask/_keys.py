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

import dataclasses
import difflib
import inspect
import json
import re
import string
from decimal import Decimal
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from ._types import dotted, field_types, is_pydantic_type, json_form, resolve, unwrap_optional

__all__ = ["KeyTemplate", "encode_json", "placeholder_text"]


# Python and serde_json write a float alike (the shortest digits, plain from 1e-4 to below
# 1e16, `1e+16` above) but for small ones: `1.5e-05` and `1e-07` in Python, `0.000015` and `1e-7`
# in serde_json. Only a text with such an exponent takes the slow path, which writes every float
# as serde_json does; a string that merely looks like one costs that path, nothing more.
_PYTHON_EXPONENT = re.compile(r"\de-0\d")


def encode_json(value: Any, structured: bool = False) -> str:
    """The compact JSON text of ``value``, byte for byte what serde_json writes for the same
    value, so that fingerprints and markers match a Rust worker's.

    No whitespace and no ASCII escaping (serde_json writes ``é``, not ``\\u00e9``); floats in
    serde_json's layout (``0.000015`` and ``1e-7`` where Python writes ``1.5e-05`` and
    ``1e-07``); a float that JSON cannot carry (NaN, an infinity) is ``null``, as serde_json
    writes it. ``structured``: a dataclass or a pydantic model is the JSON object of its
    fields (as fingerprints take them), not a ``TypeError``.
    """
    default = json_form if structured else None
    try:
        text = (_STRUCTURED_ENCODER if structured else _ENCODER).encode(value)
    except ValueError:
        # NaN or an infinity (or a cycle, which the slow path reports too).
        return "".join(_chunks(value, set(), default))
    if _PYTHON_EXPONENT.search(text):
        return "".join(_chunks(value, set(), default))
    return text


# One encoder for every call: `json.dumps` with any option builds a new one each time.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)
_STRUCTURED_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=json_form)


def _chunks(value: Any, open_containers: set, default: Optional[Callable[[Any], Any]] = None) -> Any:
    """The pieces of ``value``'s JSON text, as ``json.dumps`` makes them but for floats."""
    if isinstance(value, str):
        yield json.dumps(value, ensure_ascii=False)
    elif value is None:
        yield "null"
    elif value is True:
        yield "true"
    elif value is False:
        yield "false"
    elif isinstance(value, int):
        yield int.__repr__(value)
    elif isinstance(value, float):
        yield float_json(value)
    elif isinstance(value, (list, tuple, dict)):
        if id(value) in open_containers:
            raise ValueError("Circular reference detected")
        open_containers.add(id(value))
        if isinstance(value, dict):
            yield "{"
            for index, (name, item) in enumerate(value.items()):
                yield ("," if index else "") + json.dumps(_member_name(name), ensure_ascii=False) + ":"
                yield from _chunks(item, open_containers, default)
            yield "}"
        else:
            yield "["
            for index, item in enumerate(value):
                if index:
                    yield ","
                yield from _chunks(item, open_containers, default)
            yield "]"
        open_containers.discard(id(value))
    elif default is not None:
        if id(value) in open_containers:
            raise ValueError("Circular reference detected")
        open_containers.add(id(value))
        yield from _chunks(default(value), open_containers, default)
        open_containers.discard(id(value))
    else:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _member_name(name: Any) -> str:
    """An object member's name, as ``json.dumps`` converts a dict key."""
    if isinstance(name, str):
        return name
    if name is True or name is False:
        return "true" if name else "false"
    if name is None:
        return "null"
    if isinstance(name, int):
        return int.__repr__(name)
    if isinstance(name, float):
        return float_json(name)
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(name).__name__}")


def float_json(value: float) -> str:
    """``value`` as serde_json writes an ``f64``: the shortest digits that read back as it, in
    plain notation from ``0.00001`` to below ``1e16`` (``1.0``, ``0.000015``), else with an
    exponent (``1e+16``, ``1.5e-7``); ``-0.0``; ``null`` for NaN and the infinities."""
    if value != value or value in (float("inf"), float("-inf")):
        return "null"
    text = float.__repr__(value)
    sign = "-" if text.startswith("-") else ""
    mantissa, _, exponent = text.lstrip("-").partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    # Where the decimal point falls, counted from the first significant digit.
    point = len(whole) + int(exponent or 0) - (len(whole + fraction) - len(digits))
    digits = digits.rstrip("0")
    if not digits:
        return sign + "0.0"
    length = len(digits)
    if length <= point <= 16:
        return sign + digits + "0" * (point - length) + ".0"
    if 0 < point <= 16:
        return sign + digits[:point] + "." + digits[point:]
    if -5 < point <= 0:
        return sign + "0." + "0" * -point + digits
    exponent = f"e+{point - 1}" if point > 0 else f"e{point - 1}"
    if length == 1:
        return f"{sign}{digits}{exponent}"
    return f"{sign}{digits[0]}.{digits[1:]}{exponent}"


def _float_text(value: float) -> str:
    """``value`` as Rust's ``Display`` for ``f64`` writes it: the shortest digits that read back
    as the same float, in plain decimal notation, without a trailing ``.0``."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    text = format(Decimal(float.__repr__(value)), "f")
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
    if isinstance(value, Decimal):
        return format(value, "f")
    kind = type(value)
    if isinstance(value, (bytes, bytearray, memoryview)) or (
        kind.__str__ is object.__str__ and kind.__repr__ is object.__repr__
    ):
        # `b'..'`, or `<Order object at 0x7f..>`: a text that differs per process would give
        # every delivery a unit of its own.
        raise TypeError(
            f"key placeholder `{{{name}}}` is a {kind.__name__}, which has no stable text; put a field of it in the key, like `{{{name}.id}}`"
        )
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


def fingerprint_paths(
    fingerprint: Any,
    parameters: Sequence[str],
    template: "KeyTemplate",
    annotations: Mapping[str, Any],
    namespace: Mapping[str, Any],
    qualname: str,
) -> Optional[Tuple[Tuple[str, Tuple[str, ...]], ...]]:
    """The fingerprinted values, checked, each a parameter and a path of fields in it:
    ``True`` is every parameter that is not part of the key, in declaration order; a list
    names them (in its order) as ``"currency"`` or ``"order.amount"``, each once, never a
    parameter the key holds (a field of one may be listed), as the Rust attribute checks them.
    A path into a parameter annotated with a dataclass or a pydantic model is checked against
    its fields here; any other one when a call selects it."""
    if fingerprint is None or fingerprint is False:
        return None
    if fingerprint is True:
        names = tuple((p, ()) for p in parameters if p not in template.roots)
        if not names:
            raise ValueError(f"{qualname}: fingerprint=True, but every parameter is part of the key")
        return names
    if isinstance(fingerprint, str) or not isinstance(fingerprint, (list, tuple)):
        raise TypeError(
            f"{qualname}: fingerprint must be True or a list of parameter names or paths, like fingerprint=[\"amount_cents\"] or [\"order.amount\", \"currency\"]"
        )
    errors = []
    paths = []
    seen = set()
    for entry in fingerprint:
        if not isinstance(entry, str):
            errors.append(f"{entry!r} is not a parameter name or a path like \"order.amount\"")
            continue
        root, *path = entry.split(".")
        if not root.isidentifier() or not all(part.isidentifier() for part in path):
            errors.append(f"`{entry}` is not a parameter or a path of fields in one, like `order.amount`")
        elif entry in seen:
            errors.append(f"`{entry}` is listed twice in the fingerprint")
        elif root in template.roots and not path:
            errors.append(
                f"`{entry}` is part of the key; the fingerprint lists the other parameters (or fields), the ones that must match when the key is reused"
            )
        elif root not in parameters:
            close = difflib.get_close_matches(root, list(parameters), n=1)
            hint = f"; did you mean `{close[0]}`?" if close else ""
            errors.append(f"`{root}` is not a parameter of this function{hint}")
        else:
            missing = _missing_field(root, tuple(path), annotations.get(root, Any), namespace)
            if missing is not None:
                errors.append(missing)
            paths.append((root, tuple(path)))
        seen.add(entry)
    if errors:
        raise ValueError(f"{qualname}: fingerprint: " + "; ".join(errors))
    if not fingerprint:
        raise ValueError(f"{qualname}: fingerprint=[] names no parameter")
    return tuple(paths)


def _missing_field(root: str, path: Tuple[str, ...], annotation: Any, namespace: Mapping[str, Any]) -> Optional[str]:
    """Why the path names no field, as far as the parameter's annotation tells (a dataclass, a
    pydantic model, optional or not); ``None`` when it names one or the annotation does not
    say (a dict, ``Any``, none at all)."""
    kind = annotation
    for depth, part in enumerate(path):
        kind = unwrap_optional(resolve(kind, namespace))
        fields = field_types(kind)
        if kind in (str, int, float, bool, bytes):
            return f"`{dotted(root, path)}`: `{dotted(root, path[:depth])}` is {'an' if kind is int else 'a'} {kind.__name__}, which has no field `{part}`"
        if fields is None:
            return None
        if part not in fields:
            close = difflib.get_close_matches(part, list(fields), n=1)
            hint = f"; did you mean `{dotted(root, path[:depth] + (close[0],))}`?" if close else ""
            return f"`{dotted(root, path)}`: {kind.__name__} has no field `{part}`{hint}"
        kind = fields[part]
    return None


def fingerprint_json(paths: Sequence[Tuple[str, Tuple[str, ...]]], arguments: Dict[str, Any]) -> str:
    """The JSON text whose fingerprint a call stores: the selected values as a list, a
    dataclass or a pydantic model as the JSON object of its fields."""
    return encode_json([select(arguments[root], root, path) if path else arguments[root] for root, path in paths], structured=True)


class MissingField(LookupError):
    """A fingerprint path that names no field of the call's argument."""


def select(value: Any, root: str, path: Tuple[str, ...]) -> Any:
    """The field ``path`` names in ``value`` (the argument ``root``): an item of a mapping, a
    field of a dataclass or of a pydantic model (of its JSON form, so that a path selects what
    the whole model's fingerprint holds), or an attribute of any other object."""
    for depth, part in enumerate(path):
        kind = type(value)
        if is_pydantic_type(kind):
            value = value.model_dump(mode="json")
        if isinstance(value, Mapping):
            if part in value:
                value = value[part]
                continue
            why = f"the {kind.__name__} has no key `{part}`" if isinstance(value, kind) else f"{kind.__name__} has no field `{part}`"
        elif value is None:
            why = "it is None"
        elif dataclasses.is_dataclass(kind):
            if part in {field.name for field in dataclasses.fields(value)}:
                value = getattr(value, part)
                continue
            why = f"{kind.__name__} has no field `{part}`"
        elif hasattr(value, part):
            value = getattr(value, part)
            continue
        else:
            why = f"a {kind.__name__} has no attribute `{part}`"
        raise MissingField(f"fingerprint path `{dotted(root, path)}`: at `{dotted(root, path[:depth])}`, {why}")
    return value
