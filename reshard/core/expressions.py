"""DynamoDB's condition and projection expressions, evaluated on wire-format items.

Pure module. The shim evaluates an application's ``FilterExpression`` and
``ProjectionExpression`` itself on the *logical* item it returns: the physical items it
reads include stale copies (the older layout's) and tombstones, and a filter applied by
DynamoDB to each physical item would let an older copy through where the newest one
fails the filter. Evaluating after the newest copy has been chosen is exact.

The grammar, DynamoDB's rules for missing operands and its error messages follow
DynamoDB (the same rules ``tests/model/expressions.py`` is checked against dynalite with;
this module started as a copy of its condition and projection half).

Grammar (precedence low to high: OR, AND, NOT, everything else)::

    condition  := disjunct (OR disjunct)*
    disjunct   := conjunct (AND conjunct)*
    conjunct   := NOT conjunct | primary
    primary    := '(' condition ')'
                | function '(' args ')'                 -- attribute_exists, begins_with, ...
                | operand comparator operand
                | operand BETWEEN operand AND operand
                | operand IN '(' operand (',' operand)* ')'
    operand    := path | ':value' | size '(' path ')'
    path       := name ('.' name | '[' digits ']')*     -- name: identifier or #placeholder
"""

from __future__ import annotations

import decimal
import re
from decimal import Decimal
from typing import Any

from reshard.errors import BadInput

# --------------------------------------------------------------------------- errors


class ExprError(BadInput):
    """A request DynamoDB would refuse with a ``ValidationException`` (the shim raises it as one).

    ``code`` and ``item`` serve the model checker's in-memory DynamoDB, which shares this
    module (``tests/model/expressions.py``) and answers with other codes too."""

    def __init__(self, message: str, code: str = "ValidationException"):
        super().__init__(message)
        self.message = message
        self.code = code
        self.item = None  # the item, for ReturnValuesOnConditionCheckFailure


