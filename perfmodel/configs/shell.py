"""The launch command of a shell script (a Megatron-LM training script), with the script's own
variables expanded: what bash would run, for the subset of bash such scripts use.

Tokens come from shlex (POSIX rules: quotes, backslash escapes); this module takes out the
comments first (a `#` that starts a word, to its line's end: `/ck#1` and `${CKPT##*/}` keep
theirs), decides statement boundaries (a line, continued by a backslash, an open quote, an open
array, or a closing `&&`, `||` or `|`), splits a statement into its simple commands at the
control operators (`;`, `&`, `&&`, `||`, `|`: `cd $DIR && torchrun ... 2>&1 | tee $LOG` runs
torchrun) without their redirections (`> log`, `2>&1`, `&> $LOG`: no arguments), in a shell's
-c string too, and expands parameters. Understood: assignments `NAME=word`, `NAME+=word`,
`NAME[n]=word`, arrays `NAME=( ... )` and `NAME+=( ... )` (with `export`, `declare`,
`readonly`, `local` before them), function definitions (their bodies run where they are
called), and the expansions `$NAME`, `${NAME}`, `${NAME[@]}`, `${NAME[n]}`, `${#NAME}`,
`${#NAME[@]}`, `${NAME:-word}`, `${NAME-word}`, `${NAME:=word}`, `${NAME:+word}`, the removals
`${NAME#word}`, `##`, `%`, `%%` (patterns of `*`, `?` and literal characters) and bash's
integer arithmetic `$(( ... ))` (+ - * / % and parentheses over whole numbers and variables,
`$X`, `${X}` or bare; anything else refused by name). A word keeps a substitution whole, spaces
inside it too (`GBS=$(( GBS * 2 ))` is one assignment). A variable the script does not set (an
environment variable, a script argument `$1`), one it sets where perfmodel cannot tell whether
or how (inside if/for/while/case, after `&&` or `||`, in a pipeline, in a function it calls; by
`read`, `let`, `(( ))`, a loop), any other expansion (`${X/a/b}`) and a command substitution
`$( ... )` are not guessed: they expand to a marker that names them, and the reader refuses a
value it needs that holds one (`unresolved`). Single quotes do not stop an expansion here
(bash's would); Megatron-LM's example scripts do not rely on that.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from perfmodel.errors import SpecError

_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
# an array's index, brackets inside it one deep (`A[${#A[@]}]`)
_INDEX = r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]"
_ELEMENT = re.compile(r"^([A-Za-z_]\w*)(" + _INDEX + r")(\+?)=(.*)$", re.S)  # NAME[index]=word
_ARRAY = re.compile(r"^\s*(?:(?:export|declare|readonly|local)\s+(?:-\w+\s+)*)?"
                    r"([A-Za-z_]\w*)(\+?)=\((.*)\)\s*(?:#[^\n]*)?$", re.S)
# a default's word may hold braced expansions of its own (`${PP:-${DEFAULT_PP:-2}}`): braces
# balanced three deep
_BRACED = r"[^{}]*"
for _ in range(3):
    _BRACED = r"(?:[^{}]|\{" + _BRACED + r"\})*"
_PARAM = re.compile(r"\$\{#(?P<length>[A-Za-z_]\w*)(?P<lindex>" + _INDEX + r")?\}"
                    r"|\$\{(?P<name>[A-Za-z_]\w*|\d+|[@*#?$!])(?P<index>" + _INDEX + r")?"
                    r"(?:(?P<op>:?[-=+?]|##?|%%?)(?P<word>" + _BRACED + r"))?\}"
                    r"|\$(?P<simple>[A-Za-z_]\w*|\d|[@*#?$!])")
_QUOTED_ALL = re.compile(r'"\$\{([A-Za-z_]\w*)\[@\]\}"(?=[\s;&|)]|$)|"\$\{?(@)\}?"(?=[\s;&|)]|$)')
_HEREDOC = re.compile(r"<<(-?)\s*(['\"]?)([A-Za-z_]\w*)\2")
_MARK = "@@UNRESOLVED{}@@"
_MARK_RE = re.compile(r"@@UNRESOLVED(\d+)@@")
_OPEN = {"if", "for", "while", "until", "case", "{", "function"}
# what a marker of launch_command(defaults=False) says: the word holds the default of a variable
# the script does not set (an environment variable's, or a script argument's)
DEFAULTED = "the default, where it is unset, of a variable the script does not set:"
_CLOSE = {"fi", "done", "esac", "}"}
_PREFIX = {"export", "declare", "readonly", "local"}


@dataclass
class Launch:
    """The command that runs `script`: the words before it (the launcher and its options), the
    script's path and the words after it; `unresolved` names what each marker stands for."""

    launcher: list[str]
    script: str
    args: list[str]
    line: int
    unresolved: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    variables: dict[str, str] = field(default_factory=dict)  # the scalars the script sets
    exported: set[str] = field(default_factory=set)  # ... those it exports (its commands' env)

    def reason(self, word: str) -> str | None:
        """Why a word cannot be read (it holds a marker), or None."""
        found = _MARK_RE.search(word)
        return self.unresolved.get(found.group(0)) if found else None

    def bare(self, word: str) -> bool:
        """Whether a word is an unreadable variable and nothing else (`$WANDB_ARGS`), which bash
        may split into several words, options among them."""
        return _MARK_RE.fullmatch(word) is not None

    def shown(self, word: str) -> str:
        """A word with its markers written back as the references they stand for."""
        return _MARK_RE.sub(lambda m: self.unresolved[m.group(0)].split(": ")[0], word)


@dataclass
class _State:
    scalars: dict[str, str] = field(default_factory=dict)
    arrays: dict[str, list[str]] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)  # name -> why it cannot be read
    marks: dict[str, str] = field(default_factory=dict)  # marker -> what it stands for
    notes: list[str] = field(default_factory=list)
    exported: set[str] = field(default_factory=set)  # the names `export` (declare -x) marks
    # False: a variable the script does not set expands to a marker (DEFAULTED) even where its
    # reference gives a default, to tell which words hold only such a default
    defaults: bool = True

    def mark(self, what: str) -> str:
        marker = _MARK.format(len(self.marks))
        self.marks[marker] = what
        return marker


_ARITH_TOKEN = re.compile(r"\s*(?:(?P<number>\d+)|(?P<name>[A-Za-z_]\w*)"
                          r"|(?P<other>\*\*|[^\s\w()+\-*/%]+)|(?P<op>[-+*/%()]))")
