"""Mechanical mutation of SQL and PL/pgSQL text, one site at a time.

The hand-written mutants (`impl/mutants/delivery.py`) are the bugs a reviewer thought of;
this module generates the rest, in the spirit of SQLMutation, mutmut and PIT: each
operator rewrites one *site* of one function body (`catalogue.py` chooses the bodies: a
conjunct dropped, a comparison flipped, a literal moved by one, a row lock removed, ...)
and keeps every other byte, so a mutant diffs cleanly against its source. One site only:
a mutant that changes two things is killed when either shows, while a single-site
survivor names one fact no test pins down (or a site that does not matter: an equivalent
mutant). It is pure text: a small tokenizer for PostgreSQL's SQL and PL/pgSQL, a light
structural reading on top (nesting, statements, conditions and their AND/OR chains, ORDER
BY keys, locking clauses, SET lists) and one function per operator. It never talks to a
database; the enum values `replace-literal` cycles through are read from the migrations.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs

# -- tokens --------------------------------------------------------------------


class Kind(enum.Enum):
    SPACE = "space"
    COMMENT = "comment"
    STRING = "string"  # '...', E'...', $tag$...$tag$
    QUOTED = "quoted"  # "quoted identifier"
    PLACEHOLDER = "placeholder"  # %(name)s, %s, $1
    NUMBER = "number"
    WORD = "word"  # identifiers and keywords alike
    OPERATOR = "operator"
    CAST = "cast"  # ::
    OPEN = "open"
    CLOSE = "close"
    COMMA = "comma"
    PUNCT = "punct"  # . ; [ ] and anything unrecognised
    END = "end"  # the sentinel past either end of a statement


@attrs.frozen
class Token:
    kind: Kind
    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.text)

    @property
    def word(self) -> str:
        """The keyword or identifier, upper-cased; '' for any other kind of token."""
        return self.text.upper() if self.kind is Kind.WORD else ""


# Longest first, so `<=` is never read as `<` then `=`. Deliberately not
# PostgreSQL's full operator grammar: the comparison and arithmetic operators
# must come out as tokens of their own, `=>` (a named argument) and `:=` (a
# PL/pgSQL assignment) must not be mistaken for `=`, nor the shifts `>>` and
# `<<` for two comparisons.
_OPERATORS = (
    "->>", "#>>", ":=", "=>", "<=", ">=", "<>", "!=", "->", "#>", "||", "@>", "<@", "&&", "!~", "~*", ">>", "<<",
)  # fmt: skip
_OPERATOR_CHARS = "+-*/<>=~!@#%^&|`?"


def tokenize(sql: str) -> tuple[Token, ...]:
    """Every token of `sql`, whitespace and comments included: their texts concatenate to `sql`."""
    tokens: list[Token] = []
    i = 0
    while i < len(sql):
        kind, end = _scan(sql, i)
        tokens.append(Token(kind, sql[i:end], i))
        i = end
    return tuple(tokens)


def _scan(sql: str, i: int) -> tuple[Kind, int]:
    """The kind and end of the token that starts at `i`."""
    c, ahead = sql[i], sql[i + 1 : i + 2]
    if c.isspace():
        return Kind.SPACE, _end_of_run(sql, i, str.isspace)
    if sql.startswith("--", i):
        newline = sql.find("\n", i)
        return Kind.COMMENT, len(sql) if newline < 0 else newline
    if sql.startswith("/*", i):
        return Kind.COMMENT, _end_of_block_comment(sql, i)
    if c == "#" and ahead.isalpha() and sql[sql.rfind("\n", 0, i) + 1 : i].strip() == "":
        # A PL/pgSQL compiler directive (`#variable_conflict use_column`), alone on its
        # line at the head of a body: no code to mutate.
        newline = sql.find("\n", i)
        return Kind.COMMENT, len(sql) if newline < 0 else newline
    if c in "eE" and ahead == "'":
        return Kind.STRING, _end_of_quoted(sql, i + 1, "'", backslashes=True)
    if c == "'":
        return Kind.STRING, _end_of_quoted(sql, i, "'")
    if c == '"':
        return Kind.QUOTED, _end_of_quoted(sql, i, '"')
    if c == "%":
        return _scan_percent(sql, i)
    if c == "$":
        return _scan_dollar(sql, i)
    if c.isdigit() or (c == "." and ahead.isdigit()):
        return Kind.NUMBER, _end_of_number(sql, i)
    if c.isalpha() or c == "_" or ord(c) > 127:
        return Kind.WORD, _end_of_run(sql, i, lambda ch: ch.isalnum() or ch in "_$" or ord(ch) > 127)
    if sql.startswith("::", i):
        return Kind.CAST, i + 2
    for operator in _OPERATORS:
        if sql.startswith(operator, i):
            return Kind.OPERATOR, i + len(operator)
    single = {"(": Kind.OPEN, ")": Kind.CLOSE, ",": Kind.COMMA}
    if c in single:
        return single[c], i + 1
    return (Kind.OPERATOR if c in _OPERATOR_CHARS else Kind.PUNCT), i + 1


def _end_of_run(sql: str, i: int, belongs: Callable[[str], bool]) -> int:
    while i < len(sql) and belongs(sql[i]):
        i += 1
    return i


def _end_of_block_comment(sql: str, i: int) -> int:
    depth = 0
    while i < len(sql):
        if sql.startswith("/*", i):
            depth, i = depth + 1, i + 2
        elif sql.startswith("*/", i):
            depth, i = depth - 1, i + 2
            if depth == 0:
                return i
        else:
            i += 1
    return len(sql)


def _end_of_quoted(sql: str, i: int, quote: str, backslashes: bool = False) -> int:
    """End of the quoted text opening at `i`; a doubled quote is an escaped quote."""
    j = i + 1
    while j < len(sql):
        if backslashes and sql[j] == "\\":
            j += 2
        elif sql[j] == quote:
            if sql.startswith(quote * 2, j):
                j += 2
            else:
                return j + 1
        else:
            j += 1
    return len(sql)


def _scan_percent(sql: str, i: int) -> tuple[Kind, int]:
    """psycopg's `%(name)s` and `%s` placeholders; `%%` is a literal percent (modulo)."""
    if sql.startswith("%%", i):
        return Kind.OPERATOR, i + 2
    if sql.startswith("%s", i):
        return Kind.PLACEHOLDER, i + 2
    if sql.startswith("%(", i):
        close = sql.find(")s", i)
        if close > 0 and re.fullmatch(r"\w+", sql[i + 2 : close]):
            return Kind.PLACEHOLDER, close + 2
    return Kind.OPERATOR, i + 1


