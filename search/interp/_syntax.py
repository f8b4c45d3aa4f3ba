"""The threadgroup declarations and casts of MSL text, as the translator, the lint and the lockstep analysis find
them (regular expressions over code with comments and strings set aside by the caller), and the words after which
a name is an operand."""

from __future__ import annotations

import re

_TYPE = r"(?:const\s+)?[A-Za-z_][\w:]*(?:\s*<[^;<>]*>)?"
_TG_ARRAY = re.compile(rf"\bthreadgroup\s+({_TYPE})\s+(\w+)\s*\[([^\]\n]+)\]\s*;")
_TG_SCALAR = re.compile(rf"\bthreadgroup\s+({_TYPE})\s+(\w+)\s*;")
_TG_POINTER = re.compile(rf"\bthreadgroup\s+({_TYPE})\s*\*\s*(\w+)")
_TG_ARRAY_MD = re.compile(rf"\bthreadgroup\s+({_TYPE})\s+(\w+)\s*((?:\[[^\]\n]+\]\s*){{2,3}});")
_VOLATILE_TG = re.compile(r"\bvolatile\s+threadgroup\b")
#: Casts to a threadgroup pointer: `(threadgroup float4*) shmem`, `reinterpret_cast<threadgroup half*>(p)`.
_TG_CAST = re.compile(rf"\(\s*threadgroup\s+({_TYPE})\s*\*\s*\)")
_TG_CAST_NAMED = re.compile(rf"\b(?:reinterpret_cast|static_cast)\s*<\s*threadgroup\s+({_TYPE})\s*\*\s*>")
#: A pointer to rows of a multi-dimensional threadgroup array: `threadgroup float (*rows)[33]` (a parameter of a helper
#: that takes `buf` of `threadgroup float buf[8][33]`).
_TG_ROW_POINTER = re.compile(rf"\bthreadgroup\s+({_TYPE})\s*\(\s*\*\s*(\w+)\s*\)\s*((?:\[[^\]\n]+\]\s*){{1,2}})")
#: Words after which a name is an operand, not a declared variable (`return x`, `sizeof p`).
_EXPRESSION_WORDS = frozenset({"return", "else", "do", "case", "sizeof", "throw", "co_return"})