_INT64 = 2**63
# what an arithmetic expression assigns: `NAME = ...` (`+=`, `*=`, ... too, not `==`), `NAME++`,
# `++NAME` and their `--`
_ARITH_SETS = re.compile(r"([A-Za-z_]\w*)\s*(?:\[[^\]]*\]\s*)?(?:<<|>>|[-+*/%&^|])?=(?!=)"
                         r"|(?:\+\+|--)\s*([A-Za-z_]\w*)|([A-Za-z_]\w*)\s*(?:\+\+|--)")


class _ArithError(ValueError):
    """Why bash's arithmetic `$(( ))` cannot be evaluated here (a name it needs, an operator)."""


def _arith(text: str, state: _State | None = None, depth: int = 0) -> int:
    """bash's integer arithmetic for + - * / % (towards zero, as C) and parentheses over decimal
    whole numbers and variables (bare names; `$X` and `${X}` are expanded before): a variable's
    value is evaluated in turn, as bash does. _ArithError names what it cannot evaluate: an
    operator it does not read, a variable the script does not set (bash would read 0; the
    environment may set it), one set inside a block, a number past bash's 64 bits."""
    tokens: list[tuple[str, str]] = []
    step = _ARITH_SETS.search(text)
    if step is not None:  # `X++`, `X=...`: bash changes X as it evaluates
        raise _ArithError(f"'{step.group(0).strip()}' assigns; perfmodel evaluates + - * / % "
                          "and parentheses")
    for found in _ARITH_TOKEN.finditer(text):
        kind = found.lastgroup or "other"
        word = found.group(kind)
        if kind == "other":
            raise _ArithError(f"perfmodel evaluates + - * / % and parentheses, not '{word}'")
        tokens.append((kind, word))
    if depth > 20:
        raise _ArithError("a variable's value refers back to itself")
    position = 0

    def peek() -> str:
        return tokens[position][1] if position < len(tokens) else ""

    def take() -> tuple[str, str]:
        nonlocal position
        if position >= len(tokens):
            raise _ArithError("an expression ends early")
        position += 1
        return tokens[position - 1]

    def bounded(number: int) -> int:
        # bash's integers are 64-bit: a number past them is not what bash computes (it wraps),
        # nor one str() can always write (4300 digits at most)
        if not -_INT64 <= number < _INT64:
            raise _ArithError("beyond bash's 64-bit integers")
        return number

    def primary() -> int:
        kind, word = take()
        if word in "+-" and kind == "op":  # a sign
            value = primary()
            return bounded(-value if word == "-" else value)
        if word == "(":
            value = expression()
            if take()[1] != ")":
                raise _ArithError("a parenthesis is not closed")
            return value
        if kind == "number":
            if len(word) > 19 or (word.startswith("0") and word != "0"):
                # bash reads 010 as octal and 0x10 as hexadecimal: decimal only here
                raise _ArithError(f"'{word}': perfmodel reads decimal numbers (no leading 0) "
                                  "within bash's 64-bit integers" if len(word) <= 19
                                  else "beyond bash's 64-bit integers")
            return bounded(int(word))
        if kind == "name":
            return variable(word)
        raise _ArithError(f"'{word}' where a number belongs")

    def variable(name: str) -> int:
        if state is not None and name in state.unknown:
            raise _ArithError(f"{name}: {state.unknown[name]}")
        if state is not None and name in state.arrays:
            items = state.arrays[name]
            value = items[0] if items else ""
        elif state is not None and name in state.scalars:
            value = state.scalars[name]
        else:
            raise _ArithError(f"{name}: not set in the script (an environment variable?)")
        marker = _MARK_RE.search(value)
        if marker is not None and state is not None:
            raise _ArithError(state.marks[marker.group(0)])
        return _arith(value, state, depth + 1) if value.strip() else 0  # bash: empty is 0

    def term() -> int:
        value = primary()
        while peek() in ("*", "/", "%") and peek():
            op = take()[1]
            right = primary()
            if op == "*":
                value = bounded(value * right)
                continue
            if right == 0:
                raise _ArithError("division by zero")
            quotient = abs(value) // abs(right) * (1 if (value < 0) == (right < 0) else -1)
            value = bounded(quotient if op == "/" else value - right * quotient)
        return value

    def expression() -> int:
        value = term()
        while peek() in ("+", "-") and peek():
            op = take()[1]
            right = term()
            value = bounded(value + right if op == "+" else value - right)
        return value

    if not tokens:
        return 0  # bash: $(( )) is 0
    try:
        value = expression()
    except RecursionError:
        raise _ArithError("nested too deeply") from None
    if position != len(tokens):
        raise _ArithError(f"'{tokens[position][1]}' after a whole expression")
    return value


def _arith_sets(text: str) -> list[str]:
    """The variables an arithmetic expression assigns (`TP*=2`, `i++`), in order."""
    names = (next(name for name in found.groups() if name) for found in
             _ARITH_SETS.finditer(text))
    return list(dict.fromkeys(names))


