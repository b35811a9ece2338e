"""Result serializers: how a task's value becomes the JSON its marker stores, and how a
duplicate gets a value of the same type back.

The serializer is chosen from the function's return annotation when the decorator is applied,
or given as ``result_serializer=``: a type (``Order``, ``List[Order]``) or a ``Serializer`` of
two functions. An annotation of plain JSON values (``str``, ``int``, ``Dict[str, Any]``, none
at all) keeps the stored text and the duplicate's value exactly as they were: ``json.loads`` of
the text. Where a value is rebuilt (a dataclass, a pydantic v2 model, an ``Enum``, a tuple, a
dict with ``int`` keys, anything holding one of them), the stored JSON is what a Rust task of
the same name reads (a dataclass is an object of its fields, a model its
``model_dump(mode="json", by_alias=True)``) and a stored value that does not fit the type is a ``CodecError``
of kind ``undecodable`` for the duplicate; the body does not run again.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import inspect
import json
import typing
from typing import Any, Callable, Dict, FrozenSet, Generic, List, Mapping, Optional, Tuple, TypeVar

from . import _native
from ._keys import encode_json
from ._types import UNRESOLVED, field_types, is_dataclass_type, is_pydantic_type, is_pydantic_v1_type, is_union, resolve

__all__ = ["ResultCodec", "Serializer", "UnfitResult", "result_codec"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Serializer(Generic[T]):
    """A task's own result serializer, for a type the decorator cannot rebuild by itself
    (``result_serializer=Serializer(dump=..., load=...)``), as Powertools' ``to_dict`` and
    ``from_dict``.

    ``dump`` turns the body's value into a JSON value (``dict``, ``list``, ``str``, ``int``,
    ``float``, ``bool`` or ``None``, nested as deep as the core reads): that is what the marker
    stores, and what a Rust task of the same name reads. ``load`` turns that JSON value back
    into the value a duplicate returns; whatever it raises (an ``Exception``) is a
    ``CodecError`` of kind ``undecodable`` for that duplicate, and the body does not run again.

        from decimal import Decimal
        from idempotask import MemoryStore, Serializer, idempotent_task

        money = Serializer(dump=lambda amount: str(amount), load=Decimal)

        @idempotent_task(key="total-{order_id}", store=MemoryStore(), result_serializer=money)
        def order_total(order_id: int) -> Decimal:
            return Decimal("12.50")

        assert order_total(1) == order_total(1) == Decimal("12.50")
    """

    dump: Callable[[T], Any]
    """The body's value -> its JSON value."""
    load: Callable[[Any], T]
    """A stored JSON value -> the value a duplicate returns."""

    def __post_init__(self) -> None:
        for name in ("dump", "load"):
            function = getattr(self, name)
            if not callable(function):
                raise TypeError(f"Serializer({name}=...) must be a function, not {type(function).__name__}")


# The JSON kinds of a value `json.loads` made.
_KIND_OF: Dict[type, str] = {
    dict: "object", list: "array", str: "string", bool: "bool", int: "int", float: "float", type(None): "null",
}
_EVERY_KIND: FrozenSet[str] = frozenset(_KIND_OF.values())


class _Unfit(Exception):
    """A value that does not fit its type: where, and why."""


class UnfitResult(TypeError):
    """The body's value does not fit the task's result type: it is recorded as unstorable."""


def _a(name: str) -> str:
    """``a str``, ``an int``."""
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


class _Node:
    """How one type turns into JSON and back.

    ``kinds``: the JSON kinds ``load`` takes; ``rebuilds``: whether ``load`` returns anything
    but the JSON value itself (else a task of this type keeps ``json.loads``'s value, as
    before serializers existed)."""

    kinds: FrozenSet[str] = _EVERY_KIND
    rebuilds = False

    def dump(self, value: Any) -> Any:
        return value

    def load(self, value: Any) -> Any:
        return value


class _Plain(_Node):
    """``Any``, ``object``, or a type made of plain JSON values: taken as it is."""

    def __init__(self, kinds: FrozenSet[str] = _EVERY_KIND, types: Tuple[type, ...] = (), name: str = "Any") -> None:
        self.kinds = kinds
        self.types = types
        self.name = name

    def dump(self, value: Any) -> Any:
        if self.types and (not isinstance(value, self.types) or (bool not in self.types and isinstance(value, bool))):
            raise _Unfit(f"{_a(type(value).__name__)}, not {_a(self.name)}")
        return value

    def load(self, value: Any) -> Any:
        if _KIND_OF.get(type(value)) not in self.kinds:
            raise _Unfit(f"a JSON {_KIND_OF.get(type(value), '?')}, not {_a(self.name)}")
        if self.name == "float" and type(value) is int:
            return float(value)
        return value


