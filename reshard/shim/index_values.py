"""The value a write gives a sharded GSI's partition attribute (``[index.NAME]`` migrations).

Part of the write protocol (``writes.py`` calls it): a put gives the GSI attribute of an
item in the index the value of the layout the phase writes (:func:`write_value`); an update
that writes a field the value is computed from sets the value in its own request
(:func:`update_effect`, :func:`index_update_plan`, :func:`index_actions`: conditioned on the
fields it read being as read, :func:`read_changed`); any other update is fixed up afterwards
(``WriteProtocol._fix_index_values``). Reading the index is ``index.py``; which layouts a
phase reads and writes, ``routing.index_routing``.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from reshard import errors
from reshard.core.index import IndexMapper
from reshard.core.wire import still_as_read
from reshard.shim.errors import ShimValidationError
from reshard.shim.expr import split_top, top_attribute


def write_value(im: IndexMapper, item: Mapping[str, Any], side: str, identity: str) -> dict | None:
    """The GSI partition value a write gives ``item`` (wire) in layout ``side``: None to keep
    what it has.

    Only an item that carries the attribute and the GSI sort attribute is in the index
    (``IndexMapper.in_index``; the application decides which items are: a sparse index, like
    the invoice article's header rows); any other item is left as written, as the backfill
    leaves it. A value that ``side`` already gives this item is kept (for a random
    layout: any shard in range, so the application's own random pick is not moved again);
    any other is replaced by the computed one. A random layout's value is drawn from the
    item's identity, so rewriting one item never moves it between old partitions.
    """
    if not im.in_index(item):
        return None
    try:
        if im.is_at(item, side):
            return None
        fields = im.fields(item, side)
    except errors.UnmappableItem as e:
        raise errors.BadInput(f"{e.detail}: an item carrying {im.attr!r} is in the index, and the shim computes "
                              "that attribute from these fields") from None
    return im.value(fields, side, random.Random(identity))


# --------------------------------------------------------------------------- updates

@dataclass(frozen=True)
class UpdateEffect:
    """What an UpdateExpression does to top-level attributes, as far as it can be told
    without the item: ``literals`` (``SET a = :v``: attribute -> its value placeholder),
    ``removed`` (``REMOVE a``), ``other`` (attribute -> the action the shim cannot evaluate
    beforehand: ``ADD``, ``DELETE``, arithmetic, ``if_not_exists``, ``list_append``, a
    path copy, a nested path)."""

    literals: dict[str, str]
    removed: frozenset[str]
    other: dict[str, str]

    @property
    def touched(self) -> set[str]:
        return set(self.literals) | set(self.removed) | set(self.other)


_LITERAL = re.compile(r":[A-Za-z0-9_]+")


def update_effect(clauses: Mapping[str, str], names: Mapping[str, str] | None) -> UpdateEffect:
    """The :class:`UpdateEffect` of an update split by ``expr.split_clauses``."""
    literals: dict[str, str] = {}
    removed: set[str] = set()
    other: dict[str, str] = {}
    for keyword, body in clauses.items():
        for action in split_top(body):
            target, _, operand = action.partition("=") if keyword == "SET" else (action.split(None, 1)[0], "", "")
            attr, whole = top_attribute(target, names)
            if keyword == "SET" and whole and _LITERAL.fullmatch(operand.strip()):
                literals[attr] = operand.strip()
            elif keyword == "REMOVE" and whole:
                removed.add(attr)
            else:
                other[attr] = f"{keyword} {action}"
    return UpdateEffect(literals, frozenset(removed), other)


@dataclass(frozen=True)
class IndexUpdate:
    """An update that changes what a sharded GSI value is computed from: the value goes into
    the same UpdateItem (:func:`index_update_plan`, :func:`index_actions`)."""

    #: The indexes whose value the update may change, and the layout side shims write.
    indexes: tuple[IndexMapper, ...]
    side: str
    effect: UpdateEffect
    #: Attributes to read first (consistent GetItem): needed, and neither set by the update nor key fields.
    reads: tuple[str, ...]


def index_update_plan(indexes: Sequence[IndexMapper], side: str, effect: UpdateEffect,
                      known: Mapping[str, Any]) -> IndexUpdate | None:
    """Whether an update must set GSI values in its own request, and what it must read first.

    An update touches index ``im`` when it writes the GSI attribute, its sort attribute (index
    membership), or a field either layout computes the value from (an item still at the other
    layout's value moved with its fields). None: it touches no index; the follow-up of
    ``ShardedTable._fix_index_values`` is then only a move between layouts, harmless if cut off.
    ``known``: the key fields (wire) from ``Key``, which an update cannot change.

    Refused (one ShimValidationError line): an action the shim cannot evaluate beforehand on
    the GSI attribute or a field of the written layout (``ADD``, arithmetic, ``if_not_exists``,
    ``list_append``, a nested path): the value would be computed from a guess.
    """
    hit = []
    for im in indexes:
        sort = {im.sort_attr} if im.sort_attr else set()
        if effect.touched & (set(im.fields_needed) | {im.attr} | sort):
            hit.append(im)
    if not hit:
        return None
    reads: list[str] = []
    for im in hit:
        exact = set(im.layout(side).needed_fields) | {im.attr}
        for attr, action in effect.other.items():
            if attr in exact:
                what = "is set by the shim" if attr == im.attr else f"is computed from {attr!r}"
                raise ShimValidationError(
                    f"UpdateExpression action {action!r}: index {im.name}'s {im.attr!r} {what}, and "
                    f"the shim sets it in the same request, so it must know the result beforehand; write "
                    f"{attr!r} with a literal value (SET {attr} = :value, read it first if it depends on the stored "
                    f"one, with a ConditionExpression on that value)", "UpdateItem")
        for attr in (*im.layout(side).needed_fields, im.attr, *([im.sort_attr] if im.sort_attr else [])):
            if attr not in known and attr not in effect.literals and attr not in effect.removed \
                    and attr not in effect.other and attr not in reads:
                reads.append(attr)
    return IndexUpdate(tuple(hit), side, effect, tuple(reads))


#: A stand-in for an attribute an unevaluated action leaves present (only the GSI sort attribute:
#: the value does not depend on it, only whether the item is in the index).
_PRESENT = {"NULL": True}


def index_actions(plan: IndexUpdate, read: Mapping[str, Any], known: Mapping[str, Any], values: Mapping[str, Any],
                  update_text: str, condition_text: str | None, identity: str
                  ) -> tuple[list[str], dict, dict, str | None, dict]:
    """What to add to the update so it sets each touched GSI value itself, from ``read``
    (the plan's ``reads`` as a consistent GetItem returned them; absent ones absent).

    Returns ``(SET actions, names, values, condition, overrides)``: the condition holds while
    every attribute read is as read (a racing write of one makes the update fail; read again
    and retry); ``overrides`` replaces the value of the application's own ``SET G = :v``
    (its placeholder must be used there only, else the update is refused).
    """
    item = {k: v for k, v in read.items() if k in plan.reads}
    item.update(known)
    for attr in plan.effect.removed:
        item.pop(attr, None)
    for attr, placeholder in plan.effect.literals.items():
        if placeholder not in values:
            raise errors.BadInput(f"UpdateExpression uses {placeholder} but ExpressionAttributeValues does not "
                                  "define it")
        item[attr] = values[placeholder]
    for im in plan.indexes:
        if im.sort_attr in plan.effect.other:
            item[im.sort_attr] = _PRESENT
    sets: list[str] = []
    names: dict = {}
    vals: dict = {}
    overrides: dict = {}
    for n, im in enumerate(plan.indexes):
        gone = [f for f in im.layout(plan.side).needed_fields if f in plan.effect.removed]
        if gone and im.in_index(item):
            raise ShimValidationError(
                f"UpdateExpression removes {gone[0]!r}, which index {im.name}'s {im.attr!r} is computed from, and the "
                f"item stays in the index; SET {gone[0]} to a literal value instead, or REMOVE {im.attr} too (the "
                "item leaves the index)", "UpdateItem")
        value = write_value(im, item, plan.side, identity)
        if value is None:
            continue  # outside the index, or already at a value the side gives it
        own = plan.effect.literals.get(im.attr)
        if own is None:
            names[f"#rs_ig{n}"] = im.attr
            vals[f":rs_ig{n}"] = value
            sets.append(f"#rs_ig{n} = :rs_ig{n}")
            continue
        uses = len(re.findall(re.escape(own) + r"(?![A-Za-z0-9_])", update_text + " " + (condition_text or "")))
        if uses != 1:
            raise ShimValidationError(f"UpdateExpression sets index {im.name}'s {im.attr!r} to {own}, which the "
                                      "request uses elsewhere too; the shim replaces that value with the one the "
                                      f"migration's layout gives: give {im.attr!r} a placeholder of its own",
                                      "UpdateItem")
        overrides[own] = value
    cond = still_as_read(plan.reads, read, "rs_ix", names, vals)
    return sets, names, vals, " AND ".join(cond) or None, overrides


def read_changed(plan: IndexUpdate, before: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether an attribute the plan read differs between two reads (its condition failed)."""
    return any(before.get(a) != now.get(a) for a in plan.reads)