def _closing(text: str, start: int, pair: str = "()") -> int:
    """The index just past the ')' (pair's second) closing the '(' (its first) at text[start],
    or len(text)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {pair[0]: 1, pair[1]: -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


# The most text one expansion may make: a launch script's longest word or variable is a few
# kB (every argument of a Megatron-LM run in one array); nested variables that multiply
# (A="$B$B$B...", B="$C$C$C..."), a shell "billion laughs", would otherwise take gigabytes.
MAX_EXPANDED = 2**16


def expand(text: str, state: _State, line: int, *, quoted: bool = True) -> str:
    """text with every parameter, arithmetic and command substitution expanded (or marked);
    quoted: text as the script writes it, where single quotes keep what they enclose (as bash
    does: `'$(a'` is text); False for a word the quotes are already taken from. SpecError
    where the expansion grows past MAX_EXPANDED characters."""
    out: list[str] = []
    i, double, size = 0, False, 0
    while i < len(text):
        if out:  # each pass below appends one piece: the last one counted here
            size += len(out[-1])
            if size > MAX_EXPANDED:
                raise SpecError(f"line {line}: a variable expands to more than "
                                f"{MAX_EXPANDED:,} characters (variables that multiply one "
                                "another?); a launch script's words are far shorter")
        end = text.find("'", i + 1) if quoted and not double and text[i] == "'" else -1
        if end >= 0:
            out.append(text[i:end + 1])
            i = end + 1
        elif quoted and text[i] == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])  # an escaped character: `\$` is a dollar sign
            i += 2
        elif quoted and not double and _QUOTED_ALL.match(text, i):
            # "${NAME[@]}" and "$@": a word for each item, none for an empty array (bash's rule;
            # `""` otherwise: an empty word before the launcher, or among its arguments)
            found = _QUOTED_ALL.match(text, i)
            assert found is not None
            name = found.group(1) or found.group(2)
            if name in state.arrays and name not in state.unknown:
                out.append(" ".join(shlex.quote(item) for item in state.arrays[name]))
            else:  # "$@" (none, noted), or an array perfmodel cannot read (its marker, quoted)
                reference = _PARAM.match(found.group(0)[1:-1])
                assert reference is not None
                value = _parameter(reference, state, line)
                out.append(f'"{value}"' if value else "")
            i = found.end()
        elif quoted and text[i] == '"':
            double = not double
            out.append(text[i])
            i += 1
        elif text.startswith("$((", i):
            end = _closing(text, i + 1)
            inner = expand(text[i + 3:end - 2], state, line)  # $X and ${X} expanded
            marker = _MARK_RE.search(inner)
            try:
                if marker is not None:  # a variable it needs cannot be read: named
                    raise _ArithError(state.marks[marker.group(0)])
                out.append(str(_arith(inner, state)))
            except _ArithError as why:
                out.append(state.mark(f"{text[i:end]}: arithmetic perfmodel cannot evaluate "
                                      f"(line {line}): {why}"))
                for name in _arith_sets(inner):  # `$(( GBS *= 2 ))` sets GBS as it expands
                    state.unknown[name] = (f"set by {text[i:end]} (line {line}), arithmetic "
                                           "perfmodel does not evaluate")
            i = end
        elif text.startswith("${", i) and _PARAM.match(text, i) is None:
            end = _closing(text, i + 1, "{}")
            out.append(state.mark(f"{text[i:end]}: an expansion perfmodel does not evaluate "
                                  f"(line {line}); it reads $NAME, ${{NAME}}, ${{NAME[n]}}, "
                                  "${#NAME}, the defaults :- - := = :+ + and the removals # ## "
                                  "% %%"))
            i = end
        elif text.startswith("$(", i) or text[i] == "`":
            end = _closing(text, i + 1) if text[i] == "$" else text.find("`", i + 1) + 1 or len(
                text)
            out.append(state.mark(f"{text[i:end]}: a command substitution (line {line}); "
                                  "perfmodel does not run commands"))
            i = end
        else:
            found = _PARAM.match(text, i) if text[i] == "$" else None
            if found is None:
                out.append(text[i])
                i += 1
                continue
            out.append(_parameter(found, state, line))
            i = found.end()
    if size + (len(out[-1]) if out else 0) > MAX_EXPANDED:
        raise SpecError(f"line {line}: a variable expands to more than {MAX_EXPANDED:,} "
                        "characters (variables that multiply one another?); a launch "
                        "script's words are far shorter")
    return "".join(out)


def _position(index: str, size: int, state: _State, line: int) -> int:
    """An array's index as bash reads it (`${A[n]}`, `A[n]=word`): arithmetic over numbers and
    the script's variables, a negative one counted from the end of the array's size items.
    _ArithError where it cannot be evaluated."""
    inner = expand(index, state, line, quoted=False)
    marker = _MARK_RE.search(inner)
    if marker is not None:
        raise _ArithError(state.marks[marker.group(0)])
    position = _arith(inner, state)
    return position + size if position < 0 else position


_GLOB_UNREAD = re.compile(r"[\\'\"\[]|[?*+@!]\(")


def _removed(values: list[str], op: str, word: str, ref: str, state: _State, line: int) -> str:
    """bash's `${NAME#word}` (`##`, `%`, `%%`): from each value, the shortest (`#`, `%`) or
    longest (`##`, `%%`) prefix (`#`) or suffix (`%`) the pattern matches, removed; the pattern's
    `*` and `?` as bash's, its other characters literal. A marker where the pattern holds what
    perfmodel does not match (quotes, brackets, escapes), or it or a value cannot be read."""
    pattern = expand(word, state, line)
    unread = _GLOB_UNREAD.search(word) or _GLOB_UNREAD.search(pattern)
    if unread is not None:
        return state.mark(f"{ref}: a pattern perfmodel does not match (line {line}): "
                          f"'{unread.group(0)}'; it reads * and ? and literal characters")
    for text in (pattern, *values):
        marker = _MARK_RE.search(text)
        if marker is not None:  # it names what cannot be read
            return marker.group(0)
    regex = re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c)
                               for c in pattern), re.S)
    out = []
    for value in values:
        ends = range(len(value) + 1)
        if op.startswith("#"):
            cut = next((k for k in (ends if op == "#" else reversed(ends))
                        if regex.fullmatch(value, 0, k)), 0)
            out.append(value[cut:])
        else:
            cut = next((k for k in (reversed(ends) if op == "%" else ends)
                        if regex.fullmatch(value, k)), len(value))
            out.append(value[:cut])
    return " ".join(out)


def _parameter(found: re.Match[str], state: _State, line: int) -> str:
    name = found.group("length") or found.group("name") or found.group("simple")
    index = found.group("lindex") or found.group("index")
    op, word = found.group("op"), found.group("word")
    ref = found.group(0)
    if name in state.unknown:
        return state.mark(f"{ref}: {state.unknown[name]}")
    is_set = name in state.scalars or name in state.arrays
    value = None
    values: list[str] = []  # the words the reference stands for (an array's items for [@])
    if name in state.arrays:
        items = state.arrays[name]
        if index in ("[@]", "[*]"):
            value, values = " ".join(items), list(items)
        else:
            try:
                position = _position(index[1:-1], len(items), state, line) if index else 0
            except _ArithError as why:
                return state.mark(f"{ref}: an index perfmodel cannot evaluate (line {line}): "
                                  f"{why}")
            value = items[position] if 0 <= position < len(items) else ""
    elif name in state.scalars:
        value = state.scalars[name]
    empty = not value
    if op in ("-", ":-", "=", ":="):
        if not is_set and not state.defaults:  # the default is not the script's own value
            default = expand(word or "", state, line)
            marker = state.mark(f"{ref}: {DEFAULTED} '{default}' (line {line})")
            if op.endswith("="):
                state.scalars[name] = marker
            return marker
        if not is_set or (op.startswith(":") and empty):
            default = expand(word or "", state, line)
            if op.endswith("="):
                state.scalars[name] = default
            where = "a script argument" if name.isdigit() else "not set in the script"
            state.notes.append(f"{ref} ({where}) read as its default '{default}' (line {line})")
            return default
        return value or ""
    if op in ("+", ":+"):
        return expand(word or "", state, line) if is_set and not (op == ":+" and empty) else ""
    if name in "@*" and not index:
        # the script's own arguments as a whole (Megatron-LM's example scripts pass "$@" on to
        # pretrain_gpt.py): none here, said so; the arguments the script writes are read
        state.notes.append(f"{ref} (the script's own arguments) read as none (line {line}); "
                           "perfmodel reads the arguments the script writes")
        return ""
    if not is_set:
        what = "a script argument" if name.isdigit() or name in "@*#" else \
            "not set in the script (an environment variable?)"
        return state.mark(f"{ref}: {what}")
    if op in ("#", "##", "%", "%%"):
        return _removed(values or [value or ""], op, word or "", ref, state, line)
    if found.group("length"):  # ${#NAME}: its length; ${#NAME[@]}: how many items
        unread = _MARK_RE.search(value or "")
        if unread is not None:
            return unread.group(0)
        if index in ("[@]", "[*]"):
            return str(len(values) if name in state.arrays else 1)
        return str(len(value or ""))
    return value or ""


def _uncontinued_comments(text: str) -> str:
    """text without the backslash that ends a comment (`# --exit-duration-in-mins 1190 \\`):
    bash ends a comment at its line's end, a backslash in it continues nothing. A `#` inside
    quotes, or inside a word, starts no comment."""
    out, quote = [], ""
    for line in text.split("\n"):
        comment, i = False, 0
        while i < len(line):
            ch = line[i]
            if ch == "\\" and quote != "'":
                i += 2  # an escaped character (a quote, a #) is a character of a word
                continue
            if quote:
                quote = "" if ch == quote else quote
            elif ch in "'\"":
                quote = ch
            elif ch == "#" and (i == 0 or line[i - 1] in " \t;"):
                comment = True
                break
            i += 1
        out.append(line[:-1] if comment and line.endswith("\\") else line)
    return "\n".join(out)


def _uncommented(text: str) -> str:
    """text without its comments, as bash reads them: a `#` that starts a word, outside quotes
    and substitutions, to its line's end. A `#` inside a word (`/ckpt/${CKPT##*/}`, `/ck#1`,
    `$#`) is a character of the word."""
    out: list[str] = []
    i, quote, start_of_word = 0, "", True
    while i < len(text):
        ch = text[i]
        end = i + 2 if ch == "\\" and quote != "'" else \
            _substitution_end(text, i) if quote != "'" else i
        if end > i:  # an escaped character, or a substitution: part of a word
            out.append(text[i:end])
            i, start_of_word = end, False
            continue
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and start_of_word:
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        out.append(ch)
        start_of_word = not quote and ch in " \t\n;&|()<>"
        i += 1
    return "".join(out)


def _statements(text: str) -> list[tuple[int, str]]:
    """(first line, text without comments) of each statement: a line with its backslash
    continuations, more lines while a quote or an array `NAME=(` is open or the line ends in
    `&&`, `||` or `|`; a here-document's lines (`cat <<EOT > file` up to `EOT`) are its
    command's data, not statements."""
    text = re.sub(r"\\\n", " ", _uncontinued_comments(text))
    out, pending, start = [], "", 0
    here: tuple[str, bool] | None = None  # the here-document's delimiter, whether <<- (tabs)
    for number, line in enumerate(text.split("\n"), 1):
        if here is not None:
            if (line.lstrip("\t") if here[1] else line) == here[0]:
                here = None
            continue
        if not pending:
            start = number
        pending = f"{pending}\n{line}" if pending else line
        bare = _uncommented(pending)
        try:
            words = shlex.split(bare)
        except ValueError:  # an open quote: the statement goes on
            continue
        head = _skip_prefix(words)
        if head and re.match(r"^[A-Za-z_]\w*\+?=\(", head[0]) and \
                sum(w.count("(") - w.count(")") for w in words) > 0:
            continue  # an open array (its parentheses, $(( )) inside it too, not balanced)
        if re.search(r"(?:&&|\|&?)\s*$", bare) and not _HEREDOC.search(bare):
            continue  # `cond &&` at a line's end: the list goes on at the next line
        if words:
            out.append((start, bare))
            found = _HEREDOC.search(bare)
            if found:
                here = (found.group(3), found.group(1) == "-")
        pending = ""
    if pending.strip():
        raise SpecError(f"unterminated quote, array or list (a line ending in && || |) from "
                        f"line {start}")
    return out


