#!/usr/bin/env python3
"""source_rules.py — rules of the library's source that a compiler does not
check (tests/source_rules_test.sh runs it over the library's files):

  terms   library code speaks its own terms in errors (DESIGN.md "Layers"):
          no string literal of a ts_set_error(...) call in base/, comm/,
          kernels/, shard/, models/ or engine/ names a command-line flag
          (--zero, --micro-batch, ...); options are named as the library
          names them, in backquotes (`zero_stage`), and tools/flags.c maps
          them to flags.

    source_rules.py terms FILE...     one line per violation, exit 1 if any
    source_rules.py selftest          the rules catch planted violations

C comments are skipped; adjacent literals of one call are read together.
"""

import re
import sys

FLAG = re.compile(r"(?:^|[\s(`'\"=,;:])--[a-z][a-z0-9-]*")
LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"')


def strip_comments(text):
    """text with /* */ and // comments blanked (line numbers kept), strings intact."""
    out, i, n = [], 0, len(text)
    while i < n:
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text[i] in "\"'":
            m = LITERAL.match(text, i) if text[i] == '"' else re.compile(r"'(?:[^'\\\n]|\\.)*'").match(text, i)
            j = m.end() if m else i + 1
            out.append(text[i:j])
            i = j
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def call_spans(code, name):
    """(start, end) of each `name(` ... matching `)` in code."""
    for m in re.finditer(r"\b" + re.escape(name) + r"\s*\(", code):
        depth, i = 0, m.end() - 1
        while i < len(code):
            c = code[i]
            if c == '"':
                lm = LITERAL.match(code, i)
                i = lm.end() if lm else i + 1
                continue
            if c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    yield m.start(), i + 1
                    break
            i += 1


def terms(path, text):
    """Violations of the terms rule in one file: (line, message)."""
    code = strip_comments(text)
    found = []
    for start, end in call_spans(code, "ts_set_error"):
        words = "".join(m.group(0)[1:-1] for m in LITERAL.finditer(code, start, end))
        flag = FLAG.search(words)
        if flag:
            line = code.count("\n", 0, start) + 1
            found.append((line, f"error names the flag '{flag.group(0).strip(chr(32) + '(`=,;:')}':"
                                f" {words[:90]}"))
    return found


def selftest():
    bad = 'ts_status f(int z) {\n  return ts_set_error(TS_ERR_INVALID_ARGUMENT,\n' \
          '                      "zero stage %d: use " "--zero 0-3", z);\n}\n'
    good = 'ts_status f(int z) {\n  /* --zero in a comment is fine */\n' \
           '  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`zero_stage` %d: 0-3", z);\n}\n'
    got_bad, got_good = terms("bad.c", bad), terms("good.c", good)
    ok = len(got_bad) == 1 and got_bad[0][0] == 2 and "--zero" in got_bad[0][1] and not got_good
    print(f"selftest: planted flag caught at line {got_bad[0][0] if got_bad else '-'}, "
          f"clean file {'clean' if not got_good else 'flagged'}: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


def main(argv):
    if len(argv) >= 2 and argv[1] == "selftest":
        return selftest()
    if len(argv) < 3 or argv[1] != "terms":
        print("usage: source_rules.py terms FILE... | selftest", file=sys.stderr)
        return 2
    bad = 0
    for path in argv[2:]:
        for line, msg in terms(path, open(path, encoding="utf-8").read()):
            print(f"{path}:{line}: {msg}")
            bad += 1
    print(f"terms: {len(argv) - 2} files, {bad} violation{'s' if bad != 1 else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