# DynamoDB's reserved words (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ReservedWords.html,
# the same 573 words dynalite refuses): a bare attribute name may not be one of them.
RESERVED = frozenset("""
    ABORT ABSOLUTE ACTION ADD AFTER AGENT AGGREGATE ALL ALLOCATE ALTER ANALYZE AND ANY ARCHIVE ARE ARRAY AS ASC
    ASCII ASENSITIVE ASSERTION ASYMMETRIC AT ATOMIC ATTACH ATTRIBUTE AUTH AUTHORIZATION AUTHORIZE AUTO AVG BACK
    BACKUP BASE BATCH BEFORE BEGIN BETWEEN BIGINT BINARY BIT BLOB BLOCK BOOLEAN BOTH BREADTH BUCKET BULK BY
    BYTE CALL CALLED CALLING CAPACITY CASCADE CASCADED CASE CAST CATALOG CHAR CHARACTER CHECK CLASS CLOB CLOSE
    CLUSTER CLUSTERED CLUSTERING CLUSTERS COALESCE COLLATE COLLATION COLLECTION COLUMN COLUMNS COMBINE COMMENT
    COMMIT COMPACT COMPILE COMPRESS CONDITION CONFLICT CONNECT CONNECTION CONSISTENCY CONSISTENT CONSTRAINT
    CONSTRAINTS CONSTRUCTOR CONSUMED CONTINUE CONVERT COPY CORRESPONDING COUNT COUNTER CREATE CROSS CUBE
    CURRENT CURSOR CYCLE DATA DATABASE DATE DATETIME DAY DEALLOCATE DEC DECIMAL DECLARE DEFAULT DEFERRABLE
    DEFERRED DEFINE DEFINED DEFINITION DELETE DELIMITED DEPTH DEREF DESC DESCRIBE DESCRIPTOR DETACH
    DETERMINISTIC DIAGNOSTICS DIRECTORIES DISABLE DISCONNECT DISTINCT DISTRIBUTE DO DOMAIN DOUBLE DROP DUMP
    DURATION DYNAMIC EACH ELEMENT ELSE ELSEIF EMPTY ENABLE END EQUAL EQUALS ERROR ESCAPE ESCAPED EVAL EVALUATE
    EXCEEDED EXCEPT EXCEPTION EXCEPTIONS EXCLUSIVE EXEC EXECUTE EXISTS EXIT EXPLAIN EXPLODE EXPORT EXPRESSION
    EXTENDED EXTERNAL EXTRACT FAIL FALSE FAMILY FETCH FIELDS FILE FILTER FILTERING FINAL FINISH FIRST FIXED
    FLATTERN FLOAT FOR FORCE FOREIGN FORMAT FORWARD FOUND FREE FROM FULL FUNCTION FUNCTIONS GENERAL GENERATE
    GET GLOB GLOBAL GO GOTO GRANT GREATER GROUP GROUPING HANDLER HASH HAVE HAVING HEAP HIDDEN HOLD HOUR
    IDENTIFIED IDENTITY IF IGNORE IMMEDIATE IMPORT IN INCLUDING INCLUSIVE INCREMENT INCREMENTAL INDEX INDEXED
    INDEXES INDICATOR INFINITE INITIALLY INLINE INNER INNTER INOUT INPUT INSENSITIVE INSERT INSTEAD INT INTEGER
    INTERSECT INTERVAL INTO INVALIDATE IS ISOLATION ITEM ITEMS ITERATE JOIN KEY KEYS LAG LANGUAGE LARGE LAST
    LATERAL LEAD LEADING LEAVE LEFT LENGTH LESS LEVEL LIKE LIMIT LIMITED LINES LIST LOAD LOCAL LOCALTIME
    LOCALTIMESTAMP LOCATION LOCATOR LOCK LOCKS LOG LOGED LONG LOOP LOWER MAP MATCH MATERIALIZED MAX MAXLEN
    MEMBER MERGE METHOD METRICS MIN MINUS MINUTE MISSING MOD MODE MODIFIES MODIFY MODULE MONTH MULTI MULTISET
    NAME NAMES NATIONAL NATURAL NCHAR NCLOB NEW NEXT NO NONE NOT NULL NULLIF NUMBER NUMERIC OBJECT OF OFFLINE
    OFFSET OLD ON ONLINE ONLY OPAQUE OPEN OPERATOR OPTION OR ORDER ORDINALITY OTHER OTHERS OUT OUTER OUTPUT
    OVER OVERLAPS OVERRIDE OWNER PAD PARALLEL PARAMETER PARAMETERS PARTIAL PARTITION PARTITIONED PARTITIONS
    PATH PERCENT PERCENTILE PERMISSION PERMISSIONS PIPE PIPELINED PLAN POOL POSITION PRECISION PREPARE PRESERVE
    PRIMARY PRIOR PRIVATE PRIVILEGES PROCEDURE PROCESSED PROJECT PROJECTION PROPERTY PROVISIONING PUBLIC PUT
    QUERY QUIT QUORUM RAISE RANDOM RANGE RANK RAW READ READS REAL REBUILD RECORD RECURSIVE REDUCE REF REFERENCE
    REFERENCES REFERENCING REGEXP REGION REINDEX RELATIVE RELEASE REMAINDER RENAME REPEAT REPLACE REQUEST RESET
    RESIGNAL RESOURCE RESPONSE RESTORE RESTRICT RESULT RETURN RETURNING RETURNS REVERSE REVOKE RIGHT ROLE ROLES
    ROLLBACK ROLLUP ROUTINE ROW ROWS RULE RULES SAMPLE SATISFIES SAVE SAVEPOINT SCAN SCHEMA SCOPE SCROLL SEARCH
    SECOND SECTION SEGMENT SEGMENTS SELECT SELF SEMI SENSITIVE SEPARATE SEQUENCE SERIALIZABLE SESSION SET SETS
    SHARD SHARE SHARED SHORT SHOW SIGNAL SIMILAR SIZE SKEWED SMALLINT SNAPSHOT SOME SOURCE SPACE SPACES SPARSE
    SPECIFIC SPECIFICTYPE SPLIT SQL SQLCODE SQLERROR SQLEXCEPTION SQLSTATE SQLWARNING START STATE STATIC STATUS
    STORAGE STORE STORED STREAM STRING STRUCT STYLE SUB SUBMULTISET SUBPARTITION SUBSTRING SUBTYPE SUM SUPER
    SYMMETRIC SYNONYM SYSTEM TABLE TABLESAMPLE TEMP TEMPORARY TERMINATED TEXT THAN THEN THROUGHPUT TIME
    TIMESTAMP TIMEZONE TINYINT TO TOKEN TOTAL TOUCH TRAILING TRANSACTION TRANSFORM TRANSLATE TRANSLATION TREAT
    TRIGGER TRIM TRUE TRUNCATE TTL TUPLE TYPE UNDER UNDO UNION UNIQUE UNIT UNKNOWN UNLOGGED UNNEST UNPROCESSED
    UNSIGNED UNTIL UPDATE UPPER URL USAGE USE USER USERS USING UUID VACUUM VALUE VALUED VALUES VARCHAR VARIABLE
    VARIANCE VARINT VARYING VIEW VIEWS VIRTUAL VOID WAIT WHEN WHENEVER WHERE WHILE WINDOW WITH WITHIN WITHOUT
    WORK WRAPPED WRITE YEAR ZONE
""".split())