def _scan_dollar(sql: str, i: int) -> tuple[Kind, int]:
    """`$1` (a server-side parameter) or a dollar-quoted string `$tag$...$tag$`."""
    digits = _end_of_run(sql, i + 1, str.isdigit)
    if digits > i + 1:
        return Kind.PLACEHOLDER, digits
    tag = re.match(r"\$[A-Za-z_]*\$", sql[i:])
    if tag is None:
        return Kind.PUNCT, i + 1
    close = sql.find(tag.group(), i + len(tag.group()))
    return Kind.STRING, len(sql) if close < 0 else close + len(tag.group())


def _end_of_number(sql: str, i: int) -> int:
    j = _end_of_run(sql, i, str.isdigit)
    if sql[j : j + 1] == "." and sql[j + 1 : j + 2] != ".":
        j = _end_of_run(sql, j + 1, str.isdigit)
    exponent = re.match(r"[eE][+-]?\d+", sql[j:])
    return j + len(exponent.group()) if exponent else j


def collapse_whitespace(text: str) -> str:
    """`text` with every run of whitespace one space, and no space at either end."""
    return " ".join(text.split())


# psycopg's own placeholder grammar. psycopg applies it to the whole text,
# string literals included, so this does too.
_PSYCOPG_PLACEHOLDER = re.compile(r"%(\(\w+\))?([sbt%])")


def server_text(sql: str) -> str:
    """The statement as PostgreSQL receives it from psycopg (for PREPARE): each
    distinct `%(name)s` becomes one `$n`, numbered in order of first appearance,
    each `%s` the next number, and `%%` a single `%`."""
    numbers: dict[str, int] = {}

    def numbered(match: re.Match[str]) -> str:
        name, conversion = match.groups()
        if conversion == "%" and name is None:
            return "%"
        key = name if name is not None else f"#{len(numbers)}"
        return f"${numbers.setdefault(key, len(numbers) + 1)}"

    return _PSYCOPG_PLACEHOLDER.sub(numbered, sql)


# -- the schema's enums -----------------------------------------------------------


@functools.cache
def schema_enums() -> Mapping[str, tuple[str, ...]]:
    """Every `CREATE TYPE name AS ENUM (...)` of the shipped migrations: name to values, in order."""
    from leaseproof.impl.migrate import available

    enums: dict[str, tuple[str, ...]] = {}
    for _version, text in available():
        sig = [t for t in tokenize(text) if t.kind not in (Kind.SPACE, Kind.COMMENT)]
        for i in range(len(sig) - 5):
            if [t.word for t in (sig[i], sig[i + 1], sig[i + 3], sig[i + 4])] == ["CREATE", "TYPE", "AS", "ENUM"]:
                values: list[str] = []
                j = i + 6
                while j < len(sig) and sig[j].kind is Kind.STRING:
                    values.append(_string_value(sig[j]) or "")
                    j += 2 if sig[j + 1 : j + 2] and sig[j + 1].kind is Kind.COMMA else 1
                enums[sig[i + 2].text.lower()] = tuple(values)
    return enums


def _string_value(token: Token) -> str | None:
    """The value of a plain or E'' literal without backslash escapes; None for any other."""
    text = token.text[1:] if token.text[:1] in "eE" else token.text
    if not text.startswith("'") or (text is not token.text and "\\" in text):
        return None
    return text[1:-1].replace("''", "'")


# -- the structure of one statement -----------------------------------------------

_END = Token(Kind.END, "", -1)
_SUBQUERY_STARTS = frozenset({"SELECT", "WITH", "VALUES", "TABLE"})
# A WHERE or HAVING condition runs until the next clause of its query.
_CLAUSES_AFTER_CONDITION = frozenset(
    {
        "GROUP",
        "HAVING",
        "WINDOW",
        "ORDER",
        "LIMIT",
        "OFFSET",
        "FETCH",
        "FOR",
        "RETURNING",
        "UNION",
        "INTERSECT",
        "EXCEPT",
        "ON",
        "DO",
        "INTO",
        "LOOP",
    }
)
_JOIN_WORDS = frozenset({"JOIN", "INNER", "LEFT", "RIGHT", "FULL", "CROSS", "NATURAL", "OUTER"})
_ENDS_OF = {
    "WHERE": _CLAUSES_AFTER_CONDITION,
    "HAVING": _CLAUSES_AFTER_CONDITION,
    "ON": _CLAUSES_AFTER_CONDITION | _JOIN_WORDS | {"WHERE", "USING"},
    "WHEN": frozenset({"THEN"}),
    # PL/pgSQL: the conditions of its control flow (EXIT WHEN is WHEN's, up to its `;`) ...
    "IF": frozenset({"THEN"}),
    "ELSIF": frozenset({"THEN"}),
    "WHILE": frozenset({"LOOP"}),
    # ... and the expressions it computes: an assignment's right-hand side and a
    # RETURN's value, each up to its `;`. Read as boolean expressions (their AND/OR
    # chains, comparisons and NOTs are sites) but never replaced whole by `true`.
    ":=": frozenset(),
    "RETURN": frozenset(),
}
# Conditions that choose rows; and those that choose a branch of control flow.
_FILTERS = frozenset({"WHERE", "HAVING", "ON"})
_BRANCHES = frozenset({"IF", "ELSIF", "WHILE", "WHEN"})
# Where a PL/pgSQL statement list begins (a statement starts after one of these, or after `;`).
_STATEMENT_LEADS = frozenset({"BEGIN", "THEN", "ELSE", "LOOP", "DECLARE"})
# A statement that writes rows, which drop-statement skips.
_WRITES = frozenset({"INSERT", "UPDATE", "DELETE"})
# After these keywords an expression begins: a `+` or `-` right after one is unary.
_EXPRESSION_LEADS = frozenset(
    {
        "SELECT",
        "WHERE",
        "AND",
        "OR",
        "NOT",
        "ON",
        "SET",
        "WHEN",
        "THEN",
        "ELSE",
        "CASE",
        "IS",
        "IN",
        "BETWEEN",
        "LIKE",
        "ILIKE",
        "SIMILAR",
        "BY",
        "RETURNING",
        "VALUES",
        "HAVING",
        "LIMIT",
        "OFFSET",
        "DISTINCT",
        "ALL",
        "ANY",
        "SOME",
        "EXISTS",
        "FROM",
        "JOIN",
        "USING",
        "ESCAPE",
        "DO",
        "INTO",
        "AS",
        "TO",
        "AT",
        "ARRAY",
        "OVERLAPS",
        "RETURN",
        "IF",
        "ELSIF",
        "WHILE",
        "PERFORM",
        "QUERY",
    }
)
_ORDER_KEY_ENDS = frozenset(
    {
        "LIMIT",
        "OFFSET",
        "FETCH",
        "FOR",
        "UNION",
        "INTERSECT",
        "EXCEPT",
        "RETURNING",
        "WINDOW",
        "ROWS",
        "RANGE",
        "GROUPS",
    }
)
_SET_LIST_ENDS = frozenset({"FROM", "WHERE", "RETURNING"})