_HELD = "@@HELD{}@@"
_HELD_RE = re.compile(r"@@HELD(\d+)@@")


def _split_raw(text: str) -> list[str]:
    """A statement split into words as bash splits it before expanding: a substitution `$( )`,
    `$(( ))` or backquoted, spaces inside it, stays within its word (`GBS=$(( GBS * 2 ))` is one
    assignment); shlex's rules otherwise."""
    held: list[str] = []
    out, i, quote = [], 0, ""
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "'":
            out.append(text[i:i + 2])
            i += 2
            continue
        if quote == "'" or (ch in "'\"" and not quote):
            quote = "" if ch == quote else (quote or ch)
        elif quote == '"' and ch == '"':
            quote = ""
        if quote != "'" and (text.startswith("$(", i) or ch == "`"):
            end = _closing(text, i + 1) if ch == "$" else text.find("`", i + 1) + 1 or len(text)
            out.append(_HELD.format(len(held)))
            held.append(text[i:end])
            i = end
            continue
        out.append(ch)
        i += 1
    try:
        words = shlex.split("".join(out))
    except ValueError:  # a quote inside a substitution perfmodel took whole: shlex's words
        return shlex.split(text)
    return [_HELD_RE.sub(lambda m: held[int(m.group(1))], w) for w in words]


_REDIRECT = re.compile(r"(\d*)(&>>|&>|>>|>\||>&|<<<|<<-|<<|<>|<&|>|<)")
# an example script's placeholder (Megatron-LM's v2 scripts: `--vocab-file <PATH TO
# gpt-vocab.json>`), which bash would read as redirections: `<` at a word's start, `>` ending one
_PLACEHOLDER = re.compile(r"<[^\s<>;&|][^<>;&|\n]*[^\s<>;&|]>(?=[\s;&|]|$)")
_BETWEEN = ("||", "&&", "|&", ";;", "|", ";", "&", "\n")
_RESERVED = {"then", "do", "else", "elif", "if", "while", "until", "!", "{", "}", "(", ")",
             "time", "fi", "done", "esac"}