FUNCTIONS = ("attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains", "size")
UPDATE_FUNCTIONS = ("if_not_exists", "list_append")
TYPES = ("S", "SS", "N", "NS", "B", "BS", "BOOL", "NULL", "L", "M")
SCALAR_COMPARABLE = ("S", "N", "B")

# --------------------------------------------------------------------------- values

_CTX = decimal.Context(prec=38, traps=[decimal.Inexact, decimal.Overflow, decimal.InvalidOperation])


def vtype(v: dict | None) -> str | None:
    if v is None:
        return None
    return next(iter(v))


def num(s: str) -> Decimal:
    try:
        return Decimal(s)
    except decimal.InvalidOperation:
        raise ExprError("A value provided cannot be converted into a number") from None


def fmt_num(d: Decimal) -> str:
    """A computed number as text (like Big.js ``toFixed()``: plain notation, no trailing zeros)."""
    if d == 0:
        return "0"
    return format(d.normalize(_CTX), "f")


def sort_value(v: dict) -> Any:
    """A Python value ordering like DynamoDB orders S (UTF-8 bytes), N (numeric) and B (bytes)."""
    t = vtype(v)
    if t == "N":
        return num(v["N"])
    if t == "S":
        return v["S"].encode("utf-8")
    if t == "B":
        return bytes(v["B"])
    raise ExprError(f"unorderable type {t}")


def equal(a: dict | None, b: dict | None) -> bool:
    """DynamoDB equality: same type and same value (numbers by value, sets unordered)."""
    if a is None or b is None:
        return False
    ta, tb = vtype(a), vtype(b)
    if ta != tb:
        return False
    x, y = a[ta], b[tb]
    if ta == "N":
        return num(x) == num(y)
    if ta == "NS":
        return {num(i) for i in x} == {num(i) for i in y}
    if ta in ("SS", "BS"):
        return {bytes(i) if ta == "BS" else i for i in x} == {bytes(i) if ta == "BS" else i for i in y}
    if ta == "B":
        return bytes(x) == bytes(y)
    if ta == "L":
        return len(x) == len(y) and all(equal(i, j) for i, j in zip(x, y))
    if ta == "M":
        return x.keys() == y.keys() and all(equal(x[k], y[k]) for k in x)
    return x == y


def _size(v: dict | None) -> dict | None:
    t = vtype(v)
    if t == "S":
        return {"N": str(len(v["S"].encode("utf-8")))}
    if t == "B":
        return {"N": str(len(v["B"]))}
    if t in ("SS", "NS", "BS", "L", "M"):
        return {"N": str(len(v[t]))}
    return None


# --------------------------------------------------------------------------- tokens

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<name>\#[A-Za-z0-9_]+)
  | (?P<value>:[A-Za-z0-9_]+)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<int>[0-9]+)
  | (?P<op><>|<=|>=|=|<|>)
  | (?P<punct>[()\[\],.+\-])