@attrs.frozen
class Condition:
    """One WHERE, HAVING, join ON, CASE WHEN, IF, ELSIF, WHILE or EXIT WHEN condition, or
    the expression of an assignment (`:=`) or a RETURN: sig tokens [first, stop)."""

    keyword: str
    first: int
    stop: int


@attrs.frozen
class Chain:
    """Two or more operands (sig ranges) joined by AND, or by OR, at one level of a condition."""

    joiner: str
    keyword: str  # of the condition it belongs to
    operands: tuple[tuple[int, int], ...]


@attrs.frozen
class LockingClause:
    """`FOR UPDATE | NO KEY UPDATE | SHARE | KEY SHARE [OF names] [NOWAIT | SKIP LOCKED]`: sig [first, stop)."""

    first: int
    stop: int
    of: tuple[str, ...] | None  # the locked relations; None: every relation of its query
    skip_locked: tuple[int, int] | None


class Statement:
    """One statement's tokens and the little structure the operators read.

    `sig` holds the significant tokens (no whitespace or comments); every
    index below is into `sig`. Parentheses and CASE…END nest; `partner`
    pairs them, `parent[i]` is the opener that encloses token i (-1 at the
    top), so "at the same level" is "with the same parent".
    """

    def __init__(self, sql: str, enums: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self.sql = sql
        self.enums = schema_enums() if enums is None else enums
        self.tokens = tokenize(sql)
        self.sig = tuple(t for t in self.tokens if t.kind not in (Kind.SPACE, Kind.COMMENT))
        self._raw_index = {t.start: k for k, t in enumerate(self.tokens)}
        self.partner, self.parent = _nesting(self.sig)
        # Which `;`-separated statement (of a PL/pgSQL body) each token is in.
        self.statement: list[int] = []
        count = 0
        for token in self.sig:
            self.statement.append(count)
            count += token.text == ";"
        self.conditions = tuple(self._find_conditions())
        chains: list[Chain] = []
        singles: list[tuple[str, int, int]] = []
        predicates: list[tuple[int, int]] = []
        for condition in self.conditions:
            self._read_boolean(condition.keyword, condition.first, condition.stop, chains, singles, predicates)
        self.chains, self.singles, self.predicates = tuple(chains), tuple(singles), tuple(predicates)
        self.locking_clauses = tuple(self._find_locking_clauses())

    # -- navigation --

    def at(self, i: int) -> Token:
        return self.sig[i] if 0 <= i < len(self.sig) else _END

    def word(self, i: int) -> str:
        return self.at(i).word

    def opens(self, i: int) -> bool:
        return self.partner.get(i, -1) > i

    def closes(self, i: int) -> bool:
        """Whether token i ends the level a scan is on: a closer, `;`, or the end of the text."""
        t = self.at(i)
        return (
            t.kind is Kind.END
            or t.text == ";"
            or t.kind is Kind.CLOSE
            or (t.word == "END" and self.partner.get(i, i) < i)
        )

    def skip(self, i: int) -> int:
        """The index after token i, or after the group it opens."""
        return self.partner[i] + 1 if self.opens(i) else i + 1

    def scan(self, i: int, stop: Callable[[int], bool]) -> int:
        """The first index from i, at i's level, where `stop` holds or the level ends."""
        while not self.closes(i) and not stop(i):
            i = self.skip(i)
        return i

    def split(self, first: int, stop: int, separator: Callable[[int], bool]) -> list[tuple[int, int]]:
        """The ranges between separators at the level of `first`, within [first, stop)."""
        parts, start, i = [], first, first
        while i < stop:
            if separator(i):
                parts.append((start, i))
                start = i + 1
            i = self.skip(i)
        parts.append((start, stop))
        return parts

    def level_before(self, i: int) -> Iterator[int]:
        """The tokens before i at its level and in its statement, nearest first."""
        return (
            j
            for j in range(i - 1, -1, -1)
            if self.parent[j] == self.parent[i] and self.statement[j] == self.statement[i]
        )

    def statement_start(self, i: int) -> int:
        """The first token of the PL/pgSQL statement token i (at the top level) is in: the
        one after the `;` or the keyword that opens its statement list."""
        for j in range(i - 1, -1, -1):
            if self.parent[j] == self.parent[i] and (self.at(j).text == ";" or self.word(j) in _STATEMENT_LEADS):
                return j + 1
        return 0

    def statement_end(self, i: int) -> int:
        """The index of the `;` that ends the statement token i is in (len(sig) if none)."""
        return next((j for j in range(i, len(self.sig)) if self.at(j).text == ";"), len(self.sig))

    def in_declarations(self, i: int) -> bool:
        """Whether token i is in a DECLARE section (before its block's BEGIN)."""
        for j in range(i - 1, -1, -1):
            if self.word(j) == "BEGIN":
                return False
            if self.word(j) == "DECLARE":
                return True
        return False

    def text(self, first: int, stop: int) -> str:
        return self.sql[self.at(first).start : self.at(stop - 1).end]

    def span(self, first: int, stop: int) -> tuple[int, int]:
        return self.at(first).start, self.at(stop - 1).end

    def removal(self, first: int, stop: int) -> tuple[int, int]:
        """The text span of sig [first, stop) with the whitespace on one side, so
        removing it leaves neither a double gap nor two words run together."""
        start, end = self.span(first, stop)
        k = self._raw_index[start]
        before = self.tokens[k - 1] if k > 0 else _END
        after_k = self._raw_index[self.at(stop - 1).start] + 1
        after = self.tokens[after_k] if after_k < len(self.tokens) else _END
        line_comment_before = k > 1 and self.tokens[k - 2].kind is Kind.COMMENT and self.tokens[k - 2].text[:2] != "/*"
        if before.kind is Kind.SPACE and not line_comment_before:
            return before.start, end
        if after.kind is Kind.SPACE:
            return start, after.end
        return start, end

    def name_at(self, i: int) -> tuple[str, int]:
        """A possibly qualified name starting at i (`a.b.c`): its last part and the index after it."""
        last, j = self.at(i).text, i + 1
        while self.at(j).text == "." and self.at(j + 1).kind in (Kind.WORD, Kind.QUOTED):
            last, j = self.at(j + 1).text, j + 2
        return last, j

    # -- conditions --

    def _find_conditions(self) -> Iterator[Condition]:
        for i, token in enumerate(self.sig):
            keyword = ":=" if token.text == ":=" else token.word
            if keyword not in _ENDS_OF or (keyword == "ON" and not self._is_join_condition(i)):
                continue
            if keyword == "IF" and self.word(i - 1) == "END":
                continue  # END IF
            if keyword == "RETURN" and self.word(i + 1) in ("QUERY", "NEXT"):
                continue  # its query's own conditions are read where they are
            stop = self._condition_stop(i + 1, _ENDS_OF[keyword])
            if stop > i + 1:
                yield Condition(keyword, i + 1, stop)

    def _condition_stop(self, first: int, ends: frozenset[str]) -> int:
        return self.scan(first, lambda j: self.word(j) in ends or self.at(j).kind is Kind.COMMA)

    def _is_join_condition(self, i: int) -> bool:
        """ON after a JOIN of its level; not ON CONFLICT, ON CONSTRAINT or DISTINCT ON."""
        if self.word(i + 1) == "CONFLICT" or self.word(i - 1) in ("CONFLICT", "DISTINCT"):
            return False
        return any(self.word(j) == "JOIN" for j in self.level_before(i))

    def _read_boolean(
        self,
        keyword: str,
        first: int,
        stop: int,
        chains: list[Chain],
        singles: list[tuple[str, int, int]],
        predicates: list[tuple[int, int]],
    ) -> None:
        """The OR chain of AND chains of [first, stop), recursing into parenthesised groups."""
        if first >= stop:
            return
        disjuncts = self.split(first, stop, lambda j: self.word(j) == "OR")
        if len(disjuncts) > 1 and all(a < b for a, b in disjuncts):
            chains.append(Chain("OR", keyword, tuple(disjuncts)))
        for a, b in disjuncts:
            conjuncts = self._conjuncts(a, b)
            if len(conjuncts) > 1 and all(x < y for x, y in conjuncts):
                chains.append(Chain("AND", keyword, tuple(conjuncts)))
            for x, y in conjuncts:
                if x >= y:
                    continue
                predicates.append((x, y))
                inner = self._group_interior(x, y)
                if inner is not None:
                    self._read_boolean(keyword, *inner, chains, singles, predicates)
                elif len(disjuncts) == 1 and len(conjuncts) == 1:
                    singles.append((keyword, x, y))

    def _conjuncts(self, first: int, stop: int) -> list[tuple[int, int]]:
        """Split on AND, except the AND of `BETWEEN x AND y`."""
        between = False

        def separates(j: int) -> bool:
            nonlocal between
            if self.word(j) == "BETWEEN":
                between = True
            elif self.word(j) == "AND":
                if not between:
                    return True
                between = False
            return False

        return self.split(first, stop, separates)

    def _group_interior(self, first: int, stop: int) -> tuple[int, int] | None:
        """The inside of an operand that is `( … )` or `NOT ( … )`, unless it is a subquery."""
        opener = first + 1 if self.word(first) == "NOT" else first
        encloses = self.at(opener).kind is Kind.OPEN and self.partner.get(opener) == stop - 1
        if encloses and self.word(opener + 1) not in _SUBQUERY_STARTS:
            return opener + 1, stop - 1
        return None

    def in_condition(self, i: int) -> bool:
        return any(c.first <= i < c.stop for c in self.conditions)

    def searched(self, condition: Condition) -> bool:
        """Whether a condition is a truth value: not the value a simple CASE's WHEN
        compares with (`CASE kind WHEN 'event' THEN …`)."""
        if condition.keyword != "WHEN":
            return True
        case = self.parent[condition.first - 1]
        return case < 0 or self.word(case) != "CASE" or self.word(case + 1) == "WHEN"

    def predicate_around(self, first: int, stop: int) -> tuple[int, int]:
        """The smallest predicate (operand of a condition) holding sig [first, stop)."""
        holding = [(a, b) for a, b in self.predicates if a <= first and stop <= b]
        return min(holding, key=lambda ab: ab[1] - ab[0], default=(first, stop))

    # -- locking clauses --

    def _find_locking_clauses(self) -> Iterator[LockingClause]:
        strengths = (("UPDATE",), ("NO", "KEY", "UPDATE"), ("SHARE",), ("KEY", "SHARE"))
        for i in range(len(self.sig)):
            if self.word(i) != "FOR":
                continue
            strength = next((s for s in strengths if all(self.word(i + 1 + k) == w for k, w in enumerate(s))), None)
            if strength is None:
                continue
            j = i + 1 + len(strength)
            of: tuple[str, ...] | None = None
            if self.word(j) == "OF":
                names: list[str] = []
                j += 1
                while self.at(j).kind in (Kind.WORD, Kind.QUOTED):
                    last, j = self.name_at(j)
                    names.append(last)
                    if self.at(j).kind is not Kind.COMMA:
                        break
                    j += 1
                of = tuple(names)
            skip_locked = None
            if self.word(j) == "NOWAIT":
                j += 1
            elif self.word(j) == "SKIP" and self.word(j + 1) == "LOCKED":
                skip_locked = (j, j + 2)
                j += 2
            yield LockingClause(i, j, of, skip_locked)

    # -- operands of an arithmetic operator --

    def operand_before(self, j: int) -> int:
        """The first index of the primary expression (with its casts) that ends at j."""
        while self.at(j).text == "]" and self.at(j - 1).text == "[":
            j -= 2
        if self.at(j).kind is Kind.WORD and self.at(j - 1).kind is Kind.CAST:
            return self.operand_before(j - 2)
        token = self.at(j)
        if token.kind is Kind.CLOSE or (token.word == "END" and j in self.partner):
            start = self.partner.get(j, j)
            callee = self.at(start - 1)
            if callee.kind in (Kind.WORD, Kind.QUOTED) and callee.word not in _EXPRESSION_LEADS:
                return self._qualified_start(start - 1)
            return start
        if token.kind in (Kind.WORD, Kind.QUOTED):
            return self._qualified_start(j)
        if token.kind is Kind.STRING and self.at(j - 1).kind is Kind.WORD and self.word(j - 1) not in _EXPRESSION_LEADS:
            return j - 1  # a typed literal: interval '1 day'
        return j

    def _qualified_start(self, j: int) -> int:
        while self.at(j - 1).text == "." and self.at(j - 2).kind in (Kind.WORD, Kind.QUOTED):
            j -= 2
        return j

    def operand_after(self, k: int) -> int:
        """The last index of the primary expression (with its casts) that starts at k."""
        token = self.at(k)
        if token.text in ("+", "-"):
            return self.operand_after(k + 1)
        if self.opens(k):
            j = self.partner[k]
        elif token.kind in (Kind.WORD, Kind.QUOTED):
            _last, after = self.name_at(k)
            j = after - 1
            if self.opens(j + 1):
                j = self.partner[j + 1]
            elif self.at(j + 1).kind is Kind.STRING:
                j += 1  # a typed literal
        else:
            j = k
        while self.at(j + 1).kind is Kind.CAST and self.at(j + 2).kind is Kind.WORD:
            j += 2
            while self.at(j + 1).text == "[" and self.at(j + 2).text == "]":
                j += 2
        return j

    def ends_operand(self, j: int) -> bool:
        token = self.at(j)
        if token.kind is Kind.WORD:
            return token.word not in _EXPRESSION_LEADS
        return token.kind in (Kind.NUMBER, Kind.STRING, Kind.QUOTED, Kind.PLACEHOLDER, Kind.CLOSE) or token.text == "]"

    # -- lists --

    def order_keys(self) -> Iterator[tuple[int, list[tuple[int, int]]]]:
        """Each ORDER BY: the index of ORDER, and its keys."""
        for i in range(len(self.sig)):
            if self.word(i) == "ORDER" and self.word(i + 1) == "BY":
                stop = self.scan(i + 2, lambda j: self.word(j) in _ORDER_KEY_ENDS)
                yield i, self.split(i + 2, stop, lambda j: self.at(j).kind is Kind.COMMA)

    def positional_keys(self) -> set[int]:
        """Indices of integer keys of ORDER BY / GROUP BY (a column position, not a value)."""
        positions = set()
        for i in range(len(self.sig)):
            if self.word(i) in ("ORDER", "GROUP") and self.word(i + 1) == "BY":
                stop = self.scan(i + 2, lambda j: self.word(j) in _ORDER_KEY_ENDS | {"HAVING"})
                for a, b in self.split(i + 2, stop, lambda j: self.at(j).kind is Kind.COMMA):
                    if a < b and self.at(a).kind is Kind.NUMBER:
                        positions.add(a)
        return positions


def _nesting(sig: Sequence[Token]) -> tuple[dict[int, int], list[int]]:
    """Pair parentheses and CASE…END; and each token's innermost enclosing opener."""
    partner: dict[int, int] = {}
    parent: list[int] = []
    stack: list[int] = []
    for i, token in enumerate(sig):
        closing = (token.kind is Kind.CLOSE and any(sig[o].kind is Kind.OPEN for o in stack)) or (
            token.word == "END" and bool(stack) and sig[stack[-1]].word == "CASE"
        )
        if closing:
            opener = stack.pop()
            while token.kind is Kind.CLOSE and sig[opener].kind is not Kind.OPEN:
                opener = stack.pop()  # an unclosed CASE inside parentheses
            partner[opener], partner[i] = i, opener
        parent.append(stack[-1] if stack else -1)
        if token.kind is Kind.OPEN or (token.word == "CASE" and not (i and sig[i - 1].word == "END")):
            stack.append(i)  # (not the CASE of a PL/pgSQL `END CASE`)
    return partner, parent


# -- mutations ---------------------------------------------------------------------


@attrs.frozen
class Mutation:
    """One single-site change of one statement."""

    operator: str
    site: int  # 1-based, among this operator's mutations of the statement
    before: str  # the fragment replaced, whitespace collapsed
    after: str  # its replacement ('' for a removal), whitespace collapsed
    sql: str  # the whole mutated statement


@attrs.frozen
class _Edit:
    """Replace sql[start:end] with `replacement`; `anchor` is where the site is, for ordering."""

    anchor: int
    start: int
    end: int
    replacement: str


def _rewrite(s: Statement, fragment: tuple[int, int], site: tuple[int, int], new: str, anchor: int) -> _Edit:
    """An edit that shows the whole `fragment` (text span) but changes only `site` inside it."""
    start, end = fragment
    text = s.sql[start : site[0]] + new + s.sql[site[1] : end]
    return _Edit(anchor, start, end, text)


def _predicate_edit(s: Statement, first: int, stop: int, site: tuple[int, int], new: str) -> _Edit:
    """A change at sig [first, stop), shown as the smallest predicate that holds it."""
    return _rewrite(s, s.span(*s.predicate_around(first, stop)), site, new, s.at(first).start)


def _removal_of_operand(s: Statement, operands: Sequence[tuple[int, int]], k: int) -> _Edit:
    """Operand k of a list removed with its separator: the first takes the separator after it."""
    first, stop = operands[k]
    if k == 0:
        return _Edit(s.at(first).start, s.at(first).start, s.at(operands[1][0]).start, "")
    return _Edit(s.at(first).start, s.at(operands[k - 1][1] - 1).end, s.at(stop - 1).end, "")


def drop_conjunct(s: Statement) -> Iterator[_Edit]:
    """Each operand of an AND chain of a condition (not a CASE WHEN's) or of an
    assigned or returned expression removed; a WHERE, ON, HAVING, IF, ELSIF or WHILE
    condition (or group) of one predicate becomes `true`."""
    for chain in s.chains:
        if chain.joiner == "AND" and chain.keyword != "WHEN":
            for k in range(len(chain.operands)):
                yield _removal_of_operand(s, chain.operands, k)
    for keyword, first, stop in s.singles:
        if keyword in _FILTERS or (keyword in _BRANCHES and keyword != "WHEN"):
            start, end = s.span(first, stop)
            yield _Edit(start, start, end, "true")


def drop_disjunct(s: Statement) -> Iterator[_Edit]:
    """Each operand of an OR chain of a condition (not a CASE WHEN's) or of an assigned
    or returned expression removed."""
    for chain in s.chains:
        if chain.joiner == "OR" and chain.keyword != "WHEN":
            for k in range(len(chain.operands)):
                yield _removal_of_operand(s, chain.operands, k)


_FLIPPED = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "=": "<>", "<>": "=", "!=": "="}
_TRUTHS = frozenset({"NULL", "TRUE", "FALSE", "UNKNOWN"})