def _substitution_end(text: str, i: int) -> int:
    """The index past a `$( )`, `$(( ))`, `${ }` or backquoted substitution starting at i, or i
    when none starts there."""
    if text.startswith("$(", i):
        return _closing(text, i + 1)
    if text.startswith("${", i):
        end = text.find("}", i)
        return end + 1 if end >= 0 else len(text)
    if text[i] == "`":
        return text.find("`", i + 1) + 1 or len(text)
    return i


def _commands(text: str) -> list[str]:
    """The simple commands of a statement (_listed's, without their operators)."""
    return [command for _, command, _ in _listed(text)]


def _listed(text: str) -> list[tuple[str, str, str]]:
    """(operator before, command, operator after) of each simple command of a statement, as
    bash splits it before expanding: at the control operators outside quotes and substitutions
    (`;`, `&`, `&&`, `||`, `|`, `|&`, a newline), without their redirections (`> log`, `2>&1`,
    `&> $LOG`, `<<EOF`: the operator and its word), which are no arguments of the command. The
    operator before a command is the first after the command before it (`cond &&` at a line's
    end: `&&`); '' at the statement's ends."""
    out: list[str] = []
    operators: list[str] = []
    current: list[str] = []
    i, quote, start_of_word = 0, "", True
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\" and quote == '"':
                current.append(text[i:i + 2])
                i += 2
                continue
            end = _substitution_end(text, i) if quote == '"' else i
            if end > i:
                current.append(text[i:end])
                i = end
                continue
            quote = "" if ch == quote else quote
            current.append(ch)
            i += 1
            continue
        if ch == "\\":
            current.append(text[i:i + 2])
            i += 2
            start_of_word = False
            continue
        if ch in "'\"":
            quote = ch
            current.append(ch)
            i += 1
            start_of_word = False
            continue
        end = _substitution_end(text, i)
        if end > i:
            current.append(text[i:end])
            i = end
            start_of_word = False
            continue
        if ch == "#" and start_of_word:  # a comment: to the line's end
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        placeholder = _PLACEHOLDER.match(text, i) if start_of_word else None
        if placeholder:  # `<PATH TO gpt-vocab.json>`, for the user to fill in: words, as shown
            current.append(placeholder.group(0))
            i = placeholder.end()
            start_of_word = False
            continue
        redirect = _REDIRECT.match(text, i)
        if redirect and (start_of_word or not redirect.group(1)):
            i = _word_end(text, redirect.end())  # the operator and its word, dropped
            current.append(" ")
            start_of_word = True
            continue
        between = next((op for op in _BETWEEN if text.startswith(op, i)), None)
        if between:
            out.append("".join(current))
            operators.append(between)
            current = []
            i += len(between)
            start_of_word = True
            continue
        current.append(ch)
        start_of_word = ch in " \t"
        i += 1
    out.append("".join(current))
    operators.append("")
    listed, before = [], ""
    for command, after in zip(out, operators, strict=True):
        if command.strip():
            listed.append((before, command, after))
            before = after
    return listed


def _word_end(text: str, i: int) -> int:
    """The index past the word after a redirection (blanks before it skipped): quotes and
    substitutions inside it kept whole, ended by a blank or an operator."""
    while i < len(text) and text[i] in " \t":
        i += 1
    quote = ""
    while i < len(text):
        ch = text[i]
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "\\":
            i += 1
        elif _substitution_end(text, i) > i:
            i = _substitution_end(text, i)
            continue
        elif ch in " \t\n;&|<>":
            break
        i += 1
    return i


def _skip_reserved(words: list[str]) -> list[str]:
    """A command's words without the reserved words before it (`then X=1`, `do ...`)."""
    i = 0
    while i < len(words) and words[i] in _RESERVED:
        i += 1
    return words[i:]


def _skip_prefix(words: list[str]) -> list[str]:
    i = 0
    while i < len(words) and (words[i] in _PREFIX or (i and words[i].startswith("-")
                                                       and words[0] in _PREFIX)):
        i += 1
    return words[i:]


LAUNCHERS = ("torchrun", "python", "python3", "deepspeed", "srun", "mpirun", "uv", "exec",
             "numactl", "nsys", "nohup", "env")


def _skip_assignments(words: list[str]) -> list[str]:
    """words without the environment assignments before a command (`A=1 torchrun ...`)."""
    i = 0
    while i < len(words) and _ASSIGN.match(words[i]):
        i += 1
    return words[i:]


def _launches(words: list[str], is_script: Callable[[str], bool]) -> bool:
    """Whether a command runs the script: the script itself, or a launcher (torchrun, python,
    ...) whose words include it; `echo`, `[` and the like only mention it."""
    if not words or not any(is_script(w) for w in words):
        return False
    words = words[_unreadable_prefix(words):]
    first = words[0].rsplit("/", 1)[-1] if words else ""
    return bool(words) and (is_script(words[0]) or first in LAUNCHERS
                            or re.fullmatch(r"python3\.\d+", first) is not None)


def _unreadable_prefix(words: list[str]) -> int:
    """How many words before a command are unreadable variables (`$VENV_PREFIX torchrun`, the
    prefix set under an if): a wrapper of the command perfmodel reads past (the launch names
    them)."""
    i = 0
    while i < len(words) - 1 and _MARK_RE.fullmatch(words[i]):
        i += 1
    return i


def _shell_command(words: list[str], is_script: Callable[[str], bool]) -> list[str] | None:
    """The command a shell runs from its -c string that runs the training script (`srun ... sh
    -c "python pretrain_gpt.py ..."`, as Megatron-LM's example scripts launch), split into
    words; the string is shell code, its operators and redirections read as such. None without
    one."""
    for i, word in enumerate(words[:-2]):
        if word.rsplit("/", 1)[-1] in ("sh", "bash") and words[i + 1] == "-c":
            for command in _commands(words[i + 2]):
                try:
                    inner = _skip_assignments(_skip_reserved(shlex.split(command)))
                except ValueError:
                    return None
                if _launches(inner, is_script):
                    return inner
            return None
    return None