""", re.VERBOSE)


class Tok:
    __slots__ = ("kind", "text", "pos")

    def __init__(self, kind: str, text: str, pos: int):
        self.kind, self.text, self.pos = kind, text, pos

    def __repr__(self) -> str:
        return f"{self.kind}:{self.text}"


def tokenize(text: str, what: str) -> list[Tok]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            near = text[max(0, pos - 5):pos + 5]
            raise ExprError(f"Invalid {what}: Syntax error; token: \"{text[pos]}\", near: \"{near}\"")
        if m.lastgroup != "ws":
            out.append(Tok(m.lastgroup, m.group(), pos))
        pos = m.end()
    out.append(Tok("eof", "<EOF>", len(text)))
    return out


# --------------------------------------------------------------------------- parser


class Context:
    """The request's ExpressionAttributeNames/Values, and which of them the expressions used."""

    def __init__(self, names: dict | None, values: dict | None):
        self.names = names or {}
        self.values = values or {}
        self.used_names: set[str] = set()
        self.used_values: set[str] = set()

    def check_unused(self) -> None:
        unused = sorted(set(self.names) - self.used_names)
        if unused:
            raise ExprError(f"Value provided in ExpressionAttributeNames unused in expressions: keys: "
                            f"{{{', '.join(unused)}}}")
        unused = sorted(set(self.values) - self.used_values)
        if unused:
            raise ExprError(f"Value provided in ExpressionAttributeValues unused in expressions: keys: "
                            f"{{{', '.join(unused)}}}")