def flip_comparison(s: Statement) -> Iterator[_Edit]:
    """Each comparison of a condition (or of an assigned or returned expression) flipped:
    `<`↔`<=`, `>`↔`>=`, `=`↔`<>`, and IS [NOT] NULL / TRUE / FALSE / UNKNOWN, IS [NOT]
    DISTINCT FROM negated. `=` outside a condition (SET, DO UPDATE SET) is an assignment,
    `=>` a named argument and `:=` a PL/pgSQL assignment: none is touched."""
    for i, token in enumerate(s.sig):
        if not s.in_condition(i):
            continue
        if token.kind is Kind.OPERATOR and token.text in _FLIPPED:
            yield _predicate_edit(s, i, i + 1, (token.start, token.end), _FLIPPED[token.text])
        elif token.word == "IS":
            negated = s.word(i + 1) == "NOT"
            subject = i + 2 if negated else i + 1
            if s.word(subject) in _TRUTHS or (s.word(subject) == "DISTINCT" and s.word(subject + 1) == "FROM"):
                stop = subject + (2 if s.word(subject) == "DISTINCT" else 1)
                if negated:  # drop NOT and the space after it
                    site, new = (s.at(i + 1).start, s.at(subject).start), ""
                else:
                    at = s.at(subject).start
                    site, new = (at, at), ("NOT " if token.text.isupper() else "not ")
                yield _predicate_edit(s, i, stop, site, new)


