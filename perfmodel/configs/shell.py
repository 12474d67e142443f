"""The launch command of a shell script (a Megatron-LM training script), with the script's own
variables expanded: what bash would run, for the subset of bash such scripts use.

Tokens come from shlex (POSIX rules: quotes, backslash escapes, comments); this module only
decides statement boundaries (a line, continued by a backslash, an open quote or an open array),
splits a statement into its simple commands at the control operators (`;`, `&`, `&&`, `||`,
`|`: `cd $DIR && torchrun ... 2>&1 | tee $LOG` runs torchrun) without their redirections
(`> log`, `2>&1`, `&> $LOG`: no arguments), in a shell's -c string too, and expands
parameters. Understood: assignments `NAME=word`, `NAME+=word`, arrays `NAME=( ... )` and
`NAME+=( ... )` (with `export`, `declare`, `readonly`, `local` before them), and the expansions
`$NAME`, `${NAME}`, `${NAME[@]}`, `${NAME[n]}`, `${NAME:-word}`, `${NAME-word}`, `${NAME:=word}`,
`${NAME:+word}` and bash's integer arithmetic `$(( ... ))` (+ - * / % and parentheses over
whole numbers and variables, `$X`, `${X}` or bare; anything else refused by name). A word keeps
a substitution whole, spaces inside it too (`GBS=$(( GBS * 2 ))` is one assignment). A
variable the script does not set (an environment variable, a script argument `$1`), one it sets
inside if/for/while/case or a function, and a command substitution `$( ... )` are not guessed:
they expand to a marker that names them, and the reader refuses a value it needs that holds
one (`unresolved`). Single quotes do not stop an expansion here (bash's would); Megatron-LM's
example scripts do not rely on that.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from perfmodel.errors import SpecError

_ASSIGN = re.compile(r"^([A-Za-z_]\w*)(\+?)=(.*)$", re.S)
_ARRAY = re.compile(r"^\s*(?:(?:export|declare|readonly|local)\s+(?:-\w+\s+)*)?"
                    r"([A-Za-z_]\w*)(\+?)=\((.*)\)\s*(?:#[^\n]*)?$", re.S)
# a default's word may hold braced expansions of its own (`${PP:-${DEFAULT_PP:-2}}`): braces
# balanced three deep
_BRACED = r"[^{}]*"
for _ in range(3):
    _BRACED = r"(?:[^{}]|\{" + _BRACED + r"\})*"
_PARAM = re.compile(r"\$\{(?P<name>[A-Za-z_]\w*|\d+|[@*#?$!])(?P<index>\[[^\]]*\])?"
                    r"(?:(?P<op>:?[-=+?])(?P<word>" + _BRACED + r"))?\}"
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


class _ArithError(ValueError):
    """Why bash's arithmetic `$(( ))` cannot be evaluated here (a name it needs, an operator)."""


def _arith(text: str, state: _State | None = None, depth: int = 0) -> int:
    """bash's integer arithmetic for + - * / % (towards zero, as C) and parentheses over decimal
    whole numbers and variables (bare names; `$X` and `${X}` are expanded before): a variable's
    value is evaluated in turn, as bash does. _ArithError names what it cannot evaluate: an
    operator it does not read, a variable the script does not set (bash would read 0; the
    environment may set it), one set inside a block, a number past bash's 64 bits."""
    tokens: list[tuple[str, str]] = []
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


def _arith_or_none(text: str) -> int | None:
    """_arith over numbers alone, or None (an array's index)."""
    try:
        return _arith(text)
    except _ArithError:
        return None