class Parser:
    def __init__(self, text: str, what: str, ctx: Context):
        if not text or not text.strip():
            raise ExprError(f"Invalid {what}: The expression can not be empty;")
        self.text = text
        self.what = what
        self.ctx = ctx
        self.toks = tokenize(text, what)
        self.i = 0
        self.parenthesized: set[int] = set()

    # -- token helpers
    @property
    def tok(self) -> Tok:
        return self.toks[self.i]

    def peek(self, k: int = 1) -> Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def is_kw(self, word: str, tok: Tok | None = None) -> bool:
        t = tok or self.tok
        return t.kind == "ident" and t.text.upper() == word

    def error(self, tok: Tok | None = None) -> ExprError:
        t = tok or self.tok
        near = self.text[max(0, t.pos - 8):t.pos + len(t.text) + 8]
        return ExprError(f"Invalid {self.what}: Syntax error; token: \"{t.text}\", near: \"{near}\"")

    def expect(self, kind: str, text: str | None = None) -> Tok:
        t = self.tok
        if t.kind != kind or (text is not None and t.text != text):
            raise self.error()
        return self.next()

    def done(self) -> None:
        if self.tok.kind != "eof":
            raise self.error()

    # -- leaves
    def name(self) -> str:
        t = self.next()
        if t.kind == "name":
            if t.text not in self.ctx.names:
                raise ExprError(f"Invalid {self.what}: An expression attribute name used in the document path is "
                                f"not defined; attribute name: {t.text}")
            self.ctx.used_names.add(t.text)
            return self.ctx.names[t.text]
        if t.kind == "ident":
            if t.text.upper() in RESERVED:
                raise ExprError(f"Invalid {self.what}: Attribute name is a reserved keyword; reserved keyword: "
                                f"{t.text}")
            return t.text
        raise self.error(t)

    def path(self) -> tuple:
        parts: list = [self.name()]
        while True:
            if self.tok.kind == "punct" and self.tok.text == ".":
                self.next()
                parts.append(self.name())
            elif self.tok.kind == "punct" and self.tok.text == "[":
                self.next()
                idx = self.expect("int")
                self.expect("punct", "]")
                parts.append(int(idx.text))
            else:
                return ("path", tuple(parts))

    def value(self) -> tuple:
        t = self.expect("value")
        if t.text not in self.ctx.values:
            raise ExprError(f"Invalid {self.what}: An expression attribute value used in expression is not defined; "
                            f"attribute value: {t.text}")
        self.ctx.used_values.add(t.text)
        return ("value", self.ctx.values[t.text])

    def is_call(self, names) -> bool:
        return self.tok.kind == "ident" and self.tok.text in names and \
            self.peek().kind == "punct" and self.peek().text == "("

    def args(self, parse_one) -> list:
        self.expect("punct", "(")
        out = [parse_one()]
        while self.tok.kind == "punct" and self.tok.text == ",":
            self.next()
            out.append(parse_one())
        self.expect("punct", ")")
        return out

    # -- conditions
    def condition(self) -> tuple:
        node = self.disjunct()
        while self.is_kw("OR"):
            self.next()
            node = ("or", node, self.disjunct())
        return node

    def disjunct(self) -> tuple:
        node = self.conjunct()
        while self.is_kw("AND"):
            self.next()
            node = ("and", node, self.conjunct())
        return node

    def conjunct(self) -> tuple:
        if self.is_kw("NOT"):
            self.next()
            if self.is_kw("NOT"):  # dynalite (and DynamoDB's grammar) want a condition, not another NOT
                raise ExprError(f"Invalid {self.what}: Syntax error; token: \"NOT\", near: \"NOT NOT\"")
            return ("not", self.conjunct())
        return self.primary()

    def primary(self) -> tuple:
        t = self.tok
        if t.kind == "punct" and t.text == "(":
            start = self.i
            self.next()
            try:
                node = self.condition()
                self.expect("punct", ")")
            except ExprError:
                self.i = start  # not a parenthesized condition: a parenthesized operand, "(a) = :v"
                return self.comparison()
            if id(node) in self.parenthesized:
                raise ExprError(f"Invalid {self.what}: The expression has redundant parentheses;")
            self.parenthesized.add(id(node))
            return node
        if self.is_call(FUNCTIONS) and t.text != "size":
            return self.function()
        return self.comparison()

    def comparison(self) -> tuple:
        left = self.operand()
        t = self.tok
        if t.kind == "op":
            self.next()
            node = ("cmp", t.text, left, self.operand())
            self.check_distinct(t.text, node[2:])
            return node
        if self.is_kw("BETWEEN"):
            self.next()
            lo = self.operand()
            if not self.is_kw("AND"):
                raise self.error()
            self.next()
            hi = self.operand()
            self.check_distinct("BETWEEN", (left, lo, hi))
            if lo[0] == "value" and hi[0] == "value" and vtype(lo[1]) != vtype(hi[1]):
                raise ExprError(f"Invalid {self.what}: The BETWEEN operator requires same data type for lower and "
                                f"upper bounds; lower bound operand: AttributeValue: {lo[1]}, upper bound operand: "
                                f"AttributeValue: {hi[1]}")
            if lo[0] == "value" and hi[0] == "value" and vtype(lo[1]) in SCALAR_COMPARABLE \
                    and sort_value(lo[1]) > sort_value(hi[1]):
                raise ExprError(f"Invalid {self.what}: The BETWEEN operator requires upper bound to be greater than "
                                f"or equal to lower bound; lower bound operand: AttributeValue: {lo[1]}, upper bound "
                                f"operand: AttributeValue: {hi[1]}")
            return ("between", left, lo, hi)
        if self.is_kw("IN"):
            self.next()
            items = self.args(self.operand)
            if len(items) > 100:
                raise ExprError(f"Invalid {self.what}: The IN operator is provided with too many operands; "
                                f"number of operands: {len(items)}")
            return ("in", left, tuple(items))
        raise self.error()

    def operand(self) -> tuple:
        t = self.tok
        if t.kind == "punct" and t.text == "(":
            self.next()
            node = self.operand()
            self.expect("punct", ")")
            if id(node) in self.parenthesized:
                raise ExprError(f"Invalid {self.what}: The expression has redundant parentheses;")
            self.parenthesized.add(id(node))
            return node
        if t.kind == "value":
            return self.value()
        if self.is_call(("size",)):
            self.next()
            (p,) = self.args(self.path_arg)
            return ("size", p)
        if self.is_call(FUNCTIONS + UPDATE_FUNCTIONS):
            raise ExprError(f"Invalid {self.what}: The function is not allowed to be used this way in an "
                            f"expression; function: {t.text}")
        if t.kind in ("name", "ident"):
            return self.path()
        raise self.error()

    def path_arg(self) -> tuple:
        if self.tok.kind == "punct" and self.tok.text == "(":
            self.next()
            node = self.path_arg()
            self.expect("punct", ")")
            return node
        if self.tok.kind not in ("name", "ident"):
            raise ExprError(f"Invalid {self.what}: Operator or function requires a document path; "
                            f"operator or function: {self.toks[self.i - 2].text}")
        return self.path()

    def function(self) -> tuple:
        fname = self.next().text
        args = self.args(self.operand)
        want = {"attribute_exists": 1, "attribute_not_exists": 1, "attribute_type": 2, "begins_with": 2,
                "contains": 2}[fname]
        if len(args) != want:
            raise ExprError(f"Invalid {self.what}: Incorrect number of operands for operator or function; "
                            f"operator or function: {fname}, number of operands: {len(args)}")
        if fname in ("attribute_exists", "attribute_not_exists", "attribute_type") and args[0][0] != "path":
            raise ExprError(f"Invalid {self.what}: Operator or function requires a document path; "
                            f"operator or function: {fname}")
        if fname == "attribute_type":
            if args[1][0] != "value" or vtype(args[1][1]) != "S":
                raise ExprError(f"Invalid {self.what}: Incorrect operand type for operator or function; "
                                f"operator or function: attribute_type, operand type: {vtype(args[1][1])}")
            if args[1][1]["S"] not in TYPES:
                raise ExprError(f"Invalid {self.what}: Invalid attribute type name found; type: {args[1][1]['S']}, "
                                f"valid types: {{B,NULL,SS,BOOL,L,BS,N,NS,S,M}}")
        if fname in ("begins_with", "contains"):
            self.check_distinct(fname, args)
        if fname == "begins_with":
            for a in args:
                if a[0] == "value" and vtype(a[1]) not in ("S", "B"):
                    raise ExprError(f"Invalid {self.what}: Incorrect operand type for operator or function; "
                                    f"operator or function: begins_with, operand type: {vtype(a[1])}")
        return ("func", fname, tuple(args))

    def check_distinct(self, op: str, operands) -> None:
        """``a = a``, ``contains(a, a)``: refused (dynalite and DynamoDB), for a path as first operand."""
        first = operands[0]
        if first[0] in ("path", "size") and any(o == first for o in operands[1:]):
            shown = path_text(first[1] if first[0] == "path" else first[1][1])
            raise ExprError(f"Invalid {self.what}: The first operand must be distinct from the remaining operands "
                            f"for this operator or function; operator: {op}, first operand: [{shown}]")

    def projection(self) -> list[tuple]:
        out = [self.path()]
        while self.tok.kind == "punct" and self.tok.text == ",":
            self.next()
            out.append(self.path())
        return out


