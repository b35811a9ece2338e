"""Result serializers (#55): a dataclass, a pydantic v2 model or a custom-serialized result
replays as its type, equal to the first; the stored JSON is what a Rust task of the same name
reads; what no serializer can rebuild is refused when the decorator is applied; a stored result
that no longer fits the type is a ``CodecError`` of kind ``undecodable``, and the body does not
run again."""

from __future__ import annotations

import asyncio
import enum
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Dict, List, Optional, Tuple, Union

import pydantic
import pytest
import redis

from idempotask import CodecError, MemoryStore, Serializer, _native, idempotent_task


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int


@dataclass
class Receipt:
    order_id: int
    total: float
    lines: List[Line]
    note: Optional[str] = None


@dataclass
class Node:
    """A dataclass that holds itself: its serializer must end."""

    name: str
    children: List[Node] = field(default_factory=list)


class Invoice(pydantic.BaseModel):
    number: str
    issued: datetime
    lines: List[Line]
    amount: Decimal


class Status(enum.Enum):
    PAID = "paid"
    REFUNDED = "refunded"


class Money:
    """A type no serializer knows: it needs its own."""

    def __init__(self, cents: int, currency: str) -> None:
        self.cents = cents
        self.currency = currency

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Money) and (self.cents, self.currency) == (other.cents, other.currency)


MONEY = Serializer(dump=lambda money: {"cents": money.cents, "currency": money.currency}, load=lambda value: Money(**value))


def _stored(redis_client: redis.Redis, name: str) -> str:
    """The result text of the task's one marker on Redis."""
    (redis_key,) = redis_client.keys(f"idempotask:v2:default:{name}:*")
    _, _, _, result = _native.decode_marker(redis_client.get(redis_key))
    return result


def test_a_dataclass_replays_as_its_type(any_store: Any, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="receipt-{order_id}", name=name, store=any_store)
    def receipt(order_id: int) -> Receipt:
        ran.append(order_id)
        return Receipt(order_id, 12.5, [Line("A-1", 2), Line("B", 1)])

    first = receipt(7)
    again = receipt(7)
    assert type(again) is Receipt and again == first
    assert type(again.lines[0]) is Line
    assert ran == [7]


def test_a_dataclass_is_stored_as_the_json_object_rust_reads(store: Any, redis_client: redis.Redis, name: str) -> None:
    @idempotent_task(key="receipt-{order_id}", name=name)
    def receipt(order_id: int) -> Receipt:
        return Receipt(order_id, 12.5, [Line("A-1", 2)])

    receipt(7)
    # serde's derive writes a struct as this object, and reads it back.
    assert _stored(redis_client, name) == '{"order_id":7,"total":12.5,"lines":[{"sku":"A-1","quantity":2}],"note":null}'


def test_a_pydantic_model_replays_as_its_type_from_its_json_dump(
    store: Any, redis_client: redis.Redis, name: str
) -> None:
    ran: List[str] = []
    issued = datetime(2026, 12, 6, 9, 30, tzinfo=timezone.utc)

    @idempotent_task(key="invoice-{number}", name=name)
    def invoice(number: str) -> Invoice:
        ran.append(number)
        return Invoice(number=number, issued=issued, lines=[Line("A-1", 2)], amount=Decimal("24.90"))

    first = invoice("F-1")
    again = invoice("F-1")
    assert type(again) is Invoice and again == first
    assert ran == ["F-1"]
    assert json.loads(_stored(redis_client, name)) == first.model_dump(mode="json")


class Payment(pydantic.BaseModel):
    """A model whose fields have other names on the wire, as a Rust struct's `serde(rename)`."""

    payment_id: str = pydantic.Field(alias="paymentId")
    amount_cents: int = pydantic.Field(alias="amountCents")


def test_a_pydantic_model_with_aliases_replays_and_is_stored_by_its_aliases(
    store: Any, redis_client: redis.Redis, name: str
) -> None:
    ran: List[str] = []

    @idempotent_task(key="payment-{payment_id}", name=name)
    def pay(payment_id: str) -> Payment:
        ran.append(payment_id)
        return Payment(paymentId=payment_id, amountCents=1200)

    first = pay("p-1")
    again = pay("p-1")
    assert type(again) is Payment and again == first
    assert ran == ["p-1"]
    # What `model_validate` reads back, and what a Rust struct renamed as the aliases writes.
    assert _stored(redis_client, name) == '{"paymentId":"p-1","amountCents":1200}'


def test_a_custom_serializer_replays_as_its_type(any_store: Any, name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="price-{order_id}", name=name, store=any_store, result_serializer=MONEY)
    def price(order_id: int) -> Money:
        ran.append(order_id)
        return Money(1999, "EUR")

    assert price(1) == price(1) == Money(1999, "EUR")
    assert type(price(1)) is Money
    assert ran == [1]