def _closing(text: str, start: int) -> int:
    """The index just past the ')' closing the '(' at text[start] (or len(text))."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


def expand(text: str, state: _State, line: int, *, quoted: bool = True) -> str:
    """text with every parameter, arithmetic and command substitution expanded (or marked);
    quoted: text as the script writes it, where single quotes keep what they enclose (as bash
    does: `'$(a'` is text); False for a word the quotes are already taken from."""
    out, i, double = [], 0, False
    while i < len(text):
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
    return "".join(out)


def _parameter(found: re.Match[str], state: _State, line: int) -> str:
    name = found.group("name") or found.group("simple")
    index, op, word = found.group("index"), found.group("op"), found.group("word")
    ref = found.group(0)
    if name in state.unknown:
        return state.mark(f"{ref}: {state.unknown[name]}")
    is_set = name in state.scalars or name in state.arrays
    value = None
    if name in state.arrays:
        items = state.arrays[name]
        if index in ("[@]", "[*]"):
            value = " ".join(items)
        else:
            position = _arith_or_none(index[1:-1]) if index else 0
            value = items[position] if position is not None and 0 <= position < len(items) \
                else ""
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


def _statements(text: str) -> list[tuple[int, str]]:
    """(first line, text) of each statement: a line with its backslash continuations, more lines
    while a quote or an array `NAME=(` is open; a here-document's lines (`cat <<EOT > file`
    up to `EOT`) are its command's data, not statements."""
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
        try:
            words = shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the statement goes on
            continue
        head = _skip_prefix(words)
        if head and re.match(r"^[A-Za-z_]\w*\+?=\(", head[0]) and \
                sum(w.count("(") - w.count(")") for w in words) > 0:
            continue  # an open array (its parentheses, $(( )) inside it too, not balanced)
        if words:
            out.append((start, pending))
            found = _HEREDOC.search(pending)
            if found:
                here = (found.group(3), found.group(1) == "-")
        pending = ""
    if pending.strip():
        raise SpecError(f"unterminated quote or array from line {start}")
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
        words = shlex.split("".join(out), comments=True)
    except ValueError:  # a quote inside a substitution perfmodel took whole: shlex's words
        return shlex.split(text, comments=True)
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
    """The simple commands of a statement, as bash splits it before expanding: at the control
    operators outside quotes and substitutions (`;`, `&`, `&&`, `||`, `|`, `|&`), without their
    redirections (`> log`, `2>&1`, `&> $LOG`, `<<EOF`: the operator and its word), which are no
    arguments of the command."""
    out: list[str] = []
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
            current = []
            i += len(between)
            start_of_word = True
            continue
        current.append(ch)
        start_of_word = ch in " \t"
        i += 1
    out.append("".join(current))
    return [c for c in out if c.strip()]


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
                    inner = _skip_assignments(_skip_reserved(shlex.split(command,
                                                                         comments=True)))
                except ValueError:
                    return None
                if _launches(inner, is_script):
                    return inner
            return None
    return None


def _words(text: str, where: str, line: int) -> list[str]:
    """A statement split into words once its variables are expanded; SpecError when a quote a
    variable's value brought in is left open (bash would not reread it as a quote)."""
    try:
        return shlex.split(text, comments=True)
    except ValueError as exc:
        raise SpecError(f"{where}: line {line}: {str(exc).lower()} once the script's variables "
                        "are expanded (a quote inside a variable's value?); perfmodel cannot "
                        "split it into words") from None


def _command(text: str, state: _State, where: str, line: int, inside: bool,
             is_script: Callable[[str], bool]) -> list[str] | None:
    """One simple command: its assignments recorded (as unknown inside a block), or its words
    once expanded where it runs the training script (itself, or through a shell's -c string)."""
    raw = _skip_reserved(_split_raw(text))
    exporting = bool(raw) and (raw[0] == "export" or (raw[0] in _PREFIX and any(
        w.startswith("-") and "x" in w for w in raw[1:] if w.startswith("-"))))
    if raw[:1] == ["unset"] and not inside:  # the variables it names are gone
        for name in (w for w in raw[1:] if not w.startswith("-")):
            state.scalars.pop(name, None)
            state.arrays.pop(name, None)
            state.exported.discard(name)
        return None
    words = _skip_prefix(raw)
    if exporting and not inside:  # `export A B=1`: each name exported
        state.exported.update(w.split("=", 1)[0].split("+")[0] for w in words
                              if not w.startswith("-"))
        if words and all(not _ASSIGN.match(w) for w in words):
            return None  # names only: no assignment, no command
    assigns = []
    while words and _ASSIGN.match(words[0]):
        assigns.append(_ASSIGN.match(words[0]))
        words = words[1:]
    if assigns and not words:  # assignments alone (an environment prefix otherwise)
        for match in assigns:
            name, plus, value = match.groups()  # type: ignore[union-attr]
            if inside:
                state.unknown[name] = f"set inside an if/for/while/case block (line {line})"
                continue
            value = expand(value, state, line, quoted=False)
            state.scalars[name] = (state.scalars.get(name, "") if plus else "") + value
            state.arrays.pop(name, None)
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