def parse_condition(text: str, ctx: Context, what: str = "ConditionExpression") -> tuple:
    p = Parser(text, what, ctx)
    node = p.condition()
    p.done()
    return node


def parse_projection(text: str, ctx: Context) -> list[tuple]:
    p = Parser(text, "ProjectionExpression", ctx)
    paths = p.projection()
    p.done()
    projection_tree(paths)
    return paths


# --------------------------------------------------------------------------- paths


def get_path(item: dict, path: tuple) -> dict | None:
    """The value at ``path`` (a tuple of names and list indexes) in a wire item, or None."""
    cur: Any = {"M": item}
    for part in path:
        if isinstance(part, int):
            if vtype(cur) != "L" or part >= len(cur["L"]):
                return None
            cur = cur["L"][part]
        else:
            if vtype(cur) != "M" or part not in cur["M"]:
                return None
            cur = cur["M"][part]
    return cur


def project(item: dict, paths: list[tuple]) -> dict:
    """The item restricted to ``paths`` (ProjectionExpression semantics: list elements compacted)."""
    return (_extract({"M": item}, projection_tree(paths)) or {"M": {}})["M"]


def projection_tree(paths: list[tuple]) -> dict:
    """The paths as a tree; ValidationException when two overlap (``a, a.b``), as DynamoDB says."""
    tree: dict = {}
    for _, path in paths:
        node = tree
        for i, part in enumerate(path):
            last = i == len(path) - 1
            if part in node and (node[part] is _ALL or last):
                raise ExprError("Invalid ProjectionExpression: Two document paths overlap with each other; must "
                                f"remove or rewrite one of these paths; path one: {path_text(path[:i + 1])}")
            if last:
                node[part] = _ALL
            else:
                node = node.setdefault(part, {})
    return tree