@pytest.mark.parametrize(
    "annotation, value",
    [
        pytest.param(Optional[Receipt], Receipt(1, 2.0, []), id="optional_dataclass"),
        pytest.param(Optional[Receipt], None, id="optional_none"),
        pytest.param(List[Invoice], [Invoice(number="F", issued=datetime(2026, 1, 1), lines=[], amount=Decimal(1))], id="list_of_models"),
        pytest.param(Tuple[str, int], ("ch", 3), id="tuple"),
        pytest.param(Tuple[Line, ...], (Line("A", 1), Line("B", 2)), id="tuple_of_dataclasses"),
        pytest.param(Dict[int, Line], {1: Line("A", 1)}, id="int_keys"),
        pytest.param(Status, Status.REFUNDED, id="enum"),
        pytest.param(Union[Line, str], "no line", id="union_of_a_dataclass_and_a_str"),
        pytest.param(Union[Line, str], Line("A", 1), id="union_taking_the_dataclass"),
        pytest.param(Node, Node("root", [Node("leaf")]), id="recursive_dataclass"),
        pytest.param(Money, Money(5, "USD"), id="explicit_serializer_over_annotation"),
    ],
)
def test_a_composite_type_replays_as_its_type(any_store: Any, name: str, annotation: Any, value: Any) -> None:
    ran: List[int] = []

    def body(n: int) -> Any:
        ran.append(n)
        return value

    body.__annotations__["return"] = annotation
    serializer = MONEY if annotation is Money else None
    task = idempotent_task(key="v-{n}", name=name, store=any_store, result_serializer=serializer)(body)
    assert task(1) is value
    again = task(1)
    assert again == value and type(again) is type(value)
    assert ran == [1]


def test_an_async_task_replays_a_dataclass(any_store: Any, name: str) -> None:
    @idempotent_task(key="line-{sku}", name=name, store=any_store)
    async def line(sku: str) -> Line:
        return Line(sku, 1)

    async def twice() -> Tuple[Line, Line]:
        return await line("A"), await line("A")

    first, again = asyncio.run(twice())
    assert again == first == Line("A", 1)


def test_result_serializer_takes_a_type_where_the_annotation_is_missing(name: str) -> None:
    @idempotent_task(key="line-{sku}", name=name, store=MemoryStore(), result_serializer=Line)
    def line(sku):  # type: ignore[no-untyped-def]
        return Line(sku, 1)

    line("A")
    assert line("A") == Line("A", 1)


def test_a_plain_json_annotation_keeps_the_values_json_gives(name: str) -> None:
    @idempotent_task(key="totals-{day}", name=name, store=MemoryStore())
    def totals(day: str) -> Dict[str, Any]:
        return {"count": 2, "by_sku": {"A": (1, 2)}}

    totals("d")
    # No type to rebuild: the duplicate gets `json.loads` of the stored text, as it always did.
    assert totals("d") == {"count": 2, "by_sku": {"A": [1, 2]}}


class _Opaque:
    pass


@pytest.mark.parametrize(
    "annotation, message",
    [
        pytest.param(datetime, "no serializer rebuilds datetime", id="datetime"),
        pytest.param(_Opaque, "no serializer rebuilds _Opaque", id="plain_class"),
        pytest.param(List[_Opaque], "no serializer rebuilds _Opaque", id="inside_a_list"),
        pytest.param(Dict[Tuple[int, int], str], "dict keys of type", id="tuple_keys"),
        pytest.param(Union[Line, Receipt], "both take a JSON object", id="ambiguous_union"),
        pytest.param(Union[Line, Dict[str, Any]], "both take a JSON object", id="dataclass_or_dict"),
        pytest.param("Undefined", "cannot be resolved", id="unresolvable_text"),
    ],
)
def test_a_return_annotation_no_serializer_rebuilds_is_refused_when_decorated(name: str, annotation: Any, message: str) -> None:
    def body(n: int) -> Any:
        return None

    body.__annotations__["return"] = annotation
    with pytest.raises(TypeError, match=message) as refused:
        idempotent_task(key="v-{n}", name=name)(body)
    assert "body" in str(refused.value)  # names the function
    # Refused before the name was taken: a fixed task can have it.
    body.__annotations__["return"] = Any
    idempotent_task(key="v-{n}", name=name)(body)


def test_a_field_of_a_type_no_serializer_rebuilds_is_refused_when_decorated(name: str) -> None:
    @dataclass
    class Shipment:
        sent: datetime

    with pytest.raises(TypeError, match="Shipment.sent: no serializer rebuilds datetime"):

        @idempotent_task(key="ship-{n}", name=name, result_serializer=Shipment)
        def ship(n: int) -> Shipment:
            return Shipment(datetime.now())


