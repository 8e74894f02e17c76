"""Reads the dumps of sim/bench/callgrind-calls.sh: instructions per call of the AllocSvr and the
echo for each case, and the functions that make the difference (exclusive counts, generic
parameters dropped so that one function's instances add up)."""
import argparse
import collections
import re
import sys


def parse(path):
    """(dump name, {function: exclusive instructions}) of one callgrind dump."""
    names, cost, fn, trigger, skip = {}, collections.Counter(), None, None, False
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if skip:  # the inclusive cost of a call, counted in the callee
                skip = False
                continue
            if line.startswith("desc: Trigger:"):
                trigger = line.split()[-1]
                continue
            m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3)
                if m.group(1) == "fn":
                    fn = names.get(m.group(2), m.group(2))
                continue
            if line.startswith("calls="):
                skip = True
                continue
            if fn is not None and line[:1] and (line[:1].isdigit() or line[:1] in "+-*"):
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    cost[fn] += int(parts[1])
    return trigger, cost


def short(name):
    for _ in range(6):
        name = re.sub(r"<[^<>]*>", "", name)
    return name[:100]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, required=True)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--one", help="print one dump of this name alone: its total and top functions")
    ap.add_argument("dumps", nargs="+")
    a = ap.parse_args()
    by_name = {}
    for path in a.dumps:
        trigger, cost = parse(path)
        if trigger and "-" in trigger:
            agg = collections.Counter()
            for k, v in cost.items():
                agg[short(k)] += v
            by_name[trigger] = agg
    if a.one:
        one = by_name.get(a.one)
        if not one:
            sys.exit(f"callgrind_calls: no dump named {a.one}")
        print(f"{a.one}: {sum(one.values()) / a.calls:.0f} instructions per call ({a.calls} calls)")
        for k, v in one.most_common(a.top):
            print(f"  {v / a.calls:8.0f}  {k}")
        return
    cases = sorted({n.split("-", 1)[1] for n in by_name}, key=["next-ids", "unary", "batch100", "keys", "resp16"].index)
    if not cases:
        sys.exit("callgrind_calls: no dumps named SERVER-CASE")
    print(f"instructions per call ({a.calls} calls per case and server, one caller;"
          " resp16: a pipeline of 16 INCRs, and the echo is redis-server)")
    print(f"{'case':10} {'echo':>9} {'AllocSvr':>9} {'ratio':>6}")
    for case in cases:
        e, s = by_name.get(f"echo-{case}"), by_name.get(f"alloc-{case}")
        if e and s:
            te, ts = sum(e.values()) / a.calls, sum(s.values()) / a.calls
            print(f"{case:10} {te:9.0f} {ts:9.0f} {ts / te:6.3f}")
    for case in cases:
        e, s = by_name.get(f"echo-{case}"), by_name.get(f"alloc-{case}")
        if not (e and s):
            continue
        print(f"\n{case}: the AllocSvr's largest differences from the echo, instructions per call")
        keys = sorted(set(e) | set(s), key=lambda k: -(s[k] - e[k]))
        for k in keys[: a.top]:
            print(f"  {(s[k] - e[k]) / a.calls:+8.0f}  {k}")
        # Inlining differs between the two binaries: the echo's side of a difference above may
        # sit under another name, listed here.
        print("  ... and where the echo spends more:")
        for k in keys[-5:][::-1]:
            print(f"  {(s[k] - e[k]) / a.calls:+8.0f}  {k}")


if __name__ == "__main__":
    main()
