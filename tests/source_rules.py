#!/usr/bin/env python3
"""source_rules.py — rules of the library's source that a compiler does not
check (tests/source_rules_test.sh runs it over the library's files):

  terms   library code speaks its own terms in errors (DESIGN.md "Layers"):
          no string literal of a ts_set_error(...) call in base/, comm/,
          kernels/, shard/, models/ or engine/ names a command-line flag
          (--zero, --micro-batch, ...); options are named as the library
          names them, in backquotes (`zero_stage`), and tools/flags.c maps
          them to flags.
  plan    engine/ does not branch on plan mode (DESIGN.md "The memory
          ledger and the plan"): the plan is a device (a ledger that hands
          out addresses without memory, a kernels context with TS_K_PLAN,
          plan groups in comm), set up once (`flags |= TS_K_PLAN`) and never
          tested; no field or flag of engine/ code says "plan" in a
          condition (e->plan, ->plan_only, `& TS_K_PLAN`).
  heap    comm/ allocates only through ts_comm_alloc / ts_comm_realloc /
          ts_comm_dealloc (comm/backend.h), so that ts_comm_allocations
          counts every allocation comm makes: no malloc, calloc, realloc
          or free outside those three (comm.c).

    source_rules.py terms FILE...     one line per violation, exit 1 if any
    source_rules.py plan FILE...      the same for the plan rule (engine/ files)
    source_rules.py heap FILE...      the same for the heap rule (comm/ files)
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


PLAN = [
    (re.compile(r"(?<!\|=)\s*\bTS_K_PLAN\b"), "tests the plan flag TS_K_PLAN"),
    (re.compile(r"\bplan_only\b"), "reads the ledger's plan_only"),
    (re.compile(r"(?:->|\.)plan\b"), "reads a plan field"),
]


def plan(path, text):
    """Violations of the plan rule in one engine/ file: (line, message)."""
    code = LITERAL.sub('""', strip_comments(text))
    found = []
    for rx, what in PLAN:
        for m in rx.finditer(code):
            if rx is PLAN[0][0] and re.search(r"\|=\s*$", code[:m.start() + len(m.group(0)) - len("TS_K_PLAN")]):
                continue  # `flags |= TS_K_PLAN`: the plan device set up
            found.append((code.count("\n", 0, m.start()) + 1, what))
    return found


HEAP = re.compile(r"\b(malloc|calloc|realloc|free)\s*\(")
# comm.c's counted heap: the one place the C heap is called
HEAP_HOME = re.compile(r"void \*ts_comm_alloc\(.*?\nuint64_t ts_comm_allocations\(", re.S)


def heap(path, text):
    """Violations of the heap rule in one comm/ file: (line, message)."""
    code = LITERAL.sub('""', strip_comments(text))
    home = HEAP_HOME.search(code)
    found = []
    for m in HEAP.finditer(code):
        if home and home.start() <= m.start() < home.end():
            continue
        found.append((code.count("\n", 0, m.start()) + 1,
                      f"calls {m.group(1)} (comm allocates through ts_comm_alloc: counted)"))
    return found


def selftest():
    bad = 'ts_status f(int z) {\n  return ts_set_error(TS_ERR_INVALID_ARGUMENT,\n' \
          '                      "zero stage %d: use " "--zero 0-3", z);\n}\n'
    good = 'ts_status f(int z) {\n  /* --zero in a comment is fine */\n' \
           '  return ts_set_error(TS_ERR_INVALID_ARGUMENT, "`zero_stage` %d: 0-3", z);\n}\n'
    got_bad, got_good = terms("bad.c", bad), terms("good.c", good)
    ok = len(got_bad) == 1 and got_bad[0][0] == 2 and "--zero" in got_bad[0][1] and not got_good
    print(f"selftest terms: planted flag caught at line {got_bad[0][0] if got_bad else '-'}, "
          f"clean file {'clean' if not got_good else 'flagged'}: {'ok' if ok else 'FAILED'}")
    branches = ('void f(ts_engine *e) {\n  if (e->plan) return;\n'
                '  int x = e->ctx.flags & TS_K_PLAN;\n  x = e->ledger.plan_only ? 1 : 0;\n}\n')
    setup = ('void g(ts_engine *e) {\n  /* if (e->plan) in a comment */\n'
             '  e->ctx.flags |= TS_K_PLAN;\n  ts_ledger_init_plan(&e->ledger);\n}\n')
    got_b, got_s = plan("b.c", branches), plan("s.c", setup)
    lines = sorted(l for l, _ in got_b)
    ok_plan = lines == [2, 3, 4] and not got_s
    print(f"selftest plan: branches caught at lines {lines}, the set-up "
          f"{'clean' if not got_s else 'flagged'}: {'ok' if ok_plan else 'FAILED'}")
    heap_bad = ('static void f(void) {\n  void *p = malloc(4);\n  /* free(p) in a comment */\n'
                '  free(p);\n}\n')
    heap_home = ('void *ts_comm_alloc(size_t b, int z) { return z ? calloc(1, b) : malloc(b); }\n'
                 'void ts_comm_dealloc(void *p) { free(p); }\n'
                 'uint64_t ts_comm_allocations(void) { return 0; }\n'
                 'static void g(void) { ts_comm_dealloc(ts_comm_alloc(4, 0)); }\n')
    got_h, got_home = heap("h.c", heap_bad), heap("comm.c", heap_home)
    ok_heap = sorted(l for l, _ in got_h) == [2, 4] and not got_home
    print(f"selftest heap: calls caught at lines {sorted(l for l, _ in got_h)}, the counted heap "
          f"{'clean' if not got_home else 'flagged'}: {'ok' if ok_heap else 'FAILED'}")
    return 0 if ok and ok_plan and ok_heap else 1


def main(argv):
    if len(argv) >= 2 and argv[1] == "selftest":
        return selftest()
    rules = {"terms": terms, "plan": plan, "heap": heap}
    if len(argv) < 3 or argv[1] not in rules:
        print("usage: source_rules.py terms|plan|heap FILE... | selftest", file=sys.stderr)
        return 2
    bad = 0
    for path in argv[2:]:
        for line, msg in rules[argv[1]](path, open(path, encoding="utf-8").read()):
            print(f"{path}:{line}: {msg}")
            bad += 1
    print(f"{argv[1]}: {len(argv) - 2} files, {bad} violation{'s' if bad != 1 else ''}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