def flip_arithmetic(s: Statement) -> Iterator[_Edit]:
    """Each binary `+` becomes `-` and each binary `-` becomes `+`."""
    for i, token in enumerate(s.sig):
        if token.kind is Kind.OPERATOR and token.text in ("+", "-") and s.ends_operand(i - 1):
            first, last = s.operand_before(i - 1), s.operand_after(i + 1)
            new = "-" if token.text == "+" else "+"
            yield _rewrite(s, s.span(first, last + 1), (token.start, token.end), new, token.start)


def off_by_one(s: Statement) -> Iterator[_Edit]:
    """Each integer literal n becomes n+1, and n-1 unless n is 0. ORDER BY / GROUP BY
    positions are left alone: they name a column, and position 0 does not exist; so is
    the constant that is the whole select list of a PERFORM or of an EXISTS subquery
    (`PERFORM 1 FROM …`, `EXISTS (SELECT 1 FROM …)`): only whether a row comes back
    is read, never what it holds."""
    positional = s.positional_keys()
    for i, token in enumerate(s.sig):
        if token.kind is Kind.NUMBER and token.text.isdigit() and i not in positional and not _unread(s, i):
            n = int(token.text)
            yield _Edit(token.start, token.start, token.end, str(n + 1))
            if n > 0:
                yield _Edit(token.start, token.start, token.end, str(n - 1))