def _words(text: str, where: str, line: int) -> list[str]:
    """A statement (its comments taken out before, as _statements does) split into words once
    its variables are expanded: a `#` a value brings in starts no comment. SpecError when a
    quote a variable's value brought in is left open (bash would not reread it as a quote)."""
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise SpecError(f"{where}: line {line}: {str(exc).lower()} once the script's variables "
                        "are expanded (a quote inside a variable's value?); perfmodel cannot "
                        "split it into words") from None


def _operands(words: list[str], taking: str) -> tuple[list[str], dict[str, str]]:
    """A builtin's operands, and the words its options in `taking` take (`read -a NAME -p
    PROMPT`: {'a': 'NAME', 'p': 'PROMPT'}); the other options take none."""
    operands: list[str] = []
    values: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":
            operands += words[i:]
            break
        if operands or not word.startswith("-") or word == "-":
            operands.append(word)
            continue
        for k, flag in enumerate(word[1:], 2):
            if flag in taking:  # its word: the rest of this one, or the next
                values[flag] = word[k:] or (words[i] if i < len(words) else "")
                i += 0 if word[k:] else 1
                break
    return operands, values


def _sets(words: list[str], line: int) -> tuple[list[str], str] | None:
    """The variables a command sets where perfmodel cannot tell their values, and why: `read`,
    `mapfile` (`readarray`), `printf -v` and `getopts` set them from what perfmodel does not
    see; `let` and `(( ))` by arithmetic it does not evaluate; `for` and `select` loop over
    them. None for any other command."""
    if not words:
        return None
    head, shown = words[0], " ".join(words)
    if head.startswith("((") or head == "let":
        expression = shown[2:].removesuffix("))") if head.startswith("((") else shown[3:]
        return _arith_sets(expression), (f"set by {shown} (line {line}), arithmetic perfmodel "
                                         "does not evaluate")
    if head in ("for", "select") and len(words) > 1:
        names = words[1:2] if re.fullmatch(r"[A-Za-z_]\w*", words[1]) else \
            _arith_sets(" ".join(words[1:]))  # for ((i = 0; ...
        return names, f"set by a {head} loop (line {line})"
    why = f"set by {shown} (line {line}), from what perfmodel does not read"
    if head == "read":
        operands, values = _operands(words[1:], "adinNptu")
        return (operands + [values["a"]] if "a" in values else operands or ["REPLY"]), why
    if head in ("mapfile", "readarray"):
        operands, _ = _operands(words[1:], "dnOsuCc")
        return operands[:1] or ["MAPFILE"], why
    if head == "printf":
        _, values = _operands(words[1:3], "v")  # printf -v NAME FORMAT ...
        return ([values["v"]], why) if "v" in values else None
    if head == "getopts":
        return words[2:3] + ["OPTARG", "OPTIND"], why
    return None


def _bounded(name: str, size: int, line: int) -> None:
    """Refuse a variable that holds more than MAX_EXPANDED characters (grown by `+=` line by
    line, or an array of many long items), as expand refuses one expansion that makes them."""
    if size > MAX_EXPANDED:
        raise SpecError(f"line {line}: {name} holds more than {MAX_EXPANDED:,} characters "
                        "(variables that multiply one another?); a launch script's words are "
                        "far shorter")


def _assign(word: str, state: _State, line: int, unsure: str | None) -> None:
    """An assignment `NAME=word` or `NAME+=word`, or an array's element `NAME[index]=word`
    (`+=`), recorded as bash makes it: the index is arithmetic, a negative one counts from the
    end, one just past the end appends; `NAME+=word` on an array appends to its first item; an
    element given to a scalar makes it an array whose first item the scalar was. unsure: why
    the value cannot be read (the name is marked with it instead)."""
    element = _ELEMENT.match(word)
    found = element or _ASSIGN.match(word)
    assert found is not None
    name = found.group(1)
    if unsure is not None:
        state.unknown[name] = unsure
        return
    if element is not None:
        index, plus, value = element.group(2)[1:-1], element.group(3), element.group(4)
    else:
        plus, value = found.group(2, 3)
        if not (plus and name in state.arrays):
            value = expand(value, state, line, quoted=False)
            value = (state.scalars.get(name, "") if plus else "") + value
            _bounded(name, len(value), line)
            state.scalars[name] = value
            state.arrays.pop(name, None)
            if not plus:
                state.unknown.pop(name, None)
            return
        index = "0"
    if name in state.unknown:  # an item of an array perfmodel cannot read: still unread
        return
    items = list(state.arrays.get(name, [state.scalars[name]] if name in state.scalars else []))
    try:
        position = _position(index, len(items), state, line)
    except _ArithError as why:
        state.unknown[name] = (f"{name}[{index}] set with an index perfmodel cannot evaluate "
                               f"(line {line}): {why}")
        return
    if not 0 <= position <= len(items):
        state.unknown[name] = (f"{name}[{index}] set past the array's end (line {line}); "
                               "perfmodel reads arrays without gaps")
        return
    value = expand(value, state, line, quoted=False)
    if position == len(items):
        items.append(value)
    else:
        items[position] = (items[position] if plus else "") + value
    _bounded(name, sum(map(len, items)), line)
    state.arrays[name] = items
    state.scalars.pop(name, None)


def _assign_array(found: re.Match[str], state: _State, where: str, line: int,
                  unsure: str | None) -> None:
    """An array assignment `NAME=( ... )` or `NAME+=( ... )` (_ARRAY's match) recorded: its
    items, the words of what the parentheses hold once expanded (`+=`: after the array's, or
    after a scalar's value); unsure: why it cannot be read (the name is marked instead), as
    for an item given an explicit index (`[3]=word`), which perfmodel does not place."""
    name, plus, body = found.groups()
    explicit = next((w for w in _split_raw(body) if re.match(r"\[[^\]]*\]=", w)), None)
    if unsure is None and explicit is not None:
        unsure = (f"set with an explicit index, {explicit} (line {line}); perfmodel reads the "
                  "items of an array in order")
    if unsure is not None:
        state.unknown[name] = unsure
        return
    items = _words(expand(body, state, line), where, line)
    before = state.arrays.get(name, [state.scalars[name]] if name in state.scalars else [])
    items = (before if plus else []) + items
    _bounded(name, sum(map(len, items)), line)
    state.arrays[name] = items
    state.scalars.pop(name, None)
    if not plus:
        state.unknown.pop(name, None)