class _Literal(_Node):
    def __init__(self, values: Tuple[Any, ...]) -> None:
        self.values = values
        self.kinds = frozenset(_KIND_OF[type(value)] for value in values)

    def dump(self, value: Any) -> Any:
        if value not in self.values:
            raise _Unfit(f"{value!r} is not one of {self.values!r}")
        return value

    def load(self, value: Any) -> Any:
        return self.dump(value)


class _List(_Node):
    kinds = frozenset(("array",))

    def __init__(self, item: _Node, as_tuple: bool) -> None:
        self.item = item
        self.as_tuple = as_tuple
        self.rebuilds = as_tuple or item.rebuilds

    def dump(self, value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise _Unfit(f"{_a(type(value).__name__)}, not a {'tuple' if self.as_tuple else 'list'}")
        return [_at(index, self.item.dump, item) for index, item in enumerate(value)]

    def load(self, value: Any) -> Any:
        if type(value) is not list:
            raise _Unfit(f"a JSON {_KIND_OF.get(type(value), '?')}, not an array")
        items = [_at(index, self.item.load, item) for index, item in enumerate(value)]
        return tuple(items) if self.as_tuple else items


class _Tuple(_Node):
    """``Tuple[X, Y]``: a JSON array of exactly those items, as serde writes a Rust tuple."""

    kinds = frozenset(("array",))
    rebuilds = True

    def __init__(self, items: List[_Node]) -> None:
        self.items = items

    def _each(self, value: Any, method: str) -> Tuple[Any, ...]:
        if len(value) != len(self.items):
            raise _Unfit(f"{len(value)} items, not {len(self.items)}")
        return tuple(_at(index, getattr(node, method), item) for index, (node, item) in enumerate(zip(self.items, value)))

    def dump(self, value: Any) -> Any:
        if not isinstance(value, (list, tuple)):
            raise _Unfit(f"{_a(type(value).__name__)}, not a tuple")
        return list(self._each(value, "dump"))

    def load(self, value: Any) -> Any:
        if type(value) is not list:
            raise _Unfit(f"a JSON {_KIND_OF.get(type(value), '?')}, not an array")
        return self._each(value, "load")


class _Dict(_Node):
    kinds = frozenset(("object",))

    def __init__(self, value: _Node, int_keys: bool) -> None:
        self.value = value
        self.int_keys = int_keys
        self.rebuilds = int_keys or value.rebuilds

    def dump(self, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise _Unfit(f"{_a(type(value).__name__)}, not a dict")
        return {name: _at(name, self.value.dump, item) for name, item in value.items()}

    def load(self, value: Any) -> Any:
        if type(value) is not dict:
            raise _Unfit(f"a JSON {_KIND_OF.get(type(value), '?')}, not an object")
        if not self.int_keys:
            return {name: _at(name, self.value.load, item) for name, item in value.items()}
        out = {}
        for name, item in value.items():
            try:
                number = int(name)
            except ValueError:
                raise _Unfit(f"the name {name!r} is not an int") from None
            out[number] = _at(name, self.value.load, item)
        return out


class _Union(_Node):
    def __init__(self, members: List[_Node]) -> None:
        self.members = members
        self.kinds = frozenset().union(*(member.kinds for member in members))
        self.rebuilds = any(member.rebuilds for member in members)

    def dump(self, value: Any) -> Any:
        reasons = []
        for member in self.members:
            try:
                return member.dump(value)
            except _Unfit as unfit:
                reasons.append(str(unfit))
        raise _Unfit("; ".join(reasons))

    def load(self, value: Any) -> Any:
        kind = _KIND_OF.get(type(value))
        for member in self.members:
            if kind in member.kinds:
                return member.load(value)
        raise _Unfit(f"a JSON {kind}, which no member of the union takes")


class _Dataclass(_Node):
    """A dataclass: a JSON object of its fields, each through its own type."""

    kinds = frozenset(("object",))
    rebuilds = True

    def __init__(self, kind: type) -> None:
        self.kind = kind
        # Filled in after the node is in the memo, so that a dataclass that holds itself
        # (a tree) ends.
        # (name, node, taken by `__init__`, without a default)
        self.fields: List[Tuple[str, _Node, bool, bool]] = []

    def dump(self, value: Any) -> Any:
        if not isinstance(value, self.kind):
            raise _Unfit(f"{_a(type(value).__name__)}, not {_a(self.kind.__name__)}")
        return {name: _at(name, node.dump, getattr(value, name)) for name, node, _, _ in self.fields}

    def load(self, value: Any) -> Any:
        if type(value) is not dict:
            raise _Unfit(f"a JSON {_KIND_OF.get(type(value), '?')}, not an object of {self.kind.__name__}'s fields")
        known = {name for name, _, _, _ in self.fields}
        extra = sorted(set(value) - known)
        if extra:
            raise _Unfit(f"{', '.join(map(repr, extra))} is not a field of {self.kind.__name__}")
        # A field added since with a default takes its default.
        missing = [name for name, _, _, required in self.fields if required and name not in value]
        if missing:
            raise _Unfit(f"the field {', '.join(map(repr, missing))} of {self.kind.__name__} is missing")
        arguments = {
            name: _at(name, node.load, value[name]) for name, node, init, _ in self.fields if init and name in value
        }
        try:
            return self.kind(**arguments)
        except Exception as err:
            raise _Unfit(f"{self.kind.__name__}(...) raised {err!r}") from err


class _Pydantic(_Node):
    """A pydantic v2 model: ``model_dump(mode="json", by_alias=True)``, and ``model_validate``
    back. By its aliases, which is what ``model_validate`` reads by default (a model with
    ``alias=`` would not read its field names back) and what a Rust struct renamed as the
    aliases writes; read by name too where pydantic can (2.11 and later), for a model whose
    aliases are for serialization only."""

    rebuilds = True

    def __init__(self, kind: type) -> None:
        self.kind = kind
        try:
            parameters = inspect.signature(kind.model_validate).parameters  # type: ignore[attr-defined]
        except (TypeError, ValueError):
            parameters = {}  # type: ignore[assignment]
        self.by_either: Dict[str, bool] = (
            {"by_alias": True, "by_name": True} if "by_name" in parameters and "by_alias" in parameters else {}
        )
        # A `RootModel` dumps to its root's JSON, whatever kind that is.
        self.kinds = _EVERY_KIND if getattr(kind, "__pydantic_root_model__", False) else frozenset(("object",))

    def dump(self, value: Any) -> Any:
        if not isinstance(value, self.kind):
            raise _Unfit(f"{_a(type(value).__name__)}, not {_a(self.kind.__name__)}")
        return value.model_dump(mode="json", by_alias=True)

    def load(self, value: Any) -> Any:
        try:
            return self.kind.model_validate(value, **self.by_either)  # type: ignore[attr-defined]
        except Exception as err:
            raise _Unfit(f"{self.kind.__name__}.model_validate raised {err}") from err


class _Enum(_Node):
    """An ``Enum``: its member's value."""

    rebuilds = True

    def __init__(self, kind: type) -> None:
        self.kind = kind
        self.kinds = frozenset(_KIND_OF[type(member.value)] for member in kind)  # type: ignore[attr-defined]

    def dump(self, value: Any) -> Any:
        if not isinstance(value, self.kind):
            raise _Unfit(f"{_a(type(value).__name__)}, not {_a(self.kind.__name__)}")
        return value.value

    def load(self, value: Any) -> Any:
        try:
            return self.kind(value)
        except ValueError:
            raise _Unfit(f"{value!r} is not a value of {self.kind.__name__}") from None


class _Custom(_Node):
    rebuilds = True

    def __init__(self, serializer: Serializer[Any]) -> None:
        self.serializer = serializer

    def dump(self, value: Any) -> Any:
        return self.serializer.dump(value)

    def load(self, value: Any) -> Any:
        try:
            return self.serializer.load(value)
        except Exception as err:
            raise _Unfit(f"the Serializer's load raised {err!r}") from err


def _at(where: Any, step: Callable[[Any], Any], value: Any) -> Any:
    """``step(value)``, an unfit value's reason prefixed with where it is (a field, an index)."""
    try:
        return step(value)
    except _Unfit as unfit:
        raise _Unfit(f"{where!s}: {unfit}") from unfit.__cause__


_PRIMITIVES: Dict[Any, Tuple[FrozenSet[str], Tuple[type, ...]]] = {
    str: (frozenset(("string",)), (str,)),
    int: (frozenset(("int",)), (int,)),
    # NaN and the infinities are stored as `null`, as serde_json writes them.
    float: (frozenset(("int", "float", "null")), (int, float)),
    bool: (frozenset(("bool",)), (bool,)),
}
_LISTS = (list, collections.abc.Sequence, collections.abc.MutableSequence, typing.List, typing.Sequence)
_DICTS = (dict, collections.abc.Mapping, collections.abc.MutableMapping, typing.Dict, typing.Mapping)


class _Builder:
    """Input: an annotation (and the module namespace its text is read in). Output: its
    ``_Node``, or a ``TypeError`` saying which part of it no serializer rebuilds."""

    def __init__(self, namespace: Mapping[str, Any]) -> None:
        self.namespace = namespace
        self.memo: Dict[Any, _Node] = {}

    def node(self, kind: Any, where: str) -> _Node:
        kind = resolve(kind, self.namespace)
        if kind is UNRESOLVED:
            raise TypeError(
                f"{where} names a type that cannot be resolved here (a class defined inside a function, or imported only for type checkers); define it at module level, or give result_serializer= explicitly"
            )
        if kind is Any or kind is object or isinstance(kind, typing.TypeVar) or kind is typing.NoReturn:
            return _Plain()
        if kind is None or kind is type(None):
            return _Plain(frozenset(("null",)), (type(None),), "None")
        supertype = getattr(kind, "__supertype__", None)
        if supertype is not None:  # a NewType
            return self.node(supertype, where)
        origin = typing.get_origin(kind)
        args = typing.get_args(kind)
        if origin is typing.Annotated:
            return self.node(args[0], where)
        if is_union(origin):
            return self.union(args, where)
        if origin is typing.Literal:
            if not all(type(value) in (str, int, bool, type(None)) for value in args):
                raise TypeError(f"{where}: a Literal of values other than str, int, bool or None")
            return _Literal(args)
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            values = [member.value for member in kind]
            if not all(type(value) in _KIND_OF and type(value) not in (list, dict) for value in values):
                raise TypeError(f"{where}: the values of {kind.__name__} are not all str, int, float, bool or None")
            return _Enum(kind)
        if kind in _PRIMITIVES:
            kinds, types = _PRIMITIVES[kind]
            return _Plain(kinds, types, kind.__name__)
        if kind in self.memo:
            return self.memo[kind]
        if is_dataclass_type(kind):
            return self.dataclass(kind, where)
        if is_pydantic_type(kind):
            return _Pydantic(kind)
        if is_pydantic_v1_type(kind):
            raise TypeError(f"{where}: {kind.__name__} is a pydantic v1 model; idempotask rebuilds pydantic v2 models (`pydantic.BaseModel`)")
        if isinstance(kind, type) and issubclass(kind, dict) and hasattr(kind, "__total__"):
            return _Dict(_Plain(), False)  # a TypedDict: a plain JSON object
        if origin is tuple or kind is tuple or kind is typing.Tuple:
            if not args or (len(args) == 2 and args[1] is Ellipsis):
                return _List(self.node(args[0] if args else Any, f"{where}[]"), as_tuple=True)
            return _Tuple([self.node(arg, f"{where}[{index}]") for index, arg in enumerate(args)])
        if origin in _LISTS or kind in _LISTS:
            return _List(self.node(args[0] if args else Any, f"{where}[]"), as_tuple=False)
        if origin in _DICTS or kind in _DICTS:
            key, value = args if args else (Any, Any)
            key = resolve(key, self.namespace)
            if key not in (str, int, Any):
                raise TypeError(f"{where}: dict keys of type {getattr(key, '__name__', key)!s} cannot be rebuilt from a JSON object's names; use str or int keys")
            return _Dict(self.node(value, f"{where}[]"), key is int)
        name = getattr(kind, "__qualname__", None) or repr(kind)
        raise TypeError(
            f"{where}: no serializer rebuilds {name}; return a dataclass, a pydantic model or JSON values (str, int, float, bool, None, list, dict), or give result_serializer=Serializer(dump=..., load=...)"
        )

    def union(self, args: Tuple[Any, ...], where: str) -> _Node:
        members = [self.node(arg, where) for arg in args]
        for index, member in enumerate(members):
            for other in members[index + 1:]:
                shared = member.kinds & other.kinds
                if shared and (member.rebuilds or other.rebuilds):
                    raise TypeError(
                        f"{where}: the union's members {_name(member)} and {_name(other)} both take a JSON {sorted(shared)[0]}, so a stored one could not tell which to rebuild; give result_serializer=Serializer(dump=..., load=...)"
                    )
        return _Union(members)

    def dataclass(self, kind: type, where: str) -> _Node:
        node = _Dataclass(kind)
        self.memo[kind] = node
        types = field_types(kind) or {}
        fields = {field.name: field for field in dataclasses.fields(kind)}
        for name, annotation in types.items():
            if annotation is UNRESOLVED:
                raise TypeError(
                    f"{where}: the field `{name}` of {kind.__name__} names a type that cannot be resolved (a class defined inside a function, or imported only for type checkers); define it at module level"
                )
            field = fields[name]
            required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
            node.fields.append((name, self.node(annotation, f"{kind.__name__}.{name}"), field.init, field.init and required))
        return node


def _name(node: _Node) -> str:
    kind = getattr(node, "kind", None)
    return kind.__name__ if isinstance(kind, type) else type(node).__name__.strip("_").lower()


class ResultCodec:
    """A task's results: ``encode`` (the body's value -> the marker's JSON text) and
    ``decode`` (a stored text -> the duplicate's value, or a ``CodecError``)."""

    def __init__(self, node: _Node, what: str) -> None:
        self.node = node
        self.what = what
        self.rebuilds = node.rebuilds

    def encode(self, value: Any) -> str:
        """The JSON text of the body's value; a ``TypeError`` or ``ValueError`` when it has none
        (the unit is then recorded as unstorable)."""
        if not self.rebuilds:
            return encode_json(value)
        try:
            return encode_json(self.node.dump(value))
        except _Unfit as unfit:
            raise UnfitResult(f"the result does not fit {self.what}: {unfit}") from None

    def decode(self, text: str, task: str, step: Optional[str] = None) -> Any:
        """The value a duplicate returns for the stored ``text`` (or a rerun, for the recorded
        value of the step ``step``)."""
        value = json.loads(text)
        if not self.rebuilds:
            return value
        try:
            return self.node.load(value)
        except _Unfit as unfit:
            where, what, runs = f"task {task!r}", "the stored result", "the body does not run again"
            if step is not None:
                where, what, runs = f"task {task!r}, step `{step}`", "the recorded value", "the step does not run again"
            error = _native.CodecError(
                f"{where}: {what} does not fit {self.what} (was it stored by a version with another type?): {unfit}; {runs} until the unit is forgotten (`idempotask forget`) or its result expires"
            )
            error.kind = "undecodable"
            raise error from unfit.__cause__


_PLAIN = ResultCodec(_Plain(), "Any")


def result_codec(function: Callable[..., Any], serializer: Any, qualname: str) -> ResultCodec:
    """The codec of ``function``'s results: ``serializer`` when given (a ``Serializer``, or a
    type read as a return annotation), else its return annotation; a ``TypeError`` naming what
    no serializer rebuilds."""
    namespace = getattr(function, "__globals__", {})
    if isinstance(serializer, Serializer):
        return ResultCodec(_Custom(serializer), "the task's Serializer")
    if serializer is not None:
        if callable(serializer) and not isinstance(serializer, type) and typing.get_origin(serializer) is None:
            raise TypeError(
                f"{qualname}: result_serializer must be a Serializer(dump=..., load=...) or a type like Order, not the function {getattr(serializer, '__qualname__', serializer)!s}"
            )
        annotation, what = serializer, "result_serializer"
    else:
        annotation = getattr(function, "__annotations__", {}).get("return", Any)
        what = "the return annotation"
    shown = annotation if isinstance(annotation, str) else _shown(annotation)
    what = f"{what} `{shown}`"
    try:
        node = _Builder(namespace).node(annotation, what)
    except TypeError as err:
        raise TypeError(f"{qualname}: {err}") from None
    if not node.rebuilds:
        return _PLAIN
    return ResultCodec(node, what)


def _shown(annotation: Any) -> str:
    """``Order`` for a class, ``List[Order]`` (as typing writes it) for the rest."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")