def _unread(s: Statement, i: int) -> bool:
    """Whether token i is the whole select list of a PERFORM or an EXISTS subquery."""
    if s.word(i + 1) != "FROM" or s.word(i - 1) not in ("PERFORM", "SELECT"):
        return False
    if s.word(i - 1) == "PERFORM":
        return True
    opener = s.parent[i - 1]
    return opener >= 0 and s.at(opener).kind is Kind.OPEN and s.word(opener - 1) == "EXISTS"


_CLOCK = "LP_NOW"


def shift_clock(s: Statement) -> Iterator[_Edit]:
    """Each `lp_now()` read one microsecond late, then one microsecond early: the
    boundary of every deadline comparison moves by the smallest step the clock has."""
    for i, token in enumerate(s.sig):
        if token.word == _CLOCK and s.at(i + 1).kind is Kind.OPEN and s.partner.get(i + 1) == i + 2:
            start, end = token.start, s.at(i + 2).end
            call = s.sql[start:end]
            for sign in ("+", "-"):
                yield _Edit(start, start, end, f"({call} {sign} interval '1 microsecond')")


def drop_order_key(s: Statement) -> Iterator[_Edit]:
    """Each ORDER BY key removed; a sole key takes its whole ORDER BY clause with it."""
    for order, keys in s.order_keys():
        if len(keys) == 1:
            start, end = s.removal(order, keys[0][1])
            yield _Edit(s.at(keys[0][0]).start, start, end, "")
        elif all(a < b for a, b in keys):
            for k in range(len(keys)):
                yield _removal_of_operand(s, keys, k)


def reverse_order_key(s: Statement) -> Iterator[_Edit]:
    """Each ORDER BY key's direction toggled: none or ASC becomes DESC, DESC becomes ASC."""
    for _order, keys in s.order_keys():
        for first, stop in keys:
            if first >= stop or any(s.word(j) == "USING" for j in range(first, stop)):
                continue
            direction = stop - 2 if s.word(stop - 2) == "NULLS" else stop
            fragment = s.span(first, stop)
            last = s.at(direction - 1)
            if last.word in ("ASC", "DESC") and direction - 1 > first:
                new = {"ASC": "DESC", "DESC": "ASC"}[last.word]
                word = new if last.text.isupper() else new.lower()
                yield _rewrite(s, fragment, (last.start, last.end), word, last.start)
            else:
                yield _rewrite(s, fragment, (last.end, last.end), " DESC", s.at(first).start)


def drop_lock(s: Statement) -> Iterator[_Edit]:
    """Each row-locking clause removed whole (with its OF list and SKIP LOCKED / NOWAIT)."""
    for clause in s.locking_clauses:
        start, end = s.removal(clause.first, clause.stop)
        yield _Edit(s.at(clause.first).start, start, end, "")


def drop_skip_locked(s: Statement) -> Iterator[_Edit]:
    """SKIP LOCKED removed: the lock then waits for a row another transaction holds."""
    for clause in s.locking_clauses:
        if clause.skip_locked is not None:
            start, end = s.removal(*clause.skip_locked)
            yield _Edit(start, start, end, "")


_TRY_LOCKS = {
    "PG_ADVISORY_XACT_LOCK": "pg_try_advisory_xact_lock",
    "PG_ADVISORY_XACT_LOCK_SHARED": "pg_try_advisory_xact_lock_shared",
}


@functools.cache
def lock_only_spans(sql: str) -> tuple[tuple[int, int], ...]:
    """The text spans of what only chooses a lock: each item of a PERFORM's select list
    that is a blocking advisory-lock call, or a CASE whose every result is one. A change
    there (the key's seed, the condition that says whether to lock) alters only which
    transactions exclude each other, which one operation at a time cannot show."""
    s = Statement(sql, enums={})
    spans = []
    for i in range(len(s.sig)):
        if s.word(i) != "PERFORM":
            continue
        stop = s.scan(i + 1, lambda j: s.word(j) in ("FROM", "WHERE"))
        for first, end in s.split(i + 1, stop, lambda j: s.at(j).kind is Kind.COMMA):
            if _locks_only(s, first, end):
                spans.append(s.span(first, end))
    return tuple(spans)


_TRY_LOCK_NAMED = re.compile(r"\bpg_try_advisory\w*\s*\((?:[^()]|\([^()]*\))*\)\s+AS\s+(\w+)", re.IGNORECASE)
_SELECTED_INTO = re.compile(r"\bINTO\s+(\w+(?:\s*,\s*\w+)*)\s+FROM\b", re.IGNORECASE)


@functools.cache
def try_lock_outcomes(sql: str) -> frozenset[str]:
    """The names that carry the outcome of a try-lock in `sql`: the column a
    `pg_try_advisory_*` call is named (`... AS got`), and the variables a statement
    that names one selects into. One operation at a time every try-lock succeeds, so
    only contention can tell a change of what these decide."""
    columns = {name.lower() for name in _TRY_LOCK_NAMED.findall(sql)}
    names = set(columns)
    for statement in sql.split(";"):
        if any(re.search(rf"\b{column}\b", statement, re.IGNORECASE) for column in columns):
            for targets in _SELECTED_INTO.findall(statement):
                names.update(t.strip().lower() for t in targets.split(","))
    return frozenset(names)


