"""The application's expressions as boto3's ``Table`` takes them, made ready for the shim.

* condition objects (``Attr("x").not_exists()``, ``Key("k").eq(v)``) become text, names and
  values through boto3's own ``ConditionExpressionBuilder``, as boto3's Table does
  (``#n0`` / ``:v0`` placeholders, merged with the app's own: :func:`app_expressions`,
  :func:`expression_text`);
* placeholders ``#rs_*`` / ``:rs_*`` are reserved for the shim (``expr.check_placeholders``);
* what a read returns of an evaluated logical item -- ``FilterExpression``,
  ``ProjectionExpression``, ``Select`` -- is one function (:func:`read_post`);
* a condition's parts over key fields (which the stored item may lack) and over values
  alone are decided from the request's key (:meth:`AppExpressions._decided`, with
  ``expr.decide_key_fields``).

How the shim rewrites the app's expressions for the physical table (the tombstone-aware
condition, the merged UpdateExpression) is ``expr.py``; what a request answers is
``returns.py``. The module map is in ``reshard/shim/__init__.py``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from boto3.dynamodb.conditions import ConditionBase, ConditionExpressionBuilder

from reshard import errors
from reshard.aws.dynamo import from_wire, to_wire
from reshard.core import expressions
from reshard.shim.expr import check_placeholders, decide_key_fields


def merge_placeholders(into: dict, built: Mapping[str, Any], what: str) -> None:
    for k, v in built.items():
        if k in into and into[k] != v:
            raise errors.BadInput(f"{what} {k}: used by the app and by its boto3 condition object with "
                                  "different meanings; rename the app's placeholder")
        into[k] = v


def app_names_values(names: Mapping | None, values: Mapping | None) -> tuple[dict, dict]:
    check_placeholders(names, values)
    return dict(names or {}), to_wire(dict(values)) if values else {}


def app_expressions(condition: Any, names: Mapping | None,
                    values: Mapping | None) -> tuple[str | None, dict, dict]:
    """(condition text, wire names, wire values) of the app's request.

    A boto3 condition object (``Attr("x").not_exists()``) becomes text, names and
    values through boto3's own ``ConditionExpressionBuilder``, as boto3's Table does
    (``#n0`` / ``:v0`` placeholders, merged with the app's own).
    """
    names, values = dict(names or {}), dict(values or {})
    if isinstance(condition, ConditionBase):
        built = ConditionExpressionBuilder().build_expression(condition, is_key_condition=False)
        condition = built.condition_expression
        merge_placeholders(names, built.attribute_name_placeholders, "ExpressionAttributeNames")
        merge_placeholders(values, built.attribute_value_placeholders, "ExpressionAttributeValues")
    elif condition is not None and not isinstance(condition, str):
        raise errors.BadInput(f"ConditionExpression must be a string or a boto3 condition "
                              f"(boto3.dynamodb.conditions.Attr/Key), not {type(condition).__name__}")
    app_names, app_values = app_names_values(names, values)
    return condition, app_names, app_values


def expression_text(builder: ConditionExpressionBuilder, expression: Any, names: dict, values: dict, is_key: bool,
                    what: str) -> str | None:
    """The text of an expression given as text or as a boto3 condition object (its names
    and values merged into ``names`` / ``values``)."""
    if expression is None or isinstance(expression, str):
        return expression
    if not isinstance(expression, ConditionBase):
        raise errors.BadInput(f"{what} must be a string or a boto3 condition (boto3.dynamodb.conditions), "
                              f"not {type(expression).__name__}")
    built = builder.build_expression(expression, is_key_condition=is_key)
    merge_placeholders(names, built.attribute_name_placeholders, "ExpressionAttributeNames")
    merge_placeholders(values, built.attribute_value_placeholders, "ExpressionAttributeValues")
    return built.condition_expression


def read_post(filt: str | None, projection: str | None, select: str | None,
              ctx: "expressions.Context", index: bool = False) -> Callable[[dict], dict | None] | None:
    """What a read returns for an evaluated application item: filtered, projected (None: dropped)."""
    if index and select == "ALL_PROJECTED_ATTRIBUTES":
        if projection:
            raise errors.BadInput("Cannot specify the ProjectionExpression when choosing to get "
                                  "ALL_PROJECTED_ATTRIBUTES")
        select = None
    if select not in (None, "ALL_ATTRIBUTES", "COUNT", "SPECIFIC_ATTRIBUTES"):
        raise errors.BadInput(f"Select {select!r}: ALL_PROJECTED_ATTRIBUTES needs an index (IndexName is not "
                              "supported yet); use ALL_ATTRIBUTES, SPECIFIC_ATTRIBUTES or COUNT")
    if select == "ALL_ATTRIBUTES" and projection:
        raise errors.BadInput("Cannot specify the ProjectionExpression when choosing to get ALL_ATTRIBUTES")
    if select == "SPECIFIC_ATTRIBUTES" and not projection:
        raise errors.BadInput("Select SPECIFIC_ATTRIBUTES needs a ProjectionExpression")
    node = expressions.parse_condition(filt, ctx, "FilterExpression") if filt else None
    paths = expressions.parse_projection(projection, ctx) if projection else None
    if node is None and paths is None:
        return None

    def post(item: dict) -> dict | None:
        wire = to_wire(item)
        if node is not None and not expressions.evaluate(node, wire):
            return None
        return from_wire(expressions.project(wire, paths)) if paths is not None else item
    return post


class AppExpressions:
    """The app's conditions decided where the shim knows more than DynamoDB would: a mixin of
    :class:`~reshard.shim.table.ShardedTable` (which sets ``_key_fields`` and ``mapper``)."""

    def _decided(self, condition: str | None, names: dict, values: dict, key_wire: Mapping[str, Any],
                 elsewhere: str | None = None) -> tuple[str | None, dict, dict]:
        """The app's condition with its parts over key fields (maybe kept only inside the
        physical keys: not stored on the item) decided from the request's key
        (``expr.decide_key_fields``): DynamoDB would find such a field missing."""
        key = {f: key_wire[f] for f in self._key_fields if f in key_wire}
        return decide_key_fields(condition, names, values, key, self.mapper.keys.partition, elsewhere or "")
