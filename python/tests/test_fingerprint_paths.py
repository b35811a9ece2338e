"""Fingerprint paths (#55): ``fingerprint=["order.amount", "currency"]`` fingerprints a field of
an argument (a dict's key, a dataclass's or a pydantic model's field) as the Rust attribute's
``fingerprint = [order.amount, currency]`` does: the JSON list of the selected values, in the
listed order. A dataclass or pydantic argument is fingerprinted as the JSON object of its
fields. A path that names no field is refused when the decorator is applied where the
annotation tells, and when called otherwise; a changed value under a reused key is
``KeyReuse``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import pydantic
import pytest

from idempotask import CodecError, KeyReuse, MemoryStore, _native, idempotent_task


@dataclass
class Order:
    id: int
    amount: int
    sku: str


class OrderModel(pydantic.BaseModel):
    id: int
    amount: int
    sku: str


@dataclass
class Shipment:
    order: Order
    carrier: str


def _charge(name: str, store: Any, ran: List[Any]) -> Any:
    @idempotent_task(key="order-{order_id}", name=name, store=store, fingerprint=["order.amount", "currency"])
    def charge(order_id: int, order: Any, currency: str) -> str:
        ran.append(order_id)
        return "ch"

    return charge


@pytest.mark.parametrize(
    "order",
    [
        pytest.param({"id": 1, "amount": 1200, "sku": "x"}, id="dict"),
        pytest.param(Order(1, 1200, "x"), id="dataclass"),
        pytest.param(OrderModel(id=1, amount=1200, sku="x"), id="pydantic"),
    ],
)
def test_a_path_fingerprints_the_list_of_the_selected_values(name: str, order: Any) -> None:
    _, fingerprint = _charge(name, MemoryStore(), []).idempotask_unit(7, order, "EUR")
    # What Rust's `fingerprint = [order.amount, currency]` hashes: the tuple `(1200, "EUR")`.
    assert fingerprint == _native.fingerprint('[1200,"EUR"]')


def test_a_whole_dataclass_or_model_is_the_object_of_its_fields(name: str) -> None:
    @idempotent_task(key="ship-{carrier}", name=name, fingerprint=["shipment"])
    def ship(carrier: str, shipment: Any) -> None:
        pass

    fields = '[{"carrier":"dhl","order":{"amount":1200,"id":1,"sku":"x"}}]'
    as_dataclass = ship.idempotask_unit("dhl", Shipment(Order(1, 1200, "x"), "dhl"))[1]
    as_dict = ship.idempotask_unit("dhl", {"order": {"sku": "x", "id": 1, "amount": 1200}, "carrier": "dhl"})[1]
    as_model = ship.idempotask_unit("dhl", {"order": OrderModel(id=1, amount=1200, sku="x"), "carrier": "dhl"})[1]
    assert as_dataclass == as_dict == as_model == _native.fingerprint(fields)


def test_a_bare_name_is_unchanged(name: str) -> None:
    @idempotent_task(key="order-charge-{order_id}", name=name, fingerprint=["amount_cents"])
    def charge(order_id: int, amount_cents: int) -> str:
        return "ch"

    assert charge.idempotask_unit(42, 1200)[1] == _native.fingerprint("[1200]")


def test_a_changed_field_under_a_reused_key_is_key_reuse(any_store: Any, name: str) -> None:
    ran: List[int] = []
    charge = _charge(name, any_store, ran)
    assert charge(7, Order(7, 1200, "x"), "EUR") == "ch"
    # A field the fingerprint does not select may change; the listed ones may not.
    assert charge(7, Order(7, 1200, "another sku"), "EUR") == "ch"
    with pytest.raises(KeyReuse):
        charge(7, Order(7, 1300, "x"), "EUR")
    with pytest.raises(KeyReuse):
        charge(7, Order(7, 1200, "x"), "USD")
    assert ran == [7]


def test_a_changed_dataclass_argument_is_key_reuse(any_store: Any, name: str) -> None:
    ran: List[str] = []

    @idempotent_task(key="ship-{carrier}", name=name, store=any_store, fingerprint=["shipment"])
    def ship(carrier: str, shipment: Shipment) -> str:
        ran.append(carrier)
        return "sent"

    ship("dhl", Shipment(Order(1, 1200, "x"), "dhl"))
    assert ship("dhl", Shipment(Order(1, 1200, "x"), "dhl")) == "sent"
    with pytest.raises(KeyReuse):
        ship("dhl", Shipment(Order(1, 1200, "y"), "dhl"))
    assert ran == ["dhl"]


def test_a_path_into_a_key_parameter_fingerprints_its_other_fields(any_store: Any, name: str) -> None:
    # Powertools' event_key_jmespath and payload_validation_jmespath on one event.
    @idempotent_task(key="order-{order.id}", name=name, store=any_store, fingerprint=["order.amount"])
    def charge(order: Order) -> str:
        return f"ch_{order.id}"

    assert charge(Order(1, 1200, "x")) == "ch_1"
    with pytest.raises(KeyReuse):
        charge(Order(1, 900, "x"))


@pytest.mark.parametrize(
    "fingerprint, message",
    [
        pytest.param(["order.amout"], "`order.amout`: Order has no field `amout`; did you mean `order.amount`?", id="dataclass"),
        pytest.param(["model.amout"], "`model.amout`: OrderModel has no field `amout`", id="pydantic"),
        pytest.param(["maybe.skk"], "`maybe.skk`: Order has no field `skk`", id="through_optional"),
        pytest.param(["maybe.sku.x"], "`maybe.sku` is a str, which has no field `x`", id="into_a_str"),
        pytest.param(["shipment.order.ammount"], "Order has no field `ammount`; did you mean `shipment.order.amount`?", id="nested"),
        pytest.param(["order_id"], "`order_id` is part of the key", id="a_key_parameter"),
        pytest.param(["order.sku", "orders.amount"], "`orders` is not a parameter of this function; did you mean `order`?", id="no_parameter"),
        pytest.param(["order..amount"], "is not a parameter or a path of fields in one", id="empty_part"),
        pytest.param(["order[0]"], "is not a parameter or a path of fields in one", id="an_index"),
        pytest.param([3], "is not a parameter name or a path", id="not_text"),
    ],
)
def test_a_path_that_names_no_field_is_refused_when_decorated(name: str, fingerprint: Any, message: str) -> None:
    def charge(order_id: int, order: Order, model: OrderModel, maybe: Optional[Order], shipment: Shipment) -> str:
        return "ch"

    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("?", r"\?").replace("[", r"\[")):
        idempotent_task(key="order-{order_id}", name=name, fingerprint=fingerprint)(charge)


def test_a_path_listed_twice_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="`order.amount` is listed twice in the fingerprint"):

        @idempotent_task(key="order-{order_id}", name=name, fingerprint=["order.amount", "currency", "order.amount"])
        def charge(order_id: int, order: Order, currency: str) -> str:
            return "ch"


@pytest.mark.parametrize(
    "order, message",
    [
        pytest.param({"id": 1, "sku": "x"}, "at `order`, the dict has no key `amount`", id="dict_without_the_key"),
        pytest.param(None, "at `order`, it is None", id="none"),
        pytest.param(OrderModel(id=1, amount=1, sku="x"), None, id="a_model_passes"),
        pytest.param("text", "at `order`, a str has no attribute `amount`", id="no_attribute"),
    ],
)
def test_a_path_the_annotation_cannot_check_is_refused_when_called(name: str, order: Any, message: Optional[str]) -> None:
    ran: List[Any] = []
    charge = _charge(name, MemoryStore(), ran)
    if message is None:
        assert charge(1, order, "EUR") == "ch"
        return
    with pytest.raises(CodecError, match=message) as refused:
        charge(1, order, "EUR")
    assert refused.value.kind == "fingerprint"
    assert "fingerprint path `order.amount`" in str(refused.value)
    assert ran == []


def test_fingerprint_true_takes_dataclass_arguments_through_their_fields(name: str) -> None:
    @idempotent_task(key="order-{order_id}", name=name, fingerprint=True)
    def charge(order_id: int, order: Order, extra: Dict[str, Any]) -> str:
        return "ch"

    _, fingerprint = charge.idempotask_unit(1, Order(1, 5, "x"), {"a": 1})
    assert fingerprint == _native.fingerprint('[{"id":1,"amount":5,"sku":"x"},{"a":1}]')