def drops_try_lock_outcome(mutation: Mutation, sql: str) -> bool:
    """Whether `mutation` drops a conjunct that reads a try-lock's outcome
    (`try_lock_outcomes`): a condition that holds whenever every try-lock succeeded,
    as each does one operation at a time. (Other changes of such a conjunct, a
    comparison flipped, say, can show without contention, and stay sequential.)"""
    if mutation.operator != "drop-conjunct":
        return False
    names = try_lock_outcomes(sql)
    return any(re.search(rf"\b{name}\b", mutation.before, re.IGNORECASE) for name in names)


def _is_lock_call(s: Statement, first: int, stop: int) -> bool:
    return s.word(first) in _TRY_LOCKS and s.opens(first + 1) and s.partner[first + 1] == stop - 1


def _locks_only(s: Statement, first: int, stop: int) -> bool:
    if _is_lock_call(s, first, stop):
        return True
    if s.word(first) != "CASE" or s.partner.get(first) != stop - 1:
        return False
    results = [j for j in range(first + 1, stop - 1) if s.parent[j] == first and s.word(j) in ("THEN", "ELSE")]
    for j in results:
        after = s.scan(j + 1, lambda k: s.word(k) in ("WHEN", "ELSE"))
        if not _is_lock_call(s, j + 1, after):
            return False
    return bool(results)


def try_advisory_lock(s: Statement) -> Iterator[_Edit]:
    """A blocking advisory lock made a try-lock, whose result is ignored: when contended
    it takes no lock, so the statements it serialised run together."""
    for i, token in enumerate(s.sig):
        if token.word in _TRY_LOCKS and s.at(i + 1).kind is Kind.OPEN:
            yield _Edit(token.start, token.start, s.at(i + 1).end, _TRY_LOCKS[token.word] + "(")


def drop_assignment(s: Statement) -> Iterator[_Edit]:
    """Each `col = expr` of UPDATE … SET and DO UPDATE SET becomes `col = <target>.col`:
    the column keeps its old value and the statement stays valid. Each PL/pgSQL
    assignment `target := expr;` is skipped (the variable keeps the value it had), and
    a declaration's `:= expr` removed (the variable starts NULL)."""
    for i in range(len(s.sig)):
        if s.at(i).text == ":=" and s.parent[i] < 0:
            end = s.statement_end(i)
            if s.in_declarations(i):
                start, stop = s.removal(i, end)
                yield _Edit(s.at(i).start, start, stop, "")
            else:
                first = s.statement_start(i)
                start, stop = s.removal(first, end + 1)
                yield _Edit(s.at(first).start, start, stop, "")
            continue
        qualifier = _update_target(s, i) if s.word(i) == "SET" else None
        if qualifier is None:
            continue
        stop = s.scan(i + 1, lambda j: s.word(j) in _SET_LIST_ENDS)
        for first, end in s.split(i + 1, stop, lambda j: s.at(j).kind is Kind.COMMA):
            column = s.at(first)
            if end - first < 3 or column.kind not in (Kind.WORD, Kind.QUOTED) or s.at(first + 1).text != "=":
                continue  # only plain `col = expr`; not (a, b) = (...) nor col[1] = ...
            kept = f"{qualifier}.{column.text}"
            if s.text(first + 2, end) != kept:
                value = (s.at(first + 2).start, s.at(end - 1).end)
                yield _rewrite(s, s.span(first, end), value, kept, column.start)


def _update_target(s: Statement, set_index: int) -> str | None:
    """How a SET list refers to the row's old values: the UPDATE's alias or table name;
    for ON CONFLICT … DO UPDATE SET, the INSERT's alias or table name."""
    if s.word(set_index - 1) == "UPDATE" and s.word(set_index - 2) == "DO":
        for j in s.level_before(set_index):
            if s.word(j) == "INTO" and s.word(j - 1) == "INSERT":
                table, after = s.name_at(j + 1)
                return s.at(after + 1).text if s.word(after) == "AS" else table
        return None
    for j in s.level_before(set_index):
        if s.word(j) == "UPDATE" and s.word(j - 1) not in ("FOR", "KEY", "DO"):
            k = j + 2 if s.word(j + 1) == "ONLY" else j + 1
            table, after = s.name_at(k)
            if s.at(after).text == "*":
                after += 1
            if s.word(after) == "AS":
                after += 1
            return s.at(after).text if after < set_index else table
    return None


def replace_literal(s: Statement) -> Iterator[_Edit]:
    """Each literal value of an enum (the schema's, unless the statement was given
    others) becomes the enum's next value, cyclically."""
    enums = s.enums
    for i, token in enumerate(s.sig):
        value = _string_value(token) if token.kind is Kind.STRING else None
        if value is None:
            continue
        cast = s.at(i + 2).text.lower() if s.at(i + 1).kind is Kind.CAST else None
        candidates = [enums[cast]] if cast is not None and cast in enums else list(enums.values())
        values = next((v for v in candidates if value in v), None)
        if values is not None and len(values) > 1:
            following = values[(values.index(value) + 1) % len(values)]
            yield _Edit(token.start, token.start, token.end, "'" + following.replace("'", "''") + "'")


def drop_in_element(s: Statement) -> Iterator[_Edit]:
    """Each element of an `IN (literal, literal, …)` list of two or more removed."""
    for i in range(len(s.sig)):
        opener = i + 1
        if s.word(i) != "IN" or not s.opens(opener) or s.word(opener + 1) in _SUBQUERY_STARTS:
            continue
        elements = s.split(opener + 1, s.partner[opener], lambda j: s.at(j).kind is Kind.COMMA)
        if len(elements) >= 2 and all(_is_literal(s, a, b) for a, b in elements):
            for k in range(len(elements)):
                yield _removal_of_operand(s, elements, k)


def _is_literal(s: Statement, first: int, stop: int) -> bool:
    if s.at(first).text in ("+", "-"):
        first += 1
    if stop - first == 3 and s.at(first + 1).kind is Kind.CAST:
        stop = first + 1
    token = s.at(first)
    return stop - first == 1 and (token.kind in (Kind.STRING, Kind.NUMBER) or token.word in ("TRUE", "FALSE", "NULL"))


def drop_distinct(s: Statement) -> Iterator[_Edit]:
    """Each DISTINCT (or DISTINCT ON (…)) removed; IS [NOT] DISTINCT FROM is a comparison."""
    for i, token in enumerate(s.sig):
        if token.word != "DISTINCT" or s.word(i + 1) == "FROM":
            continue
        stop = s.partner[i + 2] + 1 if s.word(i + 1) == "ON" and s.opens(i + 2) else i + 1
        start, end = s.removal(i, stop)
        yield _Edit(token.start, start, end, "")


_NOT_PLAIN_JOINS = frozenset({"LEFT", "RIGHT", "FULL", "OUTER", "CROSS", "NATURAL"})