_ALL = object()


def _extract(value: dict, tree: dict) -> dict | None:
    t = vtype(value)
    if t == "M":
        out = {}
        for k, sub in tree.items():
            if isinstance(k, str) and k in value["M"]:
                v = value["M"][k] if sub is _ALL else _extract(value["M"][k], sub)
                if v is not None:
                    out[k] = v
        return {"M": out} if out else None
    if t == "L":
        out_l = []
        for k in sorted(k for k in tree if isinstance(k, int)):
            if k < len(value["L"]):
                v = value["L"][k] if tree[k] is _ALL else _extract(value["L"][k], tree[k])
                if v is not None:
                    out_l.append(v)
        return {"L": out_l} if out_l else None
    return None


def path_text(path: tuple) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (("." if out else "") + p)
    return out


# --------------------------------------------------------------------------- evaluation


def operand(item: dict, node: tuple) -> dict | None:
    kind = node[0]
    if kind == "value":
        return node[1]
    if kind == "path":
        return get_path(item, node[1])
    if kind == "size":
        return _size(get_path(item, node[1][1]))
    raise AssertionError(node)


def _compare(op: str, a: dict | None, b: dict | None) -> bool:
    if op == "=":
        return equal(a, b)
    if op == "<>":
        return not equal(a, b)
    if a is None or b is None or vtype(a) != vtype(b) or vtype(a) not in SCALAR_COMPARABLE:
        return False
    x, y = sort_value(a), sort_value(b)
    return {"<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]


def _contains(haystack: dict | None, needle: dict | None) -> bool:
    if haystack is None or needle is None:
        return False
    t, nt = vtype(haystack), vtype(needle)
    if t == "S":
        return nt == "S" and needle["S"] in haystack["S"]
    if t == "B":
        return nt == "B" and bytes(needle["B"]) in bytes(haystack["B"])
    if t in ("SS", "NS", "BS"):
        if nt != t[0]:
            return False
        return any(equal({nt: e}, needle) for e in haystack[t])
    if t == "L":
        return any(equal(e, needle) for e in haystack["L"])
    return False


def evaluate(node: tuple, item: dict) -> bool:
    kind = node[0]
    if kind == "and":
        return evaluate(node[1], item) and evaluate(node[2], item)
    if kind == "or":
        return evaluate(node[1], item) or evaluate(node[2], item)
    if kind == "not":
        return not evaluate(node[1], item)
    if kind == "cmp":
        return _compare(node[1], operand(item, node[2]), operand(item, node[3]))
    if kind == "between":
        x, lo, hi = (operand(item, n) for n in node[1:])
        return _compare(">=", x, lo) and _compare("<=", x, hi)
    if kind == "in":
        x = operand(item, node[1])
        return x is not None and any(equal(x, operand(item, n)) for n in node[2])
    if kind == "func":
        name, args = node[1], node[2]
        if name == "attribute_exists":
            return get_path(item, args[0][1]) is not None
        if name == "attribute_not_exists":
            return get_path(item, args[0][1]) is None
        a = operand(item, args[0])
        b = operand(item, args[1])
        if name == "attribute_type":
            return a is not None and vtype(a) == b["S"]
        if name == "begins_with":
            if a is None or b is None or vtype(a) != vtype(b) or vtype(a) not in ("S", "B"):
                return False
            return bytes(a["B"]).startswith(bytes(b["B"])) if vtype(a) == "B" else a["S"].startswith(b["S"])
        if name == "contains":
            return _contains(a, b)
    raise AssertionError(node)


def paths_of(node) -> list[tuple]:
    """Every document path a parsed condition/filter refers to."""
    if not isinstance(node, tuple) or not node:
        return []
    if isinstance(node[0], str):
        if node[0] == "path":
            return [node[1]]
        if node[0] == "value":
            return []
        node = node[1:]
    return [p for child in node for p in paths_of(child)]