def _array(text: str) -> re.Match[str] | None:
    """The array assignment (_ARRAY's match) that is the whole of text, or None: its
    parentheses, quotes within them kept whole, close at its end (not `A=(1); B=(2)`)."""
    found = _ARRAY.match(text)
    if found is None:
        return None
    depth, quote, i = 0, "", found.start(3) - 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and quote != "'":
            i += 2
            continue
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "()":
            depth += 1 if ch == "(" else -1
            if depth == 0:
                return found if i == found.end(3) else None
        i += 1
    return None


def _placed(before: str, after: str, line: int) -> str | None:
    """Why a variable a command sets cannot be read from where the command stands in its list:
    after `&&` or `||` it may not run; in a pipeline or in the background bash runs it in a
    subshell, whose variables are not the script's. None where it runs in the script's shell."""
    if before in ("&&", "||"):
        return f"set after {before} (line {line}), where perfmodel cannot tell whether it runs"
    if before in ("|", "|&") or after in ("|", "|&", "&"):
        return f"set in a pipeline or in the background (line {line}), a subshell's variable"
    return None


def _command(text: str, state: _State, where: str, line: int, unsure: str | None,
             is_script: Callable[[str], bool]) -> list[str] | None:
    """One simple command: its assignments recorded, or its words once expanded where it runs
    the training script (itself, or through a shell's -c string). unsure: why a variable it
    sets cannot be read (it stands inside a block, after `&&`, in a function, ...), the names
    then marked with it; None where it runs as read."""
    raw = _skip_reserved(_split_raw(text))
    exporting = bool(raw) and (raw[0] == "export" or (raw[0] in _PREFIX and any(
        w.startswith("-") and "x" in w for w in raw[1:] if w.startswith("-"))))
    if raw[:1] == ["unset"] and unsure is None:  # the variables it names are gone
        for name in (w for w in raw[1:] if not w.startswith("-")):
            state.scalars.pop(name, None)
            state.arrays.pop(name, None)
            state.unknown.pop(name, None)
            state.exported.discard(name)
        return None
    sets = _sets(_skip_assignments(raw), line)
    if sets is not None:  # read TP, let TP=TP*2, ((TP *= 2)): not evaluated, the names marked
        names, why = sets
        for name in names:
            state.unknown[name.split("[")[0]] = why
        return None
    words = _skip_prefix(raw)
    if exporting:  # `export A B=1`: each name exported (each name set is marked where unsure)
        named = [w.split("=", 1)[0].split("+")[0] for w in words if not w.startswith("-")]
        if unsure is None:
            state.exported.update(named)
        else:
            state.exported.update(n for n, w in zip(named, words, strict=False) if "=" in w)
        if words and all(not _ASSIGN.match(w) for w in words):
            return None  # names only: no assignment, no command
    assigns = []
    while words and (_ASSIGN.match(words[0]) or _ELEMENT.match(words[0])):
        assigns.append(words[0])
        words = words[1:]
    if assigns and not words:  # assignments alone (an environment prefix otherwise)
        for word in assigns:
            _assign(word, state, line, unsure)
        return None
    expanded = _skip_assignments(_skip_reserved(_words(expand(text, state, line), where, line)))
    if expanded[:1] in (["source"], ["."]) and len(expanded) > 1:
        # another file's commands, run in this shell: not read (it may set the variables read
        # after it), said so
        state.notes.append(f"{' '.join(text.split())} (line {line}) is not read: a variable it "
                           "sets is not seen here (the values read are this script's own)")
        return None
    if expanded[:1] == ["eval"]:  # its words, joined, are shell code again (operators too)
        expanded = ["sh", "-c", " ".join(expanded[1:])]
    if _launches(expanded, is_script):
        return expanded
    return _shell_command(expanded, is_script)


# a function's definition: `NAME() {`, `NAME () {`, `function NAME {`, `function NAME() {`,
# its body (from the brace) in `body`
_FUNCTION = re.compile(r"\s*(?:function\s+(?P<keyword>[A-Za-z_][\w.:-]*)(?:\s*\(\s*\))?"
                       r"|(?P<name>[A-Za-z_][\w.:-]*)\s*\(\s*\))(?P<body>(?:\s|\{).*)?$", re.S)
# an array assignment's start, whole or not
_ARRAY_START = re.compile(r"\s*(?:(?:export|declare|readonly|local)\s+(?:-\w+\s+)*)?"
                          r"[A-Za-z_]\w*\+?=\(")


@dataclass
class _Function:
    """A function the script defines: its name, the line of its definition, and its body's
    commands (line, operator before, command, operator after), which run where it is called."""

    name: str
    line: int
    body: list[tuple[int, str, str, str]] = field(default_factory=list)
    depth: int = 0  # the braces `{` its definition has open
    called: bool = False

    def take(self, line: int, listed: tuple[str, str, str], where: str) -> bool:
        """The next command of the definition (the first opens its `{`); True where it closes
        the body."""
        before, command, after = listed
        words = _split_raw(command)
        if self.depth == 0 and words[:1] != ["{"]:
            raise SpecError(f"{where}: line {line}: function {self.name}'s body is not a group "
                            f"{{ ... }}; perfmodel reads a function written {self.name}() "
                            "{ ...; }")
        nested = _FUNCTION.match(command)  # a function defined inside: its braces count
        for word in _split_raw(nested.group("body") or "") if nested else words:
            if word not in _RESERVED:
                break
            self.depth += {"{": 1, "}": -1}.get(word, 0)
        self.body.append((line, before, command, after))
        return self.depth <= 0

    def names(self, is_script: Callable[[str], bool]) -> bool:
        """Whether a command of its body names the training script."""
        return any(is_script(w) for _, _, command, _ in self.body for w in _split_raw(command))