def test_a_class_local_to_a_function_is_refused_with_how_to_fix_it(name: str) -> None:
    # Under `from __future__ import annotations` the annotation is the text "Parcel", which
    # the module does not define.
    @dataclass
    class Parcel:
        weight: int

    with pytest.raises(TypeError, match="cannot be resolved.*define it at module level, or give result_serializer="):

        @idempotent_task(key="parcel-{n}", name=name)
        def parcel(n: int) -> Parcel:
            return Parcel(n)

    # The way out it names.
    @idempotent_task(key="parcel-{n}", name=name, store=MemoryStore(), result_serializer=Parcel)
    def parcel_fixed(n: int) -> Parcel:
        return Parcel(n)

    parcel_fixed(3)
    assert parcel_fixed(3) == Parcel(3)


@pytest.mark.parametrize(
    "serializer, message",
    [
        pytest.param(len, "must be a Serializer", id="a_function"),
        pytest.param(datetime, "no serializer rebuilds datetime", id="a_type_it_cannot_rebuild"),
    ],
)
def test_a_result_serializer_that_cannot_work_is_refused_when_decorated(name: str, serializer: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message):

        @idempotent_task(key="v-{n}", name=name, result_serializer=serializer)
        def body(n: int) -> Any:
            return n


def test_a_serializer_of_no_functions_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Serializer\(load=...\) must be a function"):
        Serializer(dump=str, load="Decimal")  # type: ignore[arg-type]


@dataclass
class OrderV1:
    order_id: int
    amount: int


@dataclass
class OrderV2:
    order_id: int
    amount_cents: int
    currency: str = "EUR"


def _deploy(name: str, store: Any, ran: List[Any], value: Any, annotation: Any) -> Any:
    """One deploy of the task `name`: its body returns `value`, its result is read as
    `annotation` (a `Serializer` or a type). Every deploy is the same function, as a new
    version of one module in a new process is."""

    def make(n: int) -> Any:
        ran.append(n)
        return value

    return idempotent_task(key="v-{n}", name=name, store=store, result_serializer=annotation)(make)


def test_a_stored_result_of_another_type_is_undecodable_and_the_body_does_not_run_again(any_store: Any, name: str) -> None:
    ran: List[int] = []
    assert _deploy(name, any_store, ran, OrderV1(1, 1200), OrderV1)(1) == OrderV1(1, 1200)
    with pytest.raises(CodecError) as refused:
        _deploy(name, any_store, ran, OrderV2(1, 1200), OrderV2)(1)
    assert refused.value.kind == "undecodable"
    assert "'amount' is not a field of OrderV2" in str(refused.value)
    assert ran == [1]


@dataclass
class OrderV0:
    order_id: int
    amount_cents: int


def test_a_field_added_with_a_default_reads_an_older_result(any_store: Any, name: str) -> None:
    ran: List[int] = []
    _deploy(name, any_store, ran, OrderV0(1, 1200), OrderV0)(1)
    assert _deploy(name, any_store, ran, OrderV2(1, 5), OrderV2)(1) == OrderV2(1, 1200, "EUR")
    assert ran == [1]


@pytest.mark.parametrize(
    "stored, annotation",
    [
        pytest.param("ch_1", Line, id="a_str_for_a_dataclass"),
        pytest.param({"sku": "A", "quantity": "two"}, Line, id="a_field_of_another_type"),
        pytest.param({"number": "F"}, Invoice, id="a_model_missing_fields"),
        pytest.param("cancelled", Status, id="not_a_value_of_the_enum"),
        pytest.param({"cents": 1}, MONEY, id="a_custom_load_that_raises"),
    ],
)
def test_a_stored_value_that_does_not_fit_is_undecodable(name: str, stored: Any, annotation: Any) -> None:
    memory = MemoryStore()
    ran: List[int] = []
    _deploy(name, memory, ran, stored, Any)(1)
    with pytest.raises(CodecError) as refused:
        _deploy(name, memory, ran, None, annotation)(1)
    assert refused.value.kind == "undecodable"
    assert ran == [1]


def test_a_result_that_does_not_fit_its_annotation_is_unstorable_for_duplicates(name: str) -> None:
    ran: List[int] = []

    @idempotent_task(key="line-{n}", name=name, store=MemoryStore())
    def line(n: int) -> Line:
        ran.append(n)
        return {"sku": "A", "quantity": n}  # type: ignore[return-value]

    # The first caller gets its own value; no duplicate could rebuild it as a Line.
    assert line(1) == {"sku": "A", "quantity": 1}
    with pytest.raises(CodecError) as refused:
        line(1)
    assert refused.value.kind == "unstorable"
    assert "does not fit the return annotation `Line`" in str(refused.value)
    assert ran == [1]