def launch_command(text: str, where: str, is_script: Callable[[str], bool], *,
                   defaults: bool = True) -> Launch | None:
    """The command of the script that runs a word `is_script` accepts (e.g. pretrain_gpt.py),
    with the script's variables expanded; None when no statement runs one. SpecError when more
    than one does, or the one that does is inside a condition or loop. defaults False: a
    variable the script does not set expands to a marker whatever default its reference gives
    (`${SLURM_NNODES:-1}`: DEFAULTED), so that Launch.reason tells the words that hold only such
    a default, which the environment may override."""
    state = _State(defaults=defaults)
    depth, found = 0, []
    for line, statement in _statements(text):
        try:
            raw_words = _split_raw(statement)
            commands = _commands(statement)
            for command in commands:
                _split_raw(command)
        except ValueError as exc:  # a quote a substitution or an operator left open
            raise SpecError(f"{where}: line {line}: {str(exc).lower()} in a command of the "
                            "statement; perfmodel cannot split it into words") from None
        opened = sum(w.rstrip(";") in _OPEN for w in raw_words) + sum(
            w.endswith("()") and "=" not in w for w in raw_words)
        closed = sum(w.lstrip(";").rstrip(";") in _CLOSE for w in raw_words)
        inside = depth > 0 or opened > 0
        array = _ARRAY.match(statement)
        if array:
            name, plus, body = array.groups()
            if inside:
                state.unknown[name] = f"set inside an if/for/while/case block (line {line})"
            else:
                items = _words(expand(body, state, line), where, line)
                state.arrays[name] = (state.arrays.get(name, []) if plus else []) + items
                state.scalars.pop(name, None)
        else:
            for command in commands:
                launched = _command(command, state, where, line, inside, is_script)
                if launched is not None:
                    found.append((line, inside, launched))
        depth = max(0, depth + opened - closed)
    if not found:
        return None
    if len(found) > 1:
        lines = ", ".join(str(f[0]) for f in found)
        raise SpecError(f"{where}: more than one command runs the training script (lines "
                        f"{lines}); perfmodel reads one launch: keep one")
    line, inside, words = found[0]
    if inside:
        raise SpecError(f"{where}: the training script runs inside an if/for/while/case block "
                        f"(line {line}); perfmodel cannot tell whether that branch runs")
    at = next(i for i, w in enumerate(words) if is_script(w))
    return Launch(launcher=words[:at], script=words[at], args=words[at + 1:], line=line,
                  unresolved=dict(state.marks), notes=list(state.notes),
                  variables=dict(state.scalars), exported=set(state.exported))


def argument_words(text: str, where: str) -> Launch:
    """A plain file of arguments (no launch command): its words, comments dropped; a `$` in it
    is a reference perfmodel cannot resolve (the file sets no variables)."""
    state = _State()
    try:
        words = shlex.split(expand(re.sub(r"\\\n", " ", text), state, 1), comments=True)
    except ValueError as exc:
        raise SpecError(f"{where}: cannot split into arguments: {exc}") from None
    return Launch(launcher=[], script="", args=words, line=1, unresolved=dict(state.marks),
                  notes=list(state.notes))