@dataclass
class _Reader:
    """launch_command's pass over a script's commands, in the order they run: the state of its
    variables, the functions it defines, and each command found that runs the training script
    (line, why perfmodel cannot read it as the launch or None, its words)."""

    state: _State
    where: str
    is_script: Callable[[str], bool]
    functions: dict[str, _Function] = field(default_factory=dict)
    found: list[tuple[int, str | None, list[str]]] = field(default_factory=list)
    calling: list[_Function] = field(default_factory=list)  # the calls under way, innermost last
    in_function: str | None = None  # why a launch inside a called function is not read

    def run(self, line: int, listed: tuple[str, str, str], unsure: str | None,
            refusal: str | None) -> None:
        """One command as it runs: an array assignment, a call of a function the script defines
        (its body run), or a simple command (_command). unsure: why a variable it sets cannot
        be read (a block, a function), or None; refusal: why a launch here is not read."""
        before, command, after = listed
        unsure = unsure or _placed(before, after, line)
        array = _array(command)
        if array is not None:
            _assign_array(array, self.state, self.where, line, unsure)
            return
        if _ARRAY_START.match(command):
            raise SpecError(f"{self.where}: line {line}: an array assignment that does not end "
                            "its command; perfmodel reads NAME=( ... ) as a command of its own")
        words = _skip_assignments(_skip_reserved(_split_raw(command)))
        function = self.functions.get(words[0]) if words else None
        if function is not None:
            self.call(function, line, words)
            return
        launched = _command(command, self.state, self.where, line, unsure, self.is_script)
        if launched is not None:
            self.found.append((line, refusal, launched))
            if self.calling and self.in_function is None:
                self.in_function = refusal

    def call(self, function: _Function, line: int, words: list[str]) -> None:
        """A call of a function: its body run where the call stands, every variable it sets
        marked (perfmodel does not follow its arguments, its `local`s or its `return`), a
        launch inside it refused."""
        function.called = True
        if any(f is function for f in self.calling):  # a recursion (bash's stops somewhere)
            return
        outer = self.calling[0] if self.calling else function
        at = f"function {function.name} (line {function.line}), called at line {line}" if \
            outer is function else f"function {function.name} (line {function.line}), " \
            f"called by {outer.name} at line {line}"
        refusal = (f"the training script runs inside {at}; perfmodel reads a launch written "
                   "outside a function")
        if any(self.is_script(w) for w in words):  # `train pretrain_gpt.py ...`
            self.found.append((line, refusal, words))
            self.in_function = self.in_function or refusal
        self.calling.append(function)
        for body_line, before, command, after in function.body:
            self.run(body_line, (before, command, after), f"set inside {at}", refusal)
        self.calling.pop()

    def launch(self) -> Launch | None:
        """The launch found (SpecError where it is not one perfmodel reads), or None."""
        state, found, where = self.state, self.found, self.where
        if not found:
            idle = next((f for f in self.functions.values()
                         if not f.called and f.names(self.is_script)), None)
            if idle is not None:  # bash runs no launch: not read as if it did
                raise SpecError(f"{where}: the training script runs only inside function "
                                f"{idle.name} (line {idle.line}), which the script does not "
                                "call; perfmodel reads the command that runs it")
            return None
        if self.in_function is not None:
            raise SpecError(f"{where}: {self.in_function}")
        if len(found) > 1:
            lines = ", ".join(str(f[0]) for f in found)
            raise SpecError(f"{where}: more than one command runs the training script (lines "
                            f"{lines}); perfmodel reads one launch: keep one")
        line, refusal, words = found[0]
        if refusal is not None:
            raise SpecError(f"{where}: {refusal}")
        at = next(i for i, w in enumerate(words) if self.is_script(w))
        variables = dict(state.scalars)  # those it may set are their markers
        variables.update({name: state.mark(f"${name}: {why}")
                          for name, why in state.unknown.items()})
        return Launch(launcher=words[:at], script=words[at], args=words[at + 1:], line=line,
                      unresolved=dict(state.marks), notes=list(state.notes),
                      variables=variables, exported=set(state.exported))


def launch_command(text: str, where: str, is_script: Callable[[str], bool], *,
                   defaults: bool = True) -> Launch | None:
    """The command of the script that runs a word `is_script` accepts (e.g. pretrain_gpt.py),
    with the script's variables expanded; None when no statement runs one. SpecError when more
    than one does, or the one that does is inside a condition, a loop or a function (a
    function's body is read where it is called, and not where it is not). defaults False: a
    variable the script does not set expands to a marker whatever default its reference gives
    (`${SLURM_NNODES:-1}`: DEFAULTED), so that Launch.reason tells the words that hold only such
    a default, which the environment may override."""
    reader = _Reader(_State(defaults=defaults), where, is_script)
    depth, defining = 0, None
    for line, statement in _statements(text):
        try:
            raw_words = _split_raw(statement)
            commands = _commands(statement)
            for command in commands:
                _split_raw(command)
        except ValueError as exc:  # a quote a substitution or an operator left open
            raise SpecError(f"{where}: line {line}: {str(exc).lower()} in a command of the "
                            "statement; perfmodel cannot split it into words") from None
        # an array over several lines is one command (_listed would split it at its lines)
        listed = [("", statement, "")] if _array(statement) else _listed(statement)
        top = []  # the commands outside a function's definition
        for before, command, after in listed:
            header = _FUNCTION.match(command) if defining is None else None
            if header is not None:  # its body runs where it is called
                defining = _Function(header.group("keyword") or header.group("name"), line)
                command = header.group("body") or ""
                if not command.strip():
                    continue
            elif defining is None:
                top.append((before, command, after))
                continue
            if defining.take(line, (before, command, after), where):
                reader.functions[defining.name] = defining
                defining = None
        if len(top) < len(listed):
            raw_words = [w for _, command, _ in top for w in _split_raw(command)]
        opened = sum(w.rstrip(";") in _OPEN for w in raw_words) + sum(
            w.endswith("()") and "=" not in w for w in raw_words)
        closed = sum(w.lstrip(";").rstrip(";") in _CLOSE for w in raw_words)
        inside = depth > 0 or opened > 0
        for part in top:
            try:
                reader.run(line, part, f"set inside an if/for/while/case block (line {line})"
                           if inside else None,
                           f"the training script runs inside an if/for/while/case block (line "
                           f"{line}); perfmodel cannot tell whether that branch runs"
                           if inside else None)
            except SpecError as exc:
                if str(exc).startswith("line "):  # expand's, which knows no file name
                    raise SpecError(f"{where}: {exc}") from None
                raise
        depth = max(0, depth + opened - closed)
    if defining is not None:
        raise SpecError(f"{where}: function {defining.name} (line {defining.line}) has no "
                        "closing '}'")
    return reader.launch()


def argument_words(text: str, where: str) -> Launch:
    """A plain file of arguments (no launch command): its words, comments dropped as bash drops
    them (a `#` starting a word, to its line's end); a `$` in it is a reference perfmodel cannot
    resolve (the file sets no variables)."""
    state = _State()
    text = _uncommented(re.sub(r"\\\n", " ", _uncontinued_comments(text)))
    try:
        words = shlex.split(expand(text, state, 1))
    except ValueError as exc:
        raise SpecError(f"{where}: cannot split into arguments: {exc}") from None
    return Launch(launcher=[], script="", args=words, line=1, unresolved=dict(state.marks),
                  notes=list(state.notes))
