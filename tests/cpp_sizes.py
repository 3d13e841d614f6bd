"""A function-length counter for C++ and CUDA sources, for the size rules of
tests/project/test_architecture.py.

Not a parser: comments, string and character literals and preprocessor lines are blanked, then
braces are matched. A brace block at namespace or class level whose head reads as a function
(parameters, then at most qualifiers, a trailing return type or a constructor's initializer list)
is a function; class, struct, union, enum, namespace and ``extern`` blocks are walked into; any
other block there (a braced initializer, a lambda assigned to a variable) is skipped whole. Blocks
inside a function (lambdas, loops) count toward it.
"""
from __future__ import annotations

import re
from typing import List, NamedTuple

CPP_SUFFIXES = (".cpp", ".cc", ".cu", ".h", ".hpp", ".cuh")
_CONTAINER = re.compile(r"\b(class|struct|union|namespace|enum|extern)\b")
_ACCESS = re.compile(r"^\s*(?:(?:public|private|protected)\s*:(?!:)\s*)+")
_AFTER_PARAMS = re.compile(r"^(?:\s|const\b|override\b|final\b|noexcept\b|mutable\b|->\s*[\w:<>,*&\s]+)*$")
_BLANKED = re.compile(
    r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.S | re.M)


class CppFunction(NamedTuple):
    """One function body: the line its head starts on, its length in lines (head to closing
    brace), and the head (shortened)."""

    line: int
    lines: int
    head: str


def _blank(text: str) -> str:
    """``text`` with comments, literals and preprocessor lines made spaces (newlines kept)."""
    return _BLANKED.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def _is_function_head(head: str) -> bool:
    h = _ACCESS.sub("", head).strip()
    if "(" not in h or _CONTAINER.search(h.split("(", 1)[0]):
        return False
    depth, close = 0, -1
    for i, ch in enumerate(h):
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
            if depth == 0 and ch == ")":
                close = i
        elif ch == "=" and depth == 0 and "operator" not in h[:i]:
            return False  # an initializer (a lambda or a braced value), not a definition
    tail = h[close + 1:]
    return _AFTER_PARAMS.match(tail) is not None or re.match(r"^\s*:[^;]*$", tail) is not None


def cpp_functions(text: str) -> List[CppFunction]:
    """Every function body in C++/CUDA source ``text``, in order of their closing braces."""
    src = _blank(text)
    found: List[CppFunction] = []
    stack: list = []  # per open brace: "container", "other", "inner" or (line, head) of a function
    start = 0  # where the current head begins
    for i, ch in enumerate(src):
        at_container_level = not stack or stack[-1] == "container"
        if ch == ";" and at_container_level:
            start = i + 1
        elif ch == "{":
            if not at_container_level:
                stack.append("inner")
                continue
            head = src[start:i]
            if _is_function_head(head):
                bare = _ACCESS.sub("", head)  # "public:" before a method is not its first line
                first = start + len(head) - len(bare.lstrip())
                stack.append((src.count("\n", 0, first) + 1, " ".join(_ACCESS.sub("", head).split())[:80]))
            else:
                stack.append("container" if _CONTAINER.search(head) else "other")
            start = i + 1
        elif ch == "}" and stack:
            top = stack.pop()
            if isinstance(top, tuple):
                found.append(CppFunction(top[0], src.count("\n", 0, i) + 1 - top[0] + 1, top[1]))
            if not stack or stack[-1] == "container":
                start = i + 1
    return found