def left_join(s: Statement) -> Iterator[_Edit]:
    """Each plain or INNER JOIN becomes LEFT JOIN: unmatched rows of the left side survive.

    Not where its query row-locks the joined relation (FOR UPDATE/SHARE with no
    OF list, or one naming it): PostgreSQL refuses to lock the nullable side of
    an outer join, so that mutant could never run."""
    for i, token in enumerate(s.sig):
        if token.word != "JOIN" or s.word(i - 1) in _NOT_PLAIN_JOINS:
            continue
        if any(clause.of is None or set(clause.of) & _joined_names(s, i) for clause in _locks_of_query(s, i)):
            continue
        first = i - 1 if s.word(i - 1) == "INNER" else i
        new = "LEFT JOIN" if token.text.isupper() else "left join"
        yield _Edit(token.start, s.at(first).start, token.end, new)


def _joined_names(s: Statement, join: int) -> set[str]:
    """The name a query uses for the relation joined at `join`: its alias, else its table name."""
    k = join + 1
    while s.word(k) in ("LATERAL", "ONLY"):
        k += 1
    if s.opens(k):
        name, after = "", s.partner[k] + 1
    else:
        name, after = s.name_at(k)
    if s.word(after) == "AS":
        after += 1
    alias = s.at(after)
    if alias.kind in (Kind.WORD, Kind.QUOTED) and alias.word not in _ENDS_OF["ON"] | {"ON", "JOIN"}:
        return {alias.text}
    return {name} if name else set()


def _locks_of_query(s: Statement, i: int) -> list[LockingClause]:
    return [
        clause
        for clause in s.locking_clauses
        if s.parent[clause.first] == s.parent[i] and s.statement[clause.first] == s.statement[i]
    ]


def drop_on_conflict(s: Statement) -> Iterator[_Edit]:
    """An `ON CONFLICT … DO NOTHING` clause removed: a duplicate then raises."""
    for i in range(len(s.sig)):
        if s.word(i) == "ON" and s.word(i + 1) == "CONFLICT":
            do = s.scan(i + 2, lambda j: s.word(j) == "DO")
            if s.word(do) == "DO" and s.word(do + 1) == "NOTHING":
                start, end = s.removal(i, do + 2)
                yield _Edit(s.at(i).start, start, end, "")


def drop_not(s: Statement) -> Iterator[_Edit]:
    """Each NOT of a condition removed (NOT x, NOT EXISTS, NOT IN, NOT LIKE, …); not the
    NOT of IS NOT (flip-comparison's) nor of NOT NULL."""
    for i, token in enumerate(s.sig):
        unary = s.word(i - 1) != "IS" and s.word(i + 1) not in ("NULL", "DISTINCT")
        if token.word == "NOT" and s.in_condition(i) and unary:
            yield _predicate_edit(s, i, i + 1, (token.start, s.at(i + 1).start), "")


def negate_condition(s: Statement) -> Iterator[_Edit]:
    """Each condition of control flow (IF, ELSIF, WHILE, CASE WHEN, EXIT WHEN) negated
    whole, `c` becoming `NOT (c)`: the other branch is taken. Not a condition that is
    one NOT already (drop-not's)."""
    for condition in s.conditions:
        if condition.keyword not in _BRANCHES or not s.searched(condition):
            continue
        first, stop = condition.first, condition.stop
        alone = len(s.split(first, stop, lambda j: s.word(j) in ("AND", "OR"))) == 1
        if alone and s.word(first) == "NOT":
            continue
        start, end = s.span(first, stop)
        word = "NOT" if s.sql[start:end] == s.sql[start:end].upper() or s.word(first - 1).isupper() else "not"
        yield _Edit(start, start, end, f"{word} ({s.sql[start:end]})")


def drop_return(s: Statement) -> Iterator[_Edit]:
    """Each bare PL/pgSQL `RETURN;` removed: the function goes on past it."""
    for i in range(len(s.sig)):
        if s.word(i) == "RETURN" and s.at(i + 1).text == ";":
            start, end = s.removal(i, i + 2)
            yield _Edit(s.at(i).start, start, end, "")


def drop_statement(s: Statement) -> Iterator[_Edit]:
    """Each statement of a PL/pgSQL body (or of a `;`-separated list) that writes rows
    (INSERT, UPDATE, DELETE) skipped, with its `;`."""
    for i in range(len(s.sig)):
        if s.word(i) in _WRITES and s.parent[i] < 0 and s.statement_start(i) == i:
            end = s.statement_end(i)
            if end < len(s.sig):
                start, stop = s.removal(i, end + 1)
                yield _Edit(s.at(i).start, start, stop, "")


# Each operator by name, in the order mutations are listed.
_OPERATORS_BY_NAME: dict[str, Callable[[Statement], Iterator[_Edit]]] = {
    "drop-conjunct": drop_conjunct,
    "drop-disjunct": drop_disjunct,
    "flip-comparison": flip_comparison,
    "flip-arithmetic": flip_arithmetic,
    "off-by-one": off_by_one,
    "shift-clock": shift_clock,
    "drop-order-key": drop_order_key,
    "reverse-order-key": reverse_order_key,
    "drop-lock": drop_lock,
    "drop-skip-locked": drop_skip_locked,
    "try-advisory-lock": try_advisory_lock,
    "drop-assignment": drop_assignment,
    "replace-literal": replace_literal,
    "drop-in-element": drop_in_element,
    "drop-distinct": drop_distinct,
    "left-join": left_join,
    "drop-on-conflict": drop_on_conflict,
    "drop-not": drop_not,
    "negate-condition": negate_condition,
    "drop-return": drop_return,
    "drop-statement": drop_statement,
}
OPERATORS: tuple[str, ...] = tuple(_OPERATORS_BY_NAME)


def mutations(sql: str, enums: Mapping[str, tuple[str, ...]] | None = None) -> list[Mutation]:
    """Every single-site mutation of `sql`: by operator (in `OPERATORS` order), then by
    position of the site. Two sites that would give the same text give one mutation,
    and none gives back `sql` itself. `enums` defaults to the schema's."""
    statement = Statement(sql, enums)
    found: list[Mutation] = []
    for operator, edits_of in _OPERATORS_BY_NAME.items():
        seen = {sql}
        edits = sorted(edits_of(statement), key=lambda e: e.anchor)
        for edit in edits:
            mutated = sql[: edit.start] + edit.replacement + sql[edit.end :]
            if mutated in seen:
                continue
            seen.add(mutated)
            before, after = collapse_whitespace(sql[edit.start : edit.end]), collapse_whitespace(edit.replacement)
            found.append(Mutation(operator, len(seen) - 1, before, after, mutated))
    return found


__all__ = [
    "OPERATORS",
    "Kind",
    "Mutation",
    "Statement",
    "Token",
    "collapse_whitespace",
    "lock_only_spans",
    "mutations",
    "schema_enums",
    "server_text",
    "tokenize",
]
